"""``anchorlens tasks``: the built-in tasks, one task's file, or a check of the user's own task file."""

from __future__ import annotations

from typing import Annotated

import typer

from anchorlens.cli.app import app
from anchorlens.cli.options import DataOptions, FieldMap_, cli_command
from anchorlens.errors import UsageError


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
    data: Annotated[
        str | None,
        typer.Option("--data", help="Also read this data with the task and show its first example with its roles."),
    ] = None,
    field_map: FieldMap_ = None,
) -> None:
    """List the built-in tasks; with a name, print that task's file; with a path, validate it and summarize."""
    from anchorlens.tasks import TASKS, builtin_task_text, get_task, is_task_path

    if data is not None:
        DataOptions(data=data).check()  # a missing file is named before anything else
        if name is None:
            raise UsageError("--data needs a task: anchorlens tasks TASK --data FILE")
        _preview(get_task(name), data, field_map)
        return
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


def _preview(task, data: str, field_map: list[str] | None) -> None:
    """Read ``data`` with ``task`` (every used row checked) and print the first example as the model reads it."""
    from anchorlens.tasks import load_examples

    examples = load_examples(data, task, field_map=field_map)
    typer.echo(f"{data}: {len(examples):,} examples of task {task.name}")
    rendered = task.template.render(examples[0])
    typer.echo("first example, span by span (role: text):")
    for span in rendered.spans:
        typer.echo(f"  {span.role:<11} {rendered.text[span.start : span.end]!r}")
