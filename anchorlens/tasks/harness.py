"""lm-evaluation-harness task files (YAML) read as anchorlens tasks, without installing the harness.

Read: ``task``, ``dataset_path``/``dataset_name`` and the ``*_split`` keys (the task's default data, a hub
dataset from the local HF cache: ``hf:PATH:NAME@SPLIT``, the validation split first), ``doc_to_text`` (Jinja:
literal text structural, each ``{{ expression }}`` content tagged with the field it reads; a bare field name
reads that field; ``{% set %}`` variables are not fields), ``doc_to_target`` and ``doc_to_choice``
(:mod:`anchorlens.tasks.harness_choices`: a target equal to a choice's text is that choice; fixed choices, each
preceded by ``target_delimiter``, become the verbalizers; choices that differ per document, ``{{ choices.text }}``,
are scored per document with the choice indices as labels), ``description`` (structural text before the
demonstrations and the query), ``num_fewshot``, ``fewshot_split``, ``target_delimiter`` and
``fewshot_delimiter``, and ``include`` (a base file beside this one, overridden by this one's keys). Jinja runs in
a bounded sandbox (:func:`anchorlens.roles.jinja.jinja_environment`); its errors are one line naming the key.
Entries that need the harness's Python (``!function``, ``process_docs``, ``process_results``, custom ``class``)
are refused in one line naming the entry; keys about generation and metrics (``generation_kwargs``,
``metric_list``, ``filter_list``...) are ignored and listed in the task's notes, as are keys unlike any the
harness knows; a key that looks like a misspelt known one (``doc_to_targt``) is refused, since ignoring it would
silently change the task.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from anchorlens.atomic import os_errors
from anchorlens.errors import DataError
from anchorlens.roles.jinja import JinjaTemplate
from anchorlens.roles.templates import TemplateError
from anchorlens.tasks.harness_choices import HarnessTask, choice_function, target_function
from anchorlens.tasks.task import CLASSIFICATION, Task, text_digest

CODE_KEYS = ("process_docs", "process_results", "class", "custom_dataset", "doc_to_image", "doc_to_audio")
IGNORED_KEYS = (
    "output_type",
    "metric_list",
    "generation_kwargs",
    "filter_list",
    "metadata",
    "tag",
    "group",
    "dataset_kwargs",
    "should_decontaminate",
    "doc_to_decontamination_query",
    "repeats",
    "unsafe_code",
    "fewshot_config",
    "gen_prefix",
    "task_alias",
    "group_alias",
    "reference",
    "use_prompt",
)
KNOWN_KEYS = (
    "task",
    "include",
    "dataset_path",
    "dataset_name",
    "training_split",
    "validation_split",
    "test_split",
    "fewshot_split",
    "doc_to_text",
    "doc_to_target",
    "doc_to_choice",
    "description",
    "target_delimiter",
    "fewshot_delimiter",
    "num_fewshot",
    *IGNORED_KEYS,
)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Function(str):
    """The value of a ``!function`` tag (harness Python code): kept only to be refused by name."""


def _loader() -> Any:
    """A safe YAML loader that reads ``!function`` as a marker instead of failing."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def function(loader: Any, node: Any) -> _Function:
        return _Function(loader.construct_scalar(node))

    Loader.add_constructor("!function", function)
    return Loader


def _read_text(path: Path) -> str:
    """The file's text; a byte that is not UTF-8 is one line naming ``FILE:LINE``, the byte and its column."""
    with os_errors(path, "cannot read task file"):
        raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        start = 3 if raw.startswith(b"\xef\xbb\xbf") else 0
        at = start + err.start
        line, column = raw.count(b"\n", 0, at) + 1, at - max(raw.rfind(b"\n", 0, at) + 1, start) + 1
        raise DataError(
            f"{path}:{line}: not UTF-8 (byte 0x{raw[at]:02x} at column {column}); re-encode the file as UTF-8"
        ) from None


def _read_yaml(path: Path) -> tuple[dict[str, Any], str]:
    """One YAML mapping and the file's text; DataError (one line naming the file) otherwise."""
    import yaml

    text = _read_text(path)
    try:
        data = yaml.load(text, Loader=_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" on line {mark.line + 1}" if mark is not None else ""
        raise DataError(f"{path}: not valid YAML{line} ({getattr(err, 'problem', None) or err})") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: a harness task file is a YAML mapping of keys (task, doc_to_text, ...)")
    return data, text


def _with_includes(path: Path, seen: tuple[Path, ...] = ()) -> tuple[dict[str, Any], str]:
    """The file's keys over those of the file it ``include``s (recursively), and the text of all of them."""
    data, text = _read_yaml(path)
    include = data.pop("include", None)
    if include is None:
        return data, text
    if isinstance(include, _Function) or not isinstance(include, str):
        raise DataError(f"{path}: include must name a YAML file beside this one")
    base = (path.parent / include).resolve()
    if base in seen or base == path.resolve():
        raise DataError(f"{path}: include {include} includes itself")
    if not base.is_file():
        raise DataError(f"{path}: include {include}: no such file {base}")
    parent, parent_text = _with_includes(base, (*seen, path.resolve()))
    return {**parent, **data}, parent_text + "\n" + text


def _refuse_code(data: Mapping[str, Any], where: str) -> None:
    """Entries that need the harness's Python: one line naming the entry."""
    for key, value in data.items():
        if isinstance(value, _Function) and key in CODE_KEYS:
            raise DataError(
                f"{where}: {key} is `!function {value}` (Python code of the harness); anchorlens cannot run it: "
                f"preprocess the data and drop {key}"
            )
        if isinstance(value, _Function):
            raise DataError(
                f"{where}: {key} is `!function {value}` (Python code of the harness); anchorlens reads only Jinja "
                f"and plain values: write {key} as a Jinja template or preprocess the data"
            )
        if key in CODE_KEYS:
            raise DataError(f"{where}: {key} needs the harness's Python; preprocess the data and drop {key}")


def _template_source(doc_to_text: Any, where: str) -> str:
    """``doc_to_text`` as Jinja (a bare field name reads that field)."""
    if not isinstance(doc_to_text, str) or not doc_to_text:
        raise DataError(f"{where}: doc_to_text must be a Jinja template string")
    if _IDENT.fullmatch(doc_to_text.strip()):
        return "{{ " + doc_to_text.strip() + " }}"
    return doc_to_text


def _label_function(target: Any, choices: list[str] | None, choices_of: Any) -> Any:
    """example -> choice index from ``doc_to_target`` over the fixed choices or the document's own."""

    def label(example: Mapping[str, Any]) -> Any:
        if choices is not None:
            return target(example, choices)
        try:
            own = choices_of(example)
        except ValueError as err:
            raise ValueError(f"doc_to_choice fails on this example ({err})") from None
        return target(example, own)

    return label


def _default_data(data: Mapping[str, Any], split_keys: tuple[str, ...]) -> str | None:
    """``hf:PATH[:NAME]@SPLIT`` for the first split key given."""
    path = data.get("dataset_path")
    if not isinstance(path, str):
        return None
    name = data.get("dataset_name")
    split = next((data[k] for k in split_keys if isinstance(data.get(k), str)), None)
    spec = f"hf:{path}" + (f":{name}" if isinstance(name, str) else "") + (f"@{split}" if split else "")
    return spec


def _refuse_misspelt(unknown: list[str], where: str) -> None:
    """DataError for an unknown key that is close to a known one (``doc_to_targt``): ignoring it would silently
    change the task (labels from another column, another prompt). Keys unlike any known one (a newer harness's)
    are only noted."""
    import difflib

    for key in unknown:
        close = difflib.get_close_matches(str(key), KNOWN_KEYS, n=1, cutoff=0.8)
        if close:
            raise DataError(f"{where}: unknown key {key!r}; did you mean {close[0]!r}? (fix its spelling)")


def load_harness_task(path: str | Path) -> Task:
    """An lm-evaluation-harness YAML task as a :class:`Task` (module docstring); DataError names the file and key."""
    path = Path(path)
    where = str(path)
    data, text = _with_includes(path)
    _refuse_code(data, where)
    unknown = sorted(set(data) - set(KNOWN_KEYS))
    _refuse_misspelt(unknown, where)
    notes = [f"ignored (generation and metrics are the harness's): {', '.join(k for k in IGNORED_KEYS if k in data)}"]
    if unknown:
        notes.append(f"unknown keys ignored: {', '.join(unknown)}")
    name = data.get("task")
    if not isinstance(name, str) or not name.strip():
        raise DataError(f"{where}: missing key 'task' (the task's name)")
    if "doc_to_text" not in data:
        raise DataError(f"{where}: missing key 'doc_to_text' (the prompt template)")
    source = _template_source(data["doc_to_text"], where)
    description = data.get("description") or ""
    if not isinstance(description, str):
        raise DataError(f"{where}: description must be a string")
    try:
        template = JinjaTemplate.parse(source, name=f"{name.strip()} doc_to_text")
    except TemplateError as err:
        raise DataError(f"{where}: doc_to_text: {err}") from None
    if not template.fields:
        raise DataError(f"{where}: doc_to_text reads no field; write the document's fields as {{{{ field }}}}")
    delimiter = data.get("target_delimiter", " ")
    if not isinstance(delimiter, str):
        raise DataError(f"{where}: target_delimiter and fewshot_delimiter must be strings")
    labels: tuple[Any, ...] = ()
    verbalizers: tuple[str, ...] = ()
    label_of = None
    choices: list[str] | None = None
    choices_of = None
    if "doc_to_choice" in data:
        choices, choices_of = choice_function(data["doc_to_choice"], where)
        if choices is not None:
            if len(choices) < 2:
                raise DataError(f"{where}: doc_to_choice gives {len(choices)} choice(s); a task needs at least 2")
            labels = tuple(range(len(choices)))
            verbalizers = tuple(f"{delimiter}{c}" for c in choices)
        else:
            notes.append("doc_to_choice varies per document: each document is scored on its own choices")
        if "doc_to_target" in data:
            label_of = _label_function(target_function(data["doc_to_target"], where), choices, choices_of)
    else:
        notes.append("no doc_to_choice: a task without fixed choices (capture and compare work)")
    shots = data.get("num_fewshot", 0)
    if not isinstance(shots, int) or isinstance(shots, bool) or shots < 0:
        raise DataError(f"{where}: num_fewshot must be a non-negative integer")
    fewshot_delimiter = data.get("fewshot_delimiter", "\n\n")
    if not isinstance(delimiter, str) or not isinstance(fewshot_delimiter, str):
        raise DataError(f"{where}: target_delimiter and fewshot_delimiter must be strings")
    try:
        return HarnessTask(
            name=name.strip(),
            description=f"lm-evaluation-harness task {name.strip()}",
            fields=template.fields,
            template=template,
            labels=labels,
            verbalizers=verbalizers,
            metrics=("accuracy",) if labels or choices_of is not None else (),
            expand=keep_nested,
            kind=CLASSIFICATION,
            shots=shots,
            fewshot_delimiter=fewshot_delimiter,
            preamble=description,
            data=_default_data(data, ("validation_split", "test_split", "training_split")),
            fewshot_data=_default_data(data, ("fewshot_split", "training_split", "validation_split")),
            source=str(path.resolve()),
            digest=text_digest(text),
            notes=tuple(n for n in notes if not n.endswith(": ")),
            label_of=label_of,
            choices_of=choices_of,
            target_delimiter=delimiter,
            choice_texts=tuple(choices or ()),
        )
    except ValueError as err:
        raise DataError(f"{where}: {err}") from None


def keep_nested(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One example per row, nested values kept as they are (Jinja expressions read them)."""
    return [dict(row)]
