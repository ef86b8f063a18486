"""Which chat template a run renders with, where it came from, and the arguments it is rendered with.

A tokenizer's ``chat_template`` is one Jinja text, or a dict of named texts (``{"default": ..., "tool_use":
...}``, from ``additional_chat_templates/*.jinja``). :func:`resolve_chat_template` picks the text a run uses (a
name chosen with ``--chat-template NAME``, else ``default``), finds its source (transformers 5 reads a
``chat_template.jinja`` beside the tokenizer files in preference to ``tokenizer_config.json``'s
``chat_template``; a template set in code has neither) and binds the template arguments
(``--chat-template-kwargs enable_thinking=false``). :meth:`ChatTemplate.facts` is what a manifest records and a
resume key hashes: the text, its sha256, its name and source, the arguments.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"
CONFIG_FILE = "tokenizer_config.json"
IN_CODE = "set on the tokenizer object (no tokenizer file holds it)"
# apply_chat_template's own parameters and the names it passes to every template: not template arguments
RESERVED = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "sanitize_control_tokens",
    }
)

Kwargs = tuple[tuple[str, Any], ...]


class ChatTemplateChoiceError(ValueError):
    """A template name or argument that does not fit the tokenizer (one line naming the fix)."""


@dataclass(frozen=True)
class ChatTemplate:
    """The chat template text a run renders with.

    ``name``: its name when the tokenizer holds several (None: a single template); ``source``: where it came from
    (a file path, or :data:`IN_CODE`); ``kwargs``: template arguments (sorted ``(key, value)`` pairs).
    """

    text: str
    name: str | None = None
    source: str = IN_CODE
    kwargs: Kwargs = ()

    @property
    def sha256(self) -> str:
        """SHA-256 of the template text (hex)."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def render_kwargs(self) -> dict[str, Any]:
        """Keywords for ``apply_chat_template``: this exact text and the template arguments."""
        return {"chat_template": self.text, **dict(self.kwargs)}

    def facts(self) -> dict[str, Any]:
        """What a manifest records (and a resume key hashes)."""
        return {
            "name": self.name,
            "source": self.source,
            "sha256": self.sha256,
            "kwargs": dict(self.kwargs),
            "text": self.text,
        }


def _value(raw: str) -> Any:
    """A template argument's value: JSON when it parses (``false``, ``3``, ``"x"``, ``[1, 2]``), Python's
    ``True``/``False``/``None`` spelled as such, else the text itself."""
    if raw in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[raw]
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def check_kwargs(pairs: Mapping[str, Any] | Iterable[tuple[str, Any]], where: str) -> Kwargs:
    """Sorted ``(key, value)`` pairs; ChatTemplateChoiceError for a key that is not a name or is reserved."""
    items = list(pairs.items()) if isinstance(pairs, Mapping) else list(pairs)
    seen: dict[str, Any] = {}
    for key, value in items:
        if not isinstance(key, str) or not key.isidentifier():
            raise ChatTemplateChoiceError(f"{where}: {key!r} is not a template argument name (letters, digits, _)")
        if key in RESERVED:
            raise ChatTemplateChoiceError(
                f"{where}: {key!r} is set by anchorlens itself, not a template argument; drop it"
            )
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise ChatTemplateChoiceError(f"{where}: the value of {key!r} is not plain data") from None
        seen[key] = value
    return tuple(sorted(seen.items()))


def parse_kwargs(items: Iterable[str], where: str = "--chat-template-kwargs") -> Kwargs:
    """``["enable_thinking=false", ...]`` -> sorted ``(key, value)`` pairs (module docstring)."""
    pairs: list[tuple[str, Any]] = []
    for item in items:
        key, eq, raw = item.partition("=")
        if not eq or not key.strip():
            raise ChatTemplateChoiceError(f"{where}: {item!r} is not KEY=VALUE (e.g. enable_thinking=false)")
        pairs.append((key.strip(), _value(raw.strip())))
    return check_kwargs(pairs, where)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _tokenizer_files(tokenizer: Any) -> Path | None:
    """The directory the tokenizer was read from (a local folder, or the hub cache's snapshot); None if unknown."""
    name = str(getattr(tokenizer, "name_or_path", "") or "")
    if not name:
        return None
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.is_file():  # a GGUF file: its template lives in the file's metadata
        return None
    try:  # a hub id: the cached snapshot, without reaching the network
        from transformers.utils import cached_file

        found = cached_file(name, CONFIG_FILE, local_files_only=True, _raise_exceptions_for_missing_entries=False)
    except Exception:  # noqa: BLE001 - no cache, an odd id: the source is then unknown, never an error
        return None
    return Path(found).parent if found else None


def _config_templates(folder: Path) -> dict[str, str]:
    """``tokenizer_config.json``'s chat template(s) by name (a single one is ``default``)."""
    raw = _read_text(folder / CONFIG_FILE)
    try:
        value = json.loads(raw)["chat_template"] if raw else None
    except (ValueError, KeyError, TypeError):
        return {}
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list):  # [{"name": ..., "template": ...}, ...]
        return {str(t.get("name")): str(t.get("template")) for t in value if isinstance(t, dict)}
    return {}


def template_source(tokenizer: Any, text: str, name: str | None) -> str:
    """Where ``text`` (the template named ``name``) came from: the file beside the tokenizer that holds exactly
    this text (``chat_template.jinja`` first, as transformers reads it), else :data:`IN_CODE`."""
    folder = _tokenizer_files(tokenizer)
    if folder is None:
        return IN_CODE
    candidates = [folder / CHAT_TEMPLATE_FILE]
    if name is not None:
        candidates.insert(0, folder / CHAT_TEMPLATE_DIR / f"{name}.jinja")
    for path in candidates:
        if _read_text(path) == text:
            return str(path)
    if _config_templates(folder).get(name or "default") == text:
        return f"{folder / CONFIG_FILE} (chat_template)"
    return IN_CODE


def resolve_chat_template(tokenizer: Any, name: str | None = None, kwargs: Kwargs = ()) -> ChatTemplate | None:
    """The template text a run uses (None when the tokenizer has none); ChatTemplateChoiceError for a name the
    tokenizer lacks, or several templates and no ``default`` with no name chosen."""
    value = getattr(tokenizer, "chat_template", None)
    if not value:
        return None
    if isinstance(value, Mapping):
        names = ", ".join(sorted(map(str, value)))
        chosen = name if name is not None else "default"
        if chosen not in value:
            if name is None:
                raise ChatTemplateChoiceError(
                    f"the tokenizer has several chat templates ({names}) and none named 'default'; choose one with "
                    '--chat-template NAME (chat_template = "NAME" in a task file)'
                )
            raise ChatTemplateChoiceError(f"the tokenizer has no chat template named {name!r}; it has: {names}")
        text = value[chosen]
        if not isinstance(text, str):
            raise ChatTemplateChoiceError(f"the tokenizer's chat template {chosen!r} is not text")
        return ChatTemplate(text, chosen, template_source(tokenizer, text, chosen), tuple(kwargs))
    if not isinstance(value, str):
        raise ChatTemplateChoiceError("the tokenizer's chat template is not text")
    if name is not None and name != "default":
        raise ChatTemplateChoiceError(
            f"the tokenizer has a single chat template, not one named {name!r}; drop --chat-template"
        )
    return ChatTemplate(value, None, template_source(tokenizer, value, None), tuple(kwargs))
