"""A task's examples read from ``--data``: validated up front, held as a memory-mapped Arrow table, read row by row.

:func:`load_examples` opens the source (:mod:`anchorlens.tasks.sources`), renames columns (``--field-map
text=review_body``) and checks the rows it will use, column by column with Arrow (a missing column, a missing
value, a list or an object where text belongs, a non-finite number, a label the task does not know, an
unlabelled row where labels are needed): one line naming the file and the line (jsonl, txt) or row (csv,
parquet, hub) and the fix. The result is an :class:`Examples` sequence whose items are built when read, so
memory does not grow with the number of rows. Rows of tasks that expand nested rows (MultiRC) are checked and
kept one by one; such files are small.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from anchorlens.errors import DataError, UsageError
from anchorlens.tasks.explode import Row, RowError, expand_plain, flatten_row
from anchorlens.tasks.jsonl import check_example, line_of_row
from anchorlens.tasks.registry import get_task
from anchorlens.tasks.sources import DataSource, open_source, parse_source
from anchorlens.tasks.task import TEXT, Task

TEXT_FIELD = "text"


def parse_field_map(spec: str | Sequence[str] | Mapping[str, str] | None) -> dict[str, str]:
    """``"text=review_body,label=stars"`` (or a list of such, or a mapping) -> {task field: data column}."""
    if spec is None:
        return {}
    if isinstance(spec, Mapping):
        pairs = list(spec.items())
    else:
        items = [spec] if isinstance(spec, str) else list(spec)
        pairs = []
        for item in items:
            for part in str(item).split(","):
                if not part.strip():
                    continue
                field, eq, column = (p.strip() for p in part.partition("="))
                if not eq or not field or not column:
                    raise UsageError(f"--field-map {part.strip()!r}: write FIELD=COLUMN, e.g. text=review_body")
                pairs.append((field, column))
    out: dict[str, str] = {}
    for field, column in pairs:
        if field in out and out[field] != column:
            raise UsageError(f"--field-map maps {field!r} twice ({out[field]!r} and {column!r})")
        out[str(field)] = str(column)
    return out


@dataclass(frozen=True)
class _Where:
    """How to name a row in errors: ``FILE:LINE`` for line-based files, else ``SOURCE: row N``."""

    source: DataSource

    def __call__(self, row: int) -> str:
        if self.source.line_numbered and self.source.path is not None:
            if self.source.format == "text":
                return f"{self.source.path}:{row + 1}"
            return f"{self.source.path}:{line_of_row(self.source.path, row)}"
        where = str(self.source.path) if self.source.path is not None else self.source.spec
        return f"{where}: row {row + 1:,}"


class Examples(Sequence[Row]):
    """A task's validated examples; items (flat dicts with ``idx``, ``label`` and ``labelled``) are built on read.

    ``rows`` holds them when they were expanded one by one (nested rows, in-memory sets); otherwise ``table`` (a
    memory-mapped Arrow table, struct columns flattened and columns renamed to the task's fields) holds them:
    example i is table row ``positions[i]`` (or row i when ``positions`` is None).
    """

    def __init__(
        self,
        task: Task,
        *,
        rows: list[Row] | None = None,
        table: Any = None,
        count: int = 0,
        positions: Any = None,
        facts: Mapping[str, Any] | None = None,
        digest_parts: Sequence[str] = (),
    ) -> None:
        self.task = task
        self._rows = rows
        self._table = table
        self._positions = positions
        self._count = len(rows) if rows is not None else count
        self.facts = dict(facts or {})
        self._digest_parts = tuple(digest_parts)
        self._digest: str | None = None

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, i: int) -> Row: ...

    @overload
    def __getitem__(self, i: slice) -> list[Row]: ...

    def __getitem__(self, i: int | slice) -> Row | list[Row]:
        """One example (a fresh dict), or a list of them for a slice."""
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._count))]
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError(i)
        if self._rows is not None:
            return dict(self._rows[i])
        at = i if self._positions is None else int(self._positions[i])
        row = self._table.slice(at, 1).to_pylist()[0]
        return _finish(row, self.task, at)

    def __iter__(self) -> Iterator[Row]:
        if self._rows is not None:
            yield from (dict(r) for r in self._rows)
            return
        if self._positions is not None:
            yield from (self[i] for i in range(self._count))
            return
        for start in range(0, self._count, 1024):
            chunk = self._table.slice(start, min(1024, self._count - start)).to_pylist()
            for k, row in enumerate(chunk):
                yield _finish(row, self.task, start + k)

    def __eq__(self, other: object) -> bool:
        """Equal to another sequence of the same examples (a list of dicts)."""
        if isinstance(other, (Examples, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def digest(self) -> str:
        """SHA-256 (first 16 hex) of the examples: of the source's content and the selection for tables."""
        if self._digest is None:
            if self._rows is not None:
                blob = json.dumps(self._rows, sort_keys=True, default=str).encode()
            else:
                blob = json.dumps([*self._digest_parts, self._count], default=str).encode()
            self._digest = hashlib.sha256(blob).hexdigest()[:16]
        return self._digest

    def __repr__(self) -> str:
        return f"Examples(task={self.task.name!r}, n={self._count}, source={self.facts.get('data')!r})"


def _finish(row: dict[str, Any], task: Task, index: int) -> Row:
    """A checked table row as an example: ``idx`` (its position when absent), ``label`` and ``labelled``."""
    row.setdefault("idx", index)
    if row.get("idx") is None:
        row["idx"] = index
    label = row.get(task.label_field)
    row["label"] = label
    row["labelled"] = label is not None and task.has_labels
    return row


def _arrow(dataset: Any) -> Any:
    """The memory-mapped Arrow table behind a ``datasets.Dataset`` (its rows in order)."""
    if getattr(dataset, "_indices", None) is not None:
        dataset = dataset.flatten_indices()
    return dataset.data.table


def _check_mapping(field_map: Mapping[str, str], columns: Sequence[str], where: str) -> None:
    """``--field-map`` must name existing columns and must not rename one onto another."""
    for field, column in field_map.items():
        parent = column.split(".")[0]
        if column not in columns and "." in column and parent in columns:
            raise DataError(
                f"{where}: --field-map {field}={column}: --field-map renames whole columns, not fields inside "
                f"{parent!r}; write {{{column}}} in the task's template instead"
            )
        if column not in columns:
            raise DataError(
                f"{where}: --field-map {field}={column}: no column {column!r}; columns: {', '.join(columns)}"
            )
    fields_of: dict[str, list[str]] = {}
    for field, column in field_map.items():
        fields_of.setdefault(column, []).append(field)
    shared = [(column, fields) for column, fields in fields_of.items() if len(fields) > 1]
    if shared:
        column, fields = shared[0]
        raise DataError(
            f"{where}: --field-map maps {' and '.join(fields)} to the one column {column!r}; map each field to its "
            "own column"
        )
    renamed = {column: field for field, column in field_map.items()}
    clash = [f for f in renamed.values() if f in columns and f not in renamed]
    if clash:
        raise DataError(f"{where}: --field-map renames a column to {clash[0]!r}, which the data already has")


def _flat_arrow(table: Any) -> Any:
    """The Arrow table with struct columns flattened to dotted names (zero-copy)."""
    import pyarrow as pa

    while any(pa.types.is_struct(f.type) for f in table.schema):
        table = table.flatten()
    return table


def _type_word(arrow_type: Any) -> str:
    """What a user calls an Arrow type in an error."""
    import pyarrow as pa

    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type):
        return "a list"
    if pa.types.is_struct(arrow_type) or pa.types.is_map(arrow_type):
        return "an object"
    if pa.types.is_boolean(arrow_type):
        return "a boolean"
    return str(arrow_type)


def _first(mask: Any) -> int | None:
    """Index of the first True of a boolean Arrow array (None when there is none)."""
    import pyarrow.compute as pc

    hits = pc.indices_nonzero(mask.fill_null(False) if hasattr(mask, "fill_null") else mask)
    return int(hits[0].as_py()) if len(hits) else None


def _check_table(data: Any, task: Task, where: _Where, require_labels: bool, columns: Sequence[str]) -> None:
    """Column checks of the rows to use (``data``: flat Arrow table); DataError names the first bad row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = set(data.column_names)
    fields = (TEXT_FIELD,) if task.kind == TEXT else task.fields
    for field in fields:
        if field not in names:
            nested = [n for n in names if n.startswith(f"{field}.")]
            if nested:
                raise DataError(f"{where(0)}: field {field!r} must be a string or number, got an object")
            have = ", ".join(columns)
            raise DataError(
                f"{where(0)}: missing field {field!r} for task {task.name} (the data has columns {have}; "
                f"rename one with --field-map {field}=COLUMN)"
            )
        col = data.column(field)
        kind = col.type
        if not task.template.needs_scalars:
            pass
        elif not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind)):
            if pa.types.is_floating(kind):
                bad = _first(pc.invert(pc.is_finite(col)))
                if bad is not None and col[bad].is_valid:
                    value = col[bad].as_py()
                    if where.source.format == "json":  # the reader took a NaN / Infinity literal
                        word = "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
                        raise DataError(f"{where(bad)}: not valid JSON ({word} is not JSON)")
                    raise DataError(f"{where(bad)}: field {field!r} must be a finite number, got {value}")
            elif pa.types.is_null(kind):
                raise DataError(f"{where(0)}: missing field {field!r} for task {task.name}")
            else:
                first = _first(col.is_valid())
                raise DataError(
                    f"{where(first or 0)}: field {field!r} must be a string or number, got {_type_word(kind)}"
                )
        missing = _first(col.is_null())
        if missing is not None:
            raise DataError(
                f"{where(missing)}: missing field {field!r} for task {task.name}; fill it in or drop the row"
            )
    if not task.has_labels:
        return
    label = task.label_field
    if label not in names:
        if require_labels:
            raise DataError(
                f"{where(0)}: missing field {label!r} for task {task.name}; "
                "evaluation and training need labelled examples (use a labelled split)"
            )
        return
    col = data.column(label)
    if isinstance(col.type, (pa.ListType, pa.StructType)):
        raise DataError(f"{where(0)}: label must be a string, number or boolean, got {_type_word(col.type)}")
    for value in pc.unique(col).to_pylist():
        if value is None:
            continue
        try:
            task.label_index(value)
        except ValueError:
            row = _first(pc.equal(col, pa.scalar(value, type=col.type)))
            raise DataError(f"{where(row or 0)}: {task.unknown_label(value)}") from None
    if require_labels:
        missing = _first(col.is_null())
        if missing is not None:
            raise DataError(
                f"{where(missing)}: missing field {label!r} for task {task.name}; "
                "evaluation and training need labelled examples (use a labelled split)"
            )


def _nan_labels_missing(table: Any, task: Task) -> Any:
    """``table`` with NaN in a floating-point label column as missing (null): how pandas writes a missing value
    into a number column, not a label value of its own."""
    import pyarrow as pa
    import pyarrow.compute as pc

    name = task.label_field
    if not task.has_labels or name not in table.column_names:
        return table
    col = table.column(name)
    if not pa.types.is_floating(col.type) or not pc.any(pc.is_nan(col)).as_py():
        return table
    cleaned = pc.if_else(pc.is_nan(col), pa.scalar(None, col.type), col)
    return table.set_column(table.column_names.index(name), name, cleaned)


def _rows_of(dataset: Any) -> Iterator[dict[str, Any]]:
    """The rows of a ``datasets.Dataset`` as nested Python dicts (its features decoded: a JSON column of mixed
    types gives each row's own value), a batch at a time."""
    for batch in dataset.iter(batch_size=1024):
        keys = list(batch)
        for values in zip(*(batch[k] for k in keys)):
            yield dict(zip(keys, values))


def _is_json(arrow_type: Any) -> bool:
    """Whether an Arrow type is datasets' JSON extension (a column whose rows do not share one type)."""
    return "arrow.json" in str(arrow_type)


def _row_by_row(dataset: Any, task: Task, where: _Where, limit: int | None, require_labels: bool) -> list[Row]:
    """Expand and check rows one by one (nested rows, columns of mixed types): the examples, in order, up to
    ``limit``."""
    examples: list[Row] = []
    for index, row in enumerate(_rows_of(dataset)):
        at = where(index)
        try:
            flat = task.expand(row)
        except RowError as err:
            raise DataError(f"{at}: {err}") from None
        for example in flat:
            example.setdefault("idx", len(examples))
            if example.get("idx") is None:
                example["idx"] = len(examples)
            check_example(example, task, at)
            if require_labels and not example["labelled"]:
                raise DataError(
                    f"{at}: missing field {task.label_field!r} for task {task.name}; "
                    "evaluation and training need labelled examples (use a labelled split)"
                )
            examples.append(example)
            if limit is not None and len(examples) >= limit:
                return examples
    return examples


def _document_positions(table: Any) -> Any:
    """Rows of a text task's table that hold a document (not blank), as an int64 array; None when all do."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = table.column(TEXT_FIELD)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return None  # the column checks name the wrong type
    keep = pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(col)), 0).fill_null(False)
    if pc.all(keep).as_py():
        return None
    return pc.indices_nonzero(keep).to_numpy()


def load_examples(
    data: str | Path | DataSource,
    task: str | Task,
    limit: int | None = None,
    *,
    require_labels: bool = False,
    field_map: str | Sequence[str] | Mapping[str, str] | None = None,
) -> Examples:
    """Up to ``limit`` validated examples of ``task`` from ``data`` (a file, a saved dataset, ``hf:ORG/NAME``).

    Each example is the row flattened (dotted keys for nested objects; nested lists expanded by the task's
    ``[explode]``) plus ``idx`` (its 0-based position when the row has none), ``label`` (from the task's label
    field; None for unlabelled rows) and ``labelled`` (bool). Raises DataError, one line naming the file and the
    line or row; ``require_labels`` makes a missing label an error too (evaluation and training need labels).
    """
    task = get_task(task)
    if limit is not None and limit < 1:
        raise UsageError(f"the number of examples must be at least 1, got {limit}")
    source = data if isinstance(data, DataSource) else parse_source(data)
    opened = open_source(source)
    where = _Where(source)
    mapping = parse_field_map(field_map)
    dataset = opened.table
    columns = list(dataset.column_names)
    _check_mapping(mapping, columns, source.spec)
    if mapping:
        dataset = dataset.rename_columns({column: field for field, column in mapping.items()})
    facts = dict(opened.facts)
    if mapping:
        facts["field_map"] = mapping
    if dataset.num_rows == 0:
        raise DataError(f"{source.spec}: no examples (the file is empty)")
    table = _arrow(dataset)
    if task.expand is not expand_plain or any(_is_json(f.type) for f in table.schema):
        rows = _row_by_row(dataset, task, where, limit, require_labels)
        if not rows:
            raise DataError(f"{source.spec}: no examples (the file is empty)")
        return Examples(task, rows=rows, facts=facts)
    flat = _nan_labels_missing(_flat_arrow(table), task)
    positions = _document_positions(flat) if task.kind == TEXT and TEXT_FIELD in flat.column_names else None
    available = flat.num_rows if positions is None else len(positions)
    if available == 0:
        raise DataError(f"{source.spec}: no examples (every document is blank)")
    count = available if limit is None else min(limit, available)
    last = count if positions is None else int(positions[count - 1]) + 1
    _check_table(flat.slice(0, last), task, where, require_labels, columns)
    parts = [opened.digest or _content_digest(source, facts), json.dumps(mapping, sort_keys=True), task.name]
    return Examples(task, table=flat, count=count, positions=positions, facts=facts, digest_parts=parts)


def _content_digest(source: DataSource, facts: Mapping[str, Any]) -> str:
    """What identifies the data's content: the file's sha256, a saved dataset's fingerprint, a hub commit."""
    if source.kind == "hub":
        return f"{facts.get('repo_id')}@{facts.get('revision')}:{facts.get('config')}:{facts.get('split')}"
    assert source.path is not None
    state = source.path / "state.json"
    return state.read_text() if state.is_file() else str(source.path.resolve())


def examples_from_rows(rows: Sequence[Mapping[str, Any]], task: str | Task, where: str = "examples") -> Examples:
    """Examples from in-memory rows (a notebook's dicts), expanded and checked like a file's rows."""
    task = get_task(task)
    out: list[Row] = []
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise DataError(f"{where}[{i}]: an example is a mapping of field -> text, got {type(row).__name__}")
        try:
            flat = task.expand(row) if task.expand is not expand_plain else [flatten_row(row)]
        except RowError as err:
            raise DataError(f"{where}[{i}]: {err}") from None
        for example in flat:
            example.setdefault("idx", len(out))
            check_example(example, task, f"{where}[{i}]")
            out.append(example)
    return Examples(task, rows=out)


def count_unlabelled(examples: Sequence[Mapping[str, Any]]) -> int:
    """Number of examples without a label."""
    return sum(1 for ex in examples if not ex.get("labelled", ex.get("label") is not None))
