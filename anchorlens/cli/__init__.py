"""The ``anchorlens`` command line: thin typer commands over the workflows and reports."""

from __future__ import annotations

import warnings

import typer

from anchorlens.cli import flow, learn, measure, reproduce, tasks  # noqa: F401  (commands register on import)
from anchorlens.cli.app import app
from anchorlens.cli.options import one_line_warning


@app.callback()
def root(ctx: typer.Context) -> None:
    """Without a command: run the demo on the embedded SmolLM2 and the bundled RTE examples."""
    warnings.showwarning = one_line_warning
    if ctx.invoked_subcommand is None:
        measure.demo()


def main() -> None:
    """Console-script entry point."""
    app(prog_name="anchorlens")


__all__ = ["app", "main"]
