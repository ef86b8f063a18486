"""Read SuperGLUE / FewGLUE jsonl files into flat, validated example dicts: the one data reader.

Every problem is one line naming ``FILE:LINE`` (or the file, when it cannot be read at all):
bytes that are not UTF-8, a line that is not JSON, a row that is not an object, a text field that
is a list or an object, a label outside the task's labels, and (when labels are required) the
first unlabelled example.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from anchorlens.atomic import os_errors
from anchorlens.errors import DataError, UsageError
from anchorlens.tasks.registry import Row, RowError, Task, get_task

BOM = b"\xef\xbb\xbf"


def _reject_constant(name: str) -> float:
    """``json.loads`` hook: NaN / Infinity are not JSON."""
    raise ValueError(f"{name} is not JSON")


def _decode(raw: bytes, where: str) -> str:
    """One line's bytes as text; DataError with the offending byte and its (1-based, byte) column."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        bad = raw[err.start]
        raise DataError(
            f"{where}: not UTF-8 (byte 0x{bad:02x} at column {err.start + 1}); re-encode the file as UTF-8"
        ) from None


def _parse(text: str, where: str) -> dict[str, Any]:
    """One JSON object; DataError for invalid JSON, NaN/Infinity, or a non-object."""
    try:
        row = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: not valid JSON ({err.msg}, column {err.colno})") from None
    except ValueError as err:
        raise DataError(f"{where}: not valid JSON ({err})") from None
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    return row


def read_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw bytes) of each non-blank line; OS errors become one line naming ``path``."""
    with os_errors(path, "cannot read data file"):
        with path.open("rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                if lineno == 1 and raw.startswith(BOM):
                    raw = raw[len(BOM) :]
                if raw.strip():
                    yield lineno, raw


def _type_name(value: Any) -> str:
    """JSON's name for a value's type."""
    return {dict: "an object", list: "a list", bool: "a boolean"}.get(type(value), type(value).__name__)


def check_example(example: Row, task: Task, where: str) -> Row:
    """Validate the text fields and the label of one flat example; add ``label`` and ``labelled``."""
    for field in task.fields:
        value = example.get(field)
        if value is None and any(key.startswith(f"{field}.") for key in example):  # an object, flattened
            raise DataError(f"{where}: field {field!r} must be a string or number, got an object")
        if value is None:
            raise DataError(f"{where}: missing field {field!r} for task {task.name}")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise DataError(f"{where}: field {field!r} must be a string or number, got {_type_name(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise DataError(f"{where}: field {field!r} must be a finite number, got {value}")
    label = example.get("label")
    example["label"] = label
    if label is not None:
        try:
            task.label_index(label)
        except ValueError:
            raise DataError(f"{where}: label {label!r} is not one of {task.labels!r} for task {task.name}") from None
    example["labelled"] = label is not None
    return example


def load_examples(
    path: str | Path, task: str | Task, limit: int | None = None, *, require_labels: bool = False
) -> list[Row]:
    """Load up to ``limit`` examples of ``task`` from a jsonl file.

    Each example is the row flattened (dotted keys for nested objects; MultiRC expanded to one
    example per answer) plus ``idx`` (its 0-based position when the row has none), ``label``
    (None for unlabelled rows) and ``labelled`` (bool). Raises DataError, one line with
    ``file:line:``; ``require_labels`` makes a missing label an error too (evaluation and
    training need labels; capture does not).
    """
    task = get_task(task)
    path = Path(path)
    if limit is not None and limit < 1:
        raise UsageError(f"the number of examples must be at least 1, got {limit}")
    examples: list[Row] = []
    for lineno, raw in read_lines(path):
        where = f"{path}:{lineno}"
        row = _parse(_decode(raw, where), where)
        try:
            flat = task.expand(row)
        except RowError as err:
            raise DataError(f"{where}: {err}") from None
        for example in flat:
            example.setdefault("idx", len(examples))
            check_example(example, task, where)
            if require_labels and not example["labelled"]:
                raise DataError(
                    f"{where}: missing field 'label' for task {task.name}; "
                    "evaluation and training need labelled examples (use a labelled split)"
                )
            examples.append(example)
            if limit is not None and len(examples) >= limit:
                return examples
    if not examples:
        raise DataError(f"{path}: no examples (the file is empty)")
    return examples


def count_unlabelled(examples: list[dict[str, Any]]) -> int:
    """Number of examples without a label."""
    return sum(1 for ex in examples if not ex.get("labelled", ex.get("label") is not None))
