"""JSON Lines diagnostics and the validation of one example: the precise ``FILE:LINE`` of a problem.

Files are read by HF ``datasets`` (:mod:`anchorlens.tasks.sources`); when its reader fails on a jsonl file,
:func:`scan_json_lines` reads the file line by line to say exactly where and why: bytes that are not UTF-8,
a line that is not JSON, a row that is not an object, a field whose type changes between rows.
:func:`check_example` validates one example's text fields and label, for the rows that are checked one by one
(nested rows expanded into examples).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from anchorlens.atomic import os_errors
from anchorlens.errors import DataError
from anchorlens.tasks.explode import Row
from anchorlens.tasks.task import Task

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


MOST_NESTING = 500  # JSON nested deeper than this is refused before parsing (the C parser recurses per level)


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[\[\]{}]")


def nesting_depth(text: str) -> int:
    """How deeply ``text``'s arrays and objects nest (brackets inside strings not counted); a count alone when the
    text holds few brackets, else one pass of regular expressions."""
    opening = text.count("[") + text.count("{")
    if opening <= MOST_NESTING:
        return opening
    steps = [1 if b in "[{" else -1 for b in _BRACKETS.findall(_STRING.sub("", text))]
    return max(itertools.accumulate(steps), default=0)


def check_nesting(path: Path) -> None:
    """DataError naming ``FILE:LINE`` when a JSON Lines row (or a JSON array file) nests deeper than
    :data:`MOST_NESTING`: the readers recurse once per level in C and would crash the process."""
    first = next(read_lines(path), None)
    if first is not None and first[1].lstrip().startswith(b"["):
        with os_errors(path, "cannot read data file"):
            text = path.read_bytes().decode("utf-8", errors="replace")
        if nesting_depth(text) > MOST_NESTING + 1:  # the array itself is one level
            raise DataError(f"{path}: nested deeper than {MOST_NESTING} levels; flatten the rows")
        return
    for lineno, raw in read_lines(path):
        if raw.count(b"[") + raw.count(b"{") > MOST_NESTING and (
            nesting_depth(raw.decode("utf-8", errors="replace")) > MOST_NESTING
        ):
            raise DataError(f"{path}:{lineno}: nested deeper than {MOST_NESTING} levels; flatten the row")


def _parse(text: str, where: str) -> dict[str, Any]:
    """One JSON object; DataError for invalid JSON, NaN/Infinity, nesting deeper than :data:`MOST_NESTING`, or a
    non-object."""
    if nesting_depth(text) > MOST_NESTING:
        raise DataError(f"{where}: nested deeper than {MOST_NESTING} levels; flatten the row")
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
    """Validate the text fields and the label of one flat example; set ``label`` (from the task's label field) and
    ``labelled``."""
    for field in task.fields:
        value = example.get(field)
        if value is None and any(key.startswith(f"{field}.") for key in example):  # an object, flattened
            if not task.template.needs_scalars:
                continue
            raise DataError(f"{where}: field {field!r} must be a string or number, got an object")
        if value is None:
            raise DataError(f"{where}: missing field {field!r} for task {task.name}; fill it in or drop the row")
        if not task.template.needs_scalars:
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise DataError(f"{where}: field {field!r} must be a string or number, got {_type_name(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise DataError(f"{where}: field {field!r} must be a finite number, got {value}")
    try:
        label = task.example_label(example)
    except ValueError as err:
        raise DataError(f"{where}: {err}") from None
    example["label"] = label
    if label is not None and task.has_labels:
        try:
            task.label_index(label)
        except ValueError:
            raise DataError(f"{where}: {task.unknown_label(label)}") from None
    example["labelled"] = label is not None and task.has_labels
    return example


def _json_type(value: Any) -> str:
    """The JSON type of a value, numbers as one type."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", dict: "object", list: "list", type(None): "null"}.get(type(value), type(value).__name__)


def scan_json_lines(path: Path) -> str | None:
    """The first problem of a JSON Lines (or one JSON array) file as one line ``FILE:LINE: ...``; None when none
    is found.

    A file whose first non-blank byte is ``[`` is one JSON document (an array of objects).
    """
    first = next(read_lines(path), None)
    if first is not None and first[1].lstrip().startswith(b"["):
        with os_errors(path, "cannot read data file"):
            text = _decode(path.read_bytes().removeprefix(BOM), str(path))
        if nesting_depth(text) > MOST_NESTING + 1:  # the array itself is one level
            return f"{path}: nested deeper than {MOST_NESTING} levels; flatten the rows"
        try:
            rows = json.loads(text, parse_constant=_reject_constant)
        except (json.JSONDecodeError, ValueError) as err:
            return f"{path}: not valid JSON ({err})"
        bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
        return None if bad is None else f"{path}: element {bad} of the array is not a JSON object"
    types: dict[str, tuple[str, int]] = {}
    try:
        for lineno, raw in read_lines(path):
            where = f"{path}:{lineno}"
            row = _parse(_decode(raw, where), where)
            for key, value in row.items():
                kind = _json_type(value)
                if kind == "null":
                    continue
                seen = types.setdefault(key, (kind, lineno))
                if seen[0] != kind:
                    return (
                        f"{where}: field {key!r} is {'an' if kind[0] in 'aeiou' else 'a'} {kind} here but "
                        f"{'an' if seen[0][0] in 'aeiou' else 'a'} {seen[0]} on line {seen[1]}; "
                        "give a field one type in every row"
                    )
    except DataError as err:
        return str(err)
    return None


def line_of_row(path: Path, row: int) -> int:
    """The 1-based line of the ``row``-th (0-based) non-blank line of a text file."""
    for i, (lineno, _raw) in enumerate(read_lines(path)):
        if i == row:
            return lineno
    return row + 1
