"""Read SuperGLUE / FewGLUE jsonl files into flat, validated example dicts."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from anchorlens.errors import UsageError
from anchorlens.tasks.registry import Row, RowError, Task, get_task


class DataError(UsageError):
    """A data file cannot be used; the message is one line naming the file (and line)."""


def _check(example: Row, task: Task, where: str) -> Row:
    """Validate required fields and the label of one flat example; add ``labelled``."""
    for field in task.fields:
        if example.get(field) is None:
            raise DataError(f"{where}: missing field {field!r} for task {task.name}")
    label = example.get("label")
    example["label"] = label
    if label is not None:
        try:
            task.label_index(label)
        except ValueError:
            raise DataError(
                f"{where}: label {label!r} is not one of {task.labels!r} for task {task.name}"
            ) from None
    example["labelled"] = label is not None
    return example


def load_examples(
    path: str | Path, task: str | Task, limit: int | None = None, *, require_labels: bool = False
) -> list[Row]:
    """Load up to ``limit`` examples of ``task`` from a jsonl file.

    Each example is the row flattened (dotted keys for nested objects; MultiRC expanded to one
    example per answer) plus ``idx`` (its 0-based position when the row has none), ``label``
    (None for unlabelled rows) and ``labelled`` (bool). Raises DataError, one line with
    ``file:line:``; ``require_labels`` makes a missing label an error too.
    """
    task = get_task(task)
    path = Path(path)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be positive, got {limit}")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    examples: list[Row] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: not valid JSON ({err.msg}, column {err.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
            try:
                flat = task.expand(row)
            except RowError as err:
                raise DataError(f"{where}: {err}") from None
            for example in flat:
                example.setdefault("idx", len(examples))
                _check(example, task, where)
                if require_labels and not example["labelled"]:
                    raise DataError(f"{where}: missing field 'label' for task {task.name}")
                examples.append(example)
                if limit is not None and len(examples) >= limit:
                    return examples
    if not examples:
        raise DataError(f"{path}: no examples")
    return examples


def count_unlabelled(examples: list[dict[str, Any]]) -> int:
    """Number of examples without a label."""
    return sum(1 for ex in examples if not ex.get("labelled", ex.get("label") is not None))
