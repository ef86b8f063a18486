"""``anchorlens tasks``: the built-in tasks, one task's file, or a check of the user's own task file."""

from __future__ import annotations

from typing import Annotated

import typer

from anchorlens.cli.app import app
from anchorlens.cli.options import cli_command


def _summary_line(task) -> str:
    """One line describing a task: name, kind, fields, labels, roles beyond the built-ins."""
    labels = ", ".join(f"{lbl!r}→{v!r}" for lbl, v in zip(task.labels, task.verbalizers)) or "no labels"
    roles = f"; roles: {', '.join(task.roles)}" if task.roles else ""
    return f"{task.name:<9} {task.kind:<14} fields: {', '.join(task.fields)}; {labels}{roles}"


@app.command()
@cli_command
def tasks(
    name: Annotated[
        str | None,
        typer.Argument(help="A built-in task to show its file, or a task file (.toml / harness .yaml) to check."),
    ] = None,
) -> None:
    """List the built-in tasks; with a name, print that task's file; with a path, validate it and summarize."""
    from anchorlens.tasks import TASKS, builtin_task_text, get_task, is_task_path

    if name is None:
        typer.echo("built-in tasks (anchorlens tasks NAME prints one's file; --task PATH.toml takes your own):")
        for key in TASKS:
            typer.echo("  " + _summary_line(TASKS[key]))
        return
    if not is_task_path(name) and name.strip().lower() in TASKS:
        typer.echo(builtin_task_text(name.strip().lower()), nl=False)
        return
    task = get_task(name)  # a user's file: validated, one line on any problem
    typer.echo(f"{name}: valid task file")
    typer.echo("  " + _summary_line(task))
    typer.echo(f"  template: {task.template.spec!r}")
    if task.rules:
        typer.echo("  token rules: " + "; ".join(f"{r.role} = {r.pattern.pattern!r}" for r in task.rules))
    for note in task.notes:
        typer.echo(f"  note: {note}")
