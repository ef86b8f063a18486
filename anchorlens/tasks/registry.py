"""Tasks by name or by file: the built-in task files shipped in the package, a user's TOML, a harness YAML.

``get_task("rte")`` reads ``anchorlens/tasks/builtin/rte.toml`` with the same code as ``get_task("my.toml")``;
``get_task("harness.yaml")`` reads an lm-evaluation-harness task (:mod:`anchorlens.tasks.harness`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from pathlib import Path

from anchorlens.errors import DataError, UnknownNameError
from anchorlens.tasks.explode import Row, RowError, expand_plain, flatten_row
from anchorlens.tasks.task import Task
from anchorlens.tasks.taskfile import load_task_file, parse_task_text

_PACKAGE = "anchorlens.tasks"
_BUILTIN = "builtin"
TASK_FILE_SUFFIXES = (".toml",)
HARNESS_SUFFIXES = (".yaml", ".yml")


@cache
def builtin_task_names() -> tuple[str, ...]:
    """Names of the task files shipped inside the package, SuperGLUE's first as the paper lists them, then SST-2."""
    folder = resources.files(_PACKAGE).joinpath(_BUILTIN)
    names = sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))
    order = ["rte", "cb", "boolq", "copa", "wic", "wsc", "multirc", "sst2"]
    return tuple(sorted(names, key=lambda n: (order.index(n) if n in order else len(order), n)))


def builtin_task_text(name: str) -> str:
    """The text of a built-in task file."""
    return resources.files(_PACKAGE).joinpath(_BUILTIN, f"{name}.toml").read_text(encoding="utf-8")


@cache
def _builtin(name: str) -> Task:
    """A built-in task, read from its shipped file once per process."""
    return parse_task_text(builtin_task_text(name), f"builtin task {name}", f"builtin:{name}")


class _BuiltinTasks(Mapping[str, Task]):
    """The built-in tasks by name, read from their files on first use."""

    def __getitem__(self, name: str) -> Task:
        if name not in builtin_task_names():
            raise KeyError(name)
        return _builtin(name)

    def __iter__(self) -> Iterator[str]:
        return iter(builtin_task_names())

    def __len__(self) -> int:
        return len(builtin_task_names())


TASKS: Mapping[str, Task] = _BuiltinTasks()


def is_task_path(name: str) -> bool:
    """Whether ``name`` names a task file (by its suffix or because it exists as a file)."""
    return name.lower().endswith(TASK_FILE_SUFFIXES + HARNESS_SUFFIXES) or ("/" in name and Path(name).exists())


def get_task(name: str | Path | Task) -> Task:
    """A task by case-insensitive built-in name, a task file path (``.toml``) or a harness YAML path (a Task passes).

    UnknownNameError (a ValueError) lists the built-in tasks; a bad file is a one-line DataError naming it.
    """
    if isinstance(name, Task):
        return name
    text = str(name).strip()
    if isinstance(name, Path) or is_task_path(text):
        path = Path(text)
        if path.is_dir():
            raise DataError(
                f"task file {path} is a directory; pass the .toml task file (or harness .yaml) inside it, or a "
                "built-in task name"
            )
        if path.exists() and not path.is_file():  # a FIFO or a device would block or never end
            raise DataError(f"task file {path} is not a regular file; pass a .toml task file or a built-in task name")
        if not path.is_file():
            raise DataError(f"task file {path} does not exist; pass a .toml task file or a built-in task name")
        if path.suffix.lower() in HARNESS_SUFFIXES:
            from anchorlens.tasks.harness import load_harness_task

            return load_harness_task(path)
        return load_task_file(path)
    key = text.lower()
    if key not in TASKS:
        raise UnknownNameError(
            f"unknown task {name!r}; known tasks: {', '.join(TASKS)} (or a task file: --task my-task.toml)"
        )
    return TASKS[key]


__all__ = [
    "TASKS",
    "Row",
    "RowError",
    "Task",
    "builtin_task_names",
    "builtin_task_text",
    "expand_plain",
    "flatten_row",
    "get_task",
    "is_task_path",
]
