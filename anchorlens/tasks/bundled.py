"""Small project-written example sets shipped with the package (for demos and tests)."""

from __future__ import annotations

from importlib import resources

from anchorlens.errors import UsageError
from anchorlens.tasks.examples import Examples, load_examples
from anchorlens.tasks.registry import get_task
from anchorlens.tasks.task import Task

_PACKAGE = "anchorlens.tasks"
_FOLDER = "examples"


def bundled_tasks() -> tuple[str, ...]:
    """Names of the tasks that have a bundled example file, sorted."""
    folder = resources.files(_PACKAGE).joinpath(_FOLDER)
    return tuple(sorted(p.name[: -len(".jsonl")] for p in folder.iterdir() if p.name.endswith(".jsonl")))


def bundled_examples(task: str | Task, limit: int | None = None) -> Examples:
    """The bundled labelled examples of ``task``; UsageError (a ValueError) when the task has none."""
    task = get_task(task)
    if task.name not in bundled_tasks():
        raise UsageError(
            f"no bundled examples for task {task.name}; pass --data FILE (bundled: {', '.join(bundled_tasks())})"
        )
    source = resources.files(_PACKAGE).joinpath(_FOLDER, f"{task.name}.jsonl")
    with resources.as_file(source) as path:
        return load_examples(path, task, limit=limit, require_labels=True)
