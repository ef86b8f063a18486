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


def resolve_inputs(
    task: str | Task = "rte", data: str | Path | None = None, n: int | None = None, *, need_labels: bool = False
) -> Inputs:
    """Task + up to ``n`` examples from ``data`` (a SuperGLUE jsonl) or the bundled set.

    ``need_labels``: every example must be labelled (evaluate, train); the error names FILE:LINE
    of the first unlabelled one. Every problem is a one-line UsageError.
    """
    spec = get_task(task)
    if n is not None and n < 1:
        raise UsageError(f"--n must be at least 1, got {n}")
    if data is None:
        examples = bundled_examples(spec, limit=n)
        source = f"bundled:{spec.name}"
    else:
        examples = load_examples(Path(data), spec, limit=n, require_labels=need_labels)
        source = str(data)
    return Inputs(spec, examples, source)
