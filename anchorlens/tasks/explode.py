"""One example per element of nested lists, declared in a task file (``[explode]``), not written in code.

A row such as SuperGLUE MultiRC's nests a list in a list (questions of a passage, answers of a question).
``levels`` names the lists from the row down (``["passage.questions", "answers"]``: level 1 is each
question, level 2 each answer of it); ``fields`` says where each field of an example comes from:

- ``"passage.text"``: a dotted path in the row (level 0);
- ``"1.question"``: a path in the level-1 element (``"2.text"``: in the level-2 element);
- a ``?`` suffix: optional, None when absent (otherwise a missing value is an error naming its path);
- ``"|#"``: when absent, the example's position among the row's examples; ``"|#1"``: the level-1 element's
  position in its list.

``when`` (a path in the row): rows whose first component of it is a plain value (a string ``passage``, not an
object holding the lists) are already flat and pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Row = dict[str, Any]
_MISSING = object()


class RowError(ValueError):
    """A data row does not have the shape its task expects (message without file location)."""


def flatten_row(row: Mapping[str, Any], prefix: str = "") -> Row:
    """Copy of ``row`` with nested objects flattened to dotted keys (``target.span1_text``)."""
    out: Row = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_row(value, name + "."))
        else:
            out[name] = value
    return out


def expand_plain(row: Mapping[str, Any]) -> list[Row]:
    """One example per row, nested objects flattened."""
    return [flatten_row(row)]


def _get(obj: Any, path: str) -> Any:
    """The value at a dotted ``path`` of nested mappings, or ``_MISSING``."""
    for part in path.split("."):
        if not isinstance(obj, Mapping) or part not in obj:
            return _MISSING
        obj = obj[part]
    return obj


@dataclass(frozen=True)
class FieldSource:
    """Where one field of an exploded example comes from (see the module docstring)."""

    level: int
    path: str
    optional: bool = False
    position: int | None = None  # default when absent: None (none), 0 (the example's index), k (level k's index)

    @classmethod
    def parse(cls, spec: str, depth: int) -> FieldSource:
        """Parse ``"2.idx|#"``, ``"1.question"``, ``"idx?"``...; ValueError names a bad spec."""
        body, _, default = spec.partition("|")
        optional = body.endswith("?")
        body = body.removesuffix("?")
        head, dot, rest = body.partition(".")
        level, path = (int(head), rest) if head.isdigit() and dot else (0, body)
        if not path or level > depth:
            raise ValueError(f"field source {spec!r} names no path or a level beyond {depth}")
        position = None
        if default:
            if not default.startswith("#") or (default[1:] and not default[1:].isdigit()):
                raise ValueError(f"field source {spec!r}: write the default as |# or |#LEVEL")
            position = int(default[1:] or 0)
            if position > depth:
                raise ValueError(f"field source {spec!r}: level {position} is beyond {depth}")
        return cls(level, path, optional, position)


@dataclass(frozen=True)
class Explode:
    """A row expander for nested lists (callable: row -> examples); ``task`` names the task in errors."""

    levels: tuple[str, ...]
    fields: tuple[tuple[str, FieldSource], ...]
    when: str | None = None
    task: str = ""

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], task: str) -> Explode:
        """Build from a task file's ``[explode]`` table; ValueError names a bad entry."""
        unknown = set(spec) - {"levels", "fields", "when"}
        if unknown:
            raise ValueError(f"[explode] has unknown keys {sorted(unknown)}; allowed: levels, fields, when")
        levels = spec.get("levels")
        if not isinstance(levels, list) or not levels or not all(isinstance(x, str) and x for x in levels):
            raise ValueError("[explode] levels must be a non-empty list of dotted paths")
        fields = spec.get("fields")
        if not isinstance(fields, Mapping) or not fields:
            raise ValueError("[explode] fields must be a table of field = source")
        parsed = []
        for name, source in fields.items():
            if not isinstance(source, str):
                raise ValueError(f'[explode.fields] {name} must be a string such as "1.question"')
            parsed.append((str(name), FieldSource.parse(source, len(levels))))
        when = spec.get("when")
        if when is not None and not isinstance(when, str):
            raise ValueError("[explode] when must be a dotted path")
        return cls(tuple(levels), tuple(parsed), when, task)

    def _display(self, source: FieldSource) -> str:
        """A source's path as a reader sees it (``passage.questions[].answers[].text``)."""
        lists = [f"{p}[]" for p in self.levels[: source.level]]
        return ".".join([*lists, source.path])

    def _list(self, obj: Any, level: int) -> list:
        """The list of ``level`` (1-based) inside ``obj``; RowError when missing or not a list."""
        where = ".".join(f"{p}[]" for p in self.levels[: level - 1])
        where = f"{where}.{self.levels[level - 1]}" if where else self.levels[level - 1]
        value = _get(obj, self.levels[level - 1])
        if value is _MISSING or value is None:
            raise RowError(f"missing field {where!r} for task {self.task}")
        if not isinstance(value, list):
            raise RowError(f"field {where!r} is not a list")
        return value

    def __call__(self, row: Mapping[str, Any]) -> list[Row]:
        """One example per innermost element; already-flat rows (``when`` not a list) pass through flattened."""
        if self.when is not None:
            head = self.when.split(".")[0]
            top = _get(row, head)
            if top is _MISSING or top is None:
                raise RowError(f"missing field {head!r} for task {self.task}")
            if not isinstance(top, (Mapping, list)):
                return [flatten_row(row)]
        out: list[Row] = []
        self._walk(row, [row], [], out)
        return out

    def _walk(self, row: Mapping[str, Any], chain: list[Any], positions: list[int], out: list[Row]) -> None:
        """Descend one level, or build the example at the innermost one."""
        level = len(chain)
        if level <= len(self.levels):
            for pos, element in enumerate(self._list(chain[-1], level)):
                self._walk(row, [*chain, element], [*positions, pos], out)
            return
        example: Row = {}
        for name, source in self.fields:
            value = _get(chain[source.level], source.path)
            if value is _MISSING or value is None:
                if source.position is not None:
                    value = len(out) if source.position == 0 else positions[source.position - 1]
                elif source.optional:
                    value = None
                else:
                    raise RowError(f"missing field {self._display(source)!r} for task {self.task}")
            example[name] = value
        out.append(example)


def explode_fields(expand: Any) -> Sequence[str]:
    """The field names an expander produces (empty for the plain one)."""
    return tuple(name for name, _ in expand.fields) if isinstance(expand, Explode) else ()
