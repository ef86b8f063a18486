"""The typer application object; commands register themselves on it."""

from __future__ import annotations

import typer

from anchorlens.cli.oneline import OneLineGroup

app = typer.Typer(
    name="anchorlens",
    cls=OneLineGroup,  # typer's own usage errors (bad values, unknown options/commands) as one line, exit 2
    add_completion=False,
    no_args_is_help=False,
    invoke_without_command=True,
    help="Measure attention anchors (instance tokens, CaPT capsules, soft prompts) in language models.",
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: flags shown as flags (--force, not --force <bool>), no boxes
)

sweep_app = typer.Typer(
    rich_markup_mode=None,
    help="Reproduce the paper's sweeps: instance tokens (count x position) and prompt length; knockouts by layer.",
)
app.add_typer(sweep_app, name="sweep")
