"""Task files (TOML): one format, validated against :data:`SCHEMA`, for the built-in tasks and the user's own.

The minimal file::

    name = "reviews"
    template = "Review: {text}\\nSentiment:"
    labels = { positive = " good", negative = " bad" }   # label value in the data -> verbalizer
    label_field = "label"

Template literal text is ``structural``; ``{field}`` slots are ``content`` tagged with their field name
(``{field:role}`` gives a slot a role of its own). A template may also be an array of segments,
``[{ text = "Review: ", role = "scaffold" }, { field = "text" }]``. ``labels`` is a table (string label
values) or an array ``[{ value = true, verbalizer = " yes" }, ...]`` for typed values (booleans, numbers).
``chat = true`` renders through the tokenizer's chat template, with ``system``, ``chat_template`` (a named
template) and ``chat_template_kwargs = { enable_thinking = false }`` (template arguments). ``[roles]`` adds token
rules (``newline = ['^\\s*\\n\\s*$']``). Every problem is one line naming the file and
the key and what to write instead.
"""

from __future__ import annotations

import difflib
import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anchorlens.atomic import os_errors
from anchorlens.errors import DataError
from anchorlens.roles.chat_template import ChatTemplateChoiceError, check_kwargs
from anchorlens.roles.scheme import compile_rules
from anchorlens.roles.table import check_role_name
from anchorlens.roles.templates import Field, Literal, Segment, Template, TemplateSyntaxError
from anchorlens.tasks.explode import Explode, expand_plain
from anchorlens.tasks.task import CLASSIFICATION, KINDS, METRICS, TEXT, Task, label_key, text_digest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

TASK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class Key:
    """One key of the schema: its type(s) in words, a checker and whether it is required."""

    kinds: str
    check: Callable[[Any], bool]
    required: bool = False
    help: str = ""


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


SCHEMA: dict[str, Key] = {
    "name": Key("a string", _str, True, "the task's name (letters, digits, _ . -)"),
    "description": Key("a string", _str),
    "kind": Key("a string", _str, help=f"one of {', '.join(KINDS)}"),
    "template": Key("a string or an array of segments", lambda v: isinstance(v, (str, list)), True),
    "fields": Key("an array of strings", _str_list, help="fields every row must have (default: the template's)"),
    "label_field": Key("a string", _str),
    "labels": Key("a table or an array of tables", lambda v: isinstance(v, (dict, list))),
    "metrics": Key("an array of strings", _str_list, help=f"from {', '.join(METRICS)}"),
    "metric": Key("a string", _str, help="one metric (or use metrics = [...])"),
    "group_field": Key(
        "a string or an array of strings",
        lambda v: _str(v) or (_str_list(v) and bool(v)),
        help="the column(s) whose values group examples for em and for the train/eval split",
    ),
    "chat": Key("a boolean", lambda v: isinstance(v, bool)),
    "system": Key("a string", _str),
    "chat_template": Key("a string", _str, help="which of the tokenizer's named chat templates (e.g. tool_use)"),
    "chat_template_kwargs": Key(
        "a table",
        lambda v: isinstance(v, dict),
        help="arguments of the chat template, e.g. { enable_thinking = false }",
    ),
    "shots": Key("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
    "fewshot_delimiter": Key("a string", _str),
    "data": Key("a string", _str, help="a default --data: a file, a directory or hf:ORG/NAME[:CONFIG][@SPLIT]"),
    "roles": Key("a table of role = pattern(s)", lambda v: isinstance(v, dict)),
    "explode": Key("a table", lambda v: isinstance(v, dict)),
}


def _fail(where: str, message: str) -> DataError:
    """The one-line error of a task file."""
    return DataError(f"{where}: {message}")


def _check_keys(data: Mapping[str, Any], where: str) -> None:
    """Unknown keys (with the closest known one), missing required keys and wrong types."""
    for key in data:
        if key not in SCHEMA:
            close = difflib.get_close_matches(key, SCHEMA, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise _fail(where, f"unknown key {key!r}{hint}; allowed keys: {', '.join(SCHEMA)}")
    for key, spec in SCHEMA.items():
        if key not in data:
            if spec.required:
                raise _fail(where, f"missing key {key!r} ({spec.help or spec.kinds})")
            continue
        if not spec.check(data[key]):
            extra = f" ({spec.help})" if spec.help else ""
            raise _fail(where, f"{key} must be {spec.kinds}{extra}, got {type(data[key]).__name__}")


def _segments(value: Any, where: str) -> tuple[Segment, ...]:
    """A template string or array of segment tables -> segments."""
    if isinstance(value, str):
        try:
            return Template.parse(value).segments
        except TemplateSyntaxError as err:
            raise _fail(where, f"template: {err}") from None
    out: list[Segment] = []
    for i, seg in enumerate(value):
        at = f"template[{i}]"
        if not isinstance(seg, dict) or ("text" in seg) == ("field" in seg):
            raise _fail(where, f'{at} must be a table with either text = "..." or field = "..." (and an optional role)')
        unknown = set(seg) - {"text", "field", "role"}
        if unknown:
            raise _fail(where, f"{at} has unknown keys {sorted(unknown)}; use text or field, and role")
        role = seg.get("role")
        if role is not None:
            try:
                if role not in ("structural", "content", "special"):
                    check_role_name(role)
            except ValueError as err:
                raise _fail(where, f"{at}: {err}") from None
        if "text" in seg:
            if not isinstance(seg["text"], str):
                raise _fail(where, f"{at}.text must be a string")
            out.append(Literal(seg["text"], role) if role else Literal(seg["text"]))
        else:
            if not isinstance(seg["field"], str) or not seg["field"].strip():
                raise _fail(where, f"{at}.field must be a field name")
            out.append(Field(seg["field"].strip(), role) if role else Field(seg["field"].strip()))
    return tuple(out)


def _labels(value: Any, where: str) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    """(label values, verbalizers) from a table or an array of {value, verbalizer} tables."""
    if isinstance(value, dict):
        items = list(value.items())
    else:
        items = []
        for i, entry in enumerate(value):
            if not isinstance(entry, dict) or set(entry) != {"value", "verbalizer"}:
                raise _fail(where, f'labels[{i}] must be a table {{ value = ..., verbalizer = "..." }}')
            if isinstance(entry["value"], (dict, list)):
                raise _fail(where, f"labels[{i}].value must be a string, number or boolean")
            items.append((entry["value"], entry["verbalizer"]))
    if not items:
        raise _fail(where, "labels is empty; give every label value in the data its verbalizer")
    seen: dict[tuple[str, Any], Any] = {}
    for label, verbalizer in items:
        if not isinstance(verbalizer, str) or not verbalizer.strip():
            raise _fail(where, f'the verbalizer of label {label!r} must be non-blank text such as " yes"')
        if isinstance(label, float) and not math.isfinite(label):
            raise _fail(where, f"label {label!r} is not a finite number; write the label as text or a number")
        key = label_key(label)
        if key in seen:
            first = seen[key]
            if first == label and type(first) is type(label):
                raise _fail(where, f"label {label!r} is listed twice; list each label once")
            what = "equal numbers" if key[0] == "number" else "the same boolean"
            raise _fail(
                where,
                f"labels {first!r} and {label!r} are one label ({what}: data cannot tell them apart); list it once",
            )
        seen[key] = label
    return tuple(lbl for lbl, _ in items), tuple(v for _, v in items)


def _group_fields(value: Any) -> tuple[str, ...]:
    """``group_field`` as a tuple of column names."""
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def _metrics(data: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """The metric list (``metric`` or ``metrics``; default accuracy)."""
    if "metric" in data and "metrics" in data:
        raise _fail(where, "give either metric or metrics, not both")
    metrics = data.get("metrics", [data["metric"]] if "metric" in data else ["accuracy"])
    for m in metrics:
        if m not in METRICS:
            raise _fail(where, f"unknown metric {m!r}; choose from {', '.join(METRICS)}")
    if "em" in metrics and not data.get("group_field"):
        raise _fail(where, "metric em needs group_field (the column that groups answers of one question)")
    return tuple(metrics)


def task_from_mapping(data: Mapping[str, Any], where: str, *, source: str, text: str = "") -> Task:
    """Build a :class:`Task` from a parsed task file (``where`` names it in errors)."""
    _check_keys(data, where)
    name = data["name"]
    if not TASK_NAME.fullmatch(name):
        raise _fail(where, f"name {name!r} must be letters, digits, _ . - (at most 64 characters)")
    kind = data.get("kind", CLASSIFICATION)
    if kind not in KINDS:
        raise _fail(where, f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    template = Template(name, _segments(data["template"], where))
    if not template.fields:
        raise _fail(where, 'the template has no {field} slot; write the field the data fills, e.g. "Review: {text}"')
    labels, verbalizers = _labels(data["labels"], where) if "labels" in data else ((), ())
    if kind == CLASSIFICATION and not labels:
        raise _fail(where, 'a classification task needs labels (or set kind = "text" for a task without labels)')
    if kind == TEXT and labels:
        raise _fail(where, 'a text task has no labels; remove labels or set kind = "classification"')
    try:
        rules = compile_rules(data.get("roles", {}))
    except ValueError as err:
        raise _fail(where, f"[roles]: {err}") from None
    try:
        expand = Explode.from_spec(data["explode"], name) if "explode" in data else expand_plain
    except ValueError as err:
        raise _fail(where, str(err)) from None
    if data.get("system") is not None and not data.get("chat", False):
        raise _fail(where, "system needs chat = true (the system prompt goes into the tokenizer's chat template)")
    chat_extra: dict[str, Any] = {}
    for key in ("chat_template", "chat_template_kwargs"):
        if key in data and not data.get("chat", False):
            raise _fail(where, f"{key} needs chat = true (it chooses how the tokenizer's chat template renders)")
    if "chat_template" in data:
        chat_extra["chat_template"] = data["chat_template"]
    if "chat_template_kwargs" in data:
        try:
            chat_extra["chat_template_kwargs"] = check_kwargs(data["chat_template_kwargs"], "chat_template_kwargs")
        except ChatTemplateChoiceError as err:
            raise _fail(where, str(err)) from None
    declared = tuple(data.get("fields", ()))
    fields = tuple(dict.fromkeys([*declared, *template.fields]))
    try:
        return Task(
            name=name,
            description=data.get("description", ""),
            fields=fields,
            template=template,
            labels=labels,
            verbalizers=verbalizers,
            metrics=_metrics(data, where) if kind == CLASSIFICATION else (),
            group_fields=_group_fields(data.get("group_field")),
            expand=expand,
            label_field=data.get("label_field", "label"),
            kind=kind,
            rules=rules,
            chat=data.get("chat", False),
            system=data.get("system"),
            shots=data.get("shots", 0),
            fewshot_delimiter=data.get("fewshot_delimiter", "\n\n"),
            data=data.get("data"),
            source=source,
            digest=text_digest(text) if text else "",
            **chat_extra,
        )
    except ValueError as err:
        raise _fail(where, str(err)) from None


def parse_task_text(text: str, where: str, source: str) -> Task:
    """A task from a task file's text; TOML syntax errors name the line."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise _fail(where, f"not valid TOML ({err})") from None
    return task_from_mapping(data, where, source=source, text=text)


def load_task_file(path: str | Path) -> Task:
    """Read and validate a task file (TOML); DataError (one line naming the file) on any problem."""
    path = Path(path)
    with os_errors(path, "cannot read task file"):
        raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise _fail(str(path), "not UTF-8; save the task file as UTF-8") from None
    return parse_task_text(text, str(path), str(path.resolve()))
