"""Resolve a task and its examples from the user's options (bundled examples or a jsonl file)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from anchorlens.errors import UsageError
from anchorlens.tasks import Task, bundled_examples, get_task, load_examples


@dataclass(frozen=True)
class Inputs:
    """The task, its examples and where they came from."""

    task: Task
    examples: list[dict]
    source: str


def resolve_inputs(task: str = "rte", data: str | Path | None = None, n: int | None = None) -> Inputs:
    """Task + up to ``n`` examples from ``data`` (a SuperGLUE jsonl) or the bundled set."""
    try:
        spec = get_task(task)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if n is not None and n < 1:
        raise UsageError(f"--n must be at least 1, got {n}")
    try:
        if data is None:
            examples = bundled_examples(spec, limit=n)
            source = f"bundled:{spec.name}"
        else:
            examples = load_examples(Path(data), spec, limit=n)
            source = str(data)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if not examples:
        raise UsageError(f"no examples for task {spec.name} in {data or 'the bundled set'}")
    return Inputs(spec, examples, source)
