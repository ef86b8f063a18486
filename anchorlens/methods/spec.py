"""Specs and the one resolver from anything that names a model to a GuidedModel.

Grammar: parts joined by ``+``; a part is ``base``, a registered method with options
(``capsule:fusion=prepend,pos=last``; see ``anchorlens.methods.config``), an anchorlens
checkpoint directory, a checkpoint shipped with the package (``capsule@sst2``; ``anchorlens checkpoints``), or a PEFT adapter directory or hub id (prompt-learning adapters become guidance;
LoRA-family adapters are applied to the base by PEFT, ``DIR:merge=true`` merged). Examples:
``instance:k=2,pos=middle``, ``prompt:n=10+instance``, ``runs/ckpt+instance``, ``runs/lora+instance``.
``parse_spec`` gives a typed ``Spec`` whose ``str`` parses back to an equal ``Spec``; ``load_guided``
resolves specs, configs, checkpoint and adapter directories, Bases and GuidedModels to a GuidedModel
(no guidance = the base).

A checkpoint can be given a short name: ``NAME=SPEC`` (``ko=instance+knockout:keys=instance,mode=renorm``);
:func:`split_alias` states the rule that tells a name from a spec.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from anchorlens.errors import UnknownNameError, UsageError
from anchorlens.methods.config import METHOD_CONFIGS, POSITION_ALIASES, MethodConfig, _choices, config_class
from anchorlens.methods.guided import GuidedModel
from anchorlens.methods.registry import METHODS  # noqa: F401  (registers the built-in methods)
from anchorlens.methods.shipped import is_shipped_name, shipped_checkpoint
from anchorlens.models.base import Base

_BASE_NAMES = ("base", "none")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?")  # ORG/NAME[@REVISION], as for bases
ALIAS = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")  # a checkpoint's short name (NAME=SPEC)
RESERVED_ALIASES = ("model",)  # ``model=ORG/NAME`` is a spec (another base), never a name


def _choices_text() -> str:
    return (
        f"base, {', '.join(METHOD_CONFIGS)}, a shipped checkpoint NAME@TASK (capsule@sst2), "
        "an anchorlens checkpoint directory or a PEFT adapter directory"
    )


@dataclass(frozen=True)
class Directory:
    """A checkpoint (``anchorlens.json``) or PEFT adapter (``adapter_config.json``) directory in a spec."""

    path: str
    kind: Literal["checkpoint", "peft"]
    merge: bool = False  # a LoRA-family PEFT adapter merged into copies of the weights it changes
    name: str | None = None  # a shipped checkpoint's address (``capsule@sst2``); ``path`` is its folder

    def __str__(self) -> str:
        """The path (or shipped name) as written (``:merge=true`` after a merged adapter)."""
        return (self.name or self.path) + (":merge=true" if self.merge else "")


SpecPart = MethodConfig | Directory


@dataclass(frozen=True)
class Spec:
    """A parsed spec: method configs and directories in order; no parts = the base."""

    parts: tuple[SpecPart, ...] = ()

    def __str__(self) -> str:
        """The spec text (``base`` when empty); ``parse_spec(str(spec)) == spec``."""
        return "+".join(str(p) for p in self.parts) or "base"

    def __add__(self, other: Spec | SpecPart) -> Spec:
        """Composition: this spec's parts, then ``other``'s."""
        more = other.parts if isinstance(other, Spec) else (other,)
        return Spec(self.parts + tuple(more))

    @property
    def methods(self) -> tuple[MethodConfig, ...]:
        """The method configs (directories left out)."""
        return tuple(p for p in self.parts if isinstance(p, MethodConfig))

    def replace(self, index: int, **changes: Any) -> Spec:
        """A copy with part ``index`` (a method config) given new option values (checked again)."""
        part = self.parts[index]
        if not isinstance(part, MethodConfig):
            raise UsageError(f"part {index} of {self} is a directory; only method parts take options")
        return Spec(self.parts[:index] + (dataclasses.replace(part, **changes),) + self.parts[index + 1 :])


# ---------------------------------------------------------------------- directories
def _resolve_dir(text: str) -> Path | None:
    """The directory ``text`` names: an existing path, or a hub id (ORG/NAME[@REV]) resolved to its snapshot.

    None when ``text`` is neither; a hub id the cache and the Hub cannot provide is a UsageError
    that names both readings.
    """
    from anchorlens.models.hub import resolve_hub_dir

    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if path.exists() or not _HUB_ID.fullmatch(text):
        return None
    try:
        folder, _ = resolve_hub_dir(text, kind="adapter")
    except UsageError as err:
        raise UsageError(f"no such directory {text!r}, and as a hub adapter: {err}") from None
    return folder


def _directory_part(path: Path, text: str) -> Directory:
    from anchorlens.methods.checkpoints import is_checkpoint
    from anchorlens.methods.peft_files import is_peft_dir

    if is_checkpoint(path):
        return Directory(str(path) if path != Path(text) else text, "checkpoint")
    if is_peft_dir(path):
        return Directory(str(path) if path != Path(text) else text, "peft")
    raise UsageError(
        f"{text} is a directory but neither an anchorlens checkpoint (anchorlens.json) nor a PEFT adapter (adapter_config.json)"
    )


# ---------------------------------------------------------------------- names
def split_alias(text: str) -> tuple[str | None, str]:
    """``NAME=SPEC`` -> (NAME, SPEC); any other text -> (None, text) (the whole text is the spec).

    The rule: the text starts with a name ``[A-Za-z_][A-Za-z0-9_.-]*`` immediately followed by ``=``, the
    name is not ``model`` (``model=ORG/NAME`` gives another base) and the whole text is not an existing path
    (a directory called ``a=b`` stays a path). Only the first ``=`` splits, so the spec may hold more
    (``ko=instance+knockout:keys=instance,mode=renorm``). A spec's own ``=`` always follows a ``:`` (method
    options), a ``/`` (paths) or ``model``, none of which a name can hold, so no spec is read as a name.
    A name followed by an empty spec is a UsageError.
    """
    name, eq, spec = text.strip().partition("=")
    if not eq or not ALIAS.fullmatch(name) or name.lower() in RESERVED_ALIASES:
        return None, text
    if Path(text).expanduser().exists():
        return None, text
    if not spec.strip():
        raise UsageError(
            f"--ckpt {text!r} names {name!r} but gives no spec after '='; write NAME=SPEC, e.g. ko=instance"
        )
    return name, spec.strip()


# ---------------------------------------------------------------------- parsing
def _continues_value(current: str, fragment: str) -> bool:
    """True when ``current+fragment`` continues an option value that contains ``+`` (``mean=capsule+input``)."""
    name, colon, opts = current.partition(":")
    cls = config_class(name) if colon else None
    if cls is None:
        return False
    key, eq, value = opts.split(",")[-1].partition("=")
    key = POSITION_ALIASES.get(key.strip().lower(), key.strip().lower())
    choices = _choices(cls.field_types().get(key)) if eq else None
    head = fragment.split(",")[0].strip().lower()
    return bool(choices) and f"{value.strip().lower()}+{head}" in (choices or ())


def _split(text: str, original: str) -> list[str]:
    """``text`` split on the ``+`` that join parts; UsageError on an empty part."""
    fragments = text.split("+")
    if any(not f.strip() for f in fragments):
        raise UsageError(
            f"spec {original!r} has an empty part; join parts with a single '+' (e.g. prompt:n=10+instance)"
        )
    parts = [fragments[0]]
    for fragment in fragments[1:]:
        if _continues_value(parts[-1], fragment):
            parts[-1] = f"{parts[-1]}+{fragment}"
        else:
            parts.append(fragment)
    return parts


def _parse_part(text: str) -> SpecPart | None:
    """One part (None for ``base``); UsageError names the valid choices."""
    text = text.strip()
    path = _resolve_dir(text)
    if path is not None:
        return _directory_part(path, text)
    if is_shipped_name(text):  # ``capsule@sst2``: a checkpoint shipped inside the package
        shipped = shipped_checkpoint(text)
        return Directory(str(shipped.path), "checkpoint", name=shipped.address)
    name, colon, opts = text.partition(":")
    folder = _resolve_dir(name.strip()) if colon else None
    if folder is not None:  # ``LORA_DIR:merge=true``
        from anchorlens.methods.peft_lora import parse_directory_options

        part = _directory_part(folder, name.strip())
        return dataclasses.replace(part, merge=parse_directory_options(folder, opts, text))
    key = name.strip().lower()
    if key in _BASE_NAMES:
        if colon:
            raise UsageError(f"'base' takes no options; got {text!r}")
        return None
    cls = config_class(key)
    if cls is None and key.startswith("model="):
        raise UsageError(
            f"{text!r}: model=BASE names another base for one checkpoint of `anchorlens compare`; "
            "here give the base with --base (base= in Python)"
        )
    if cls is None:
        if "/" in text or text.startswith((".", "~")):
            raise UsageError(f"no such directory {text!r}; expected {_choices_text()}")
        raise UnknownNameError(f"unknown method {name!r} in spec; use {_choices_text()}")
    options: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in opts.split(","))):
        opt, eq, value = item.partition("=")
        if not eq or POSITION_ALIASES.get(opt.strip().lower(), opt.strip().lower()) not in cls.field_types():
            raise UsageError(
                f"unknown option {item!r} for {cls.name}; valid options: {', '.join(cls.option_names())} (as name=value)"
            )
        options[opt.strip().lower()] = value
    return cls.from_text(options)


def parse_spec(spec: str | Spec) -> Spec:
    """A spec string -> Spec; an empty or blank spec is refused (it is not the base: write ``base``)."""
    if isinstance(spec, Spec):
        return spec
    if not isinstance(spec, str):
        raise UsageError(f"a spec must be text like 'capsule' or 'prompt:n=10+instance'; got {type(spec).__name__}")
    text = spec.strip()
    if not text:
        raise UsageError(
            f"empty spec {spec!r}; name the model ({_choices_text()}); an empty spec is not the base, write 'base'"
        )
    whole = _resolve_dir(text)
    if whole is not None:
        return Spec((_directory_part(whole, text),))
    return Spec(tuple(p for p in map(_parse_part, _split(text, spec)) if p is not None))


# ---------------------------------------------------------------------- resolving
def _resolve_base(base: Base | str | None, spec: Spec) -> Base:
    """``base`` itself, loaded from its spec, or the first checkpoint's own base, or the default base."""
    from anchorlens.methods.checkpoints import read_meta
    from anchorlens.models.loading import DEFAULT_BASE, load_base

    if isinstance(base, Base):
        return base
    if base is None:
        saved = [
            read_meta(p.path)["base"].get("spec")
            for p in spec.parts
            if isinstance(p, Directory) and p.kind == "checkpoint"
        ]
        base = next((s for s in saved if s), DEFAULT_BASE)
    if not isinstance(base, str):
        raise UsageError(f"base must be a Base or a base spec such as 'smollm2-135m'; got {type(base).__name__}")
    return load_base(base)


def load_guided(
    spec_or_model: Any, base: Base | str | None = None, *, seed: int = 0, allow_other_base: bool = False
) -> GuidedModel:
    """The GuidedModel for a spec string, Spec, method config, checkpoint/PEFT directory, Base or GuidedModel.

    ``base``: a Base, a base spec, or None (a checkpoint's own base, else the default
    smollm2-135m). A GuidedModel is returned as is; a Base becomes ``GuidedModel(base)``.
    ``allow_other_base`` loads checkpoints/adapters recorded for another base (with a warning;
    the facts land in ``meta["other_base"]``).
    """
    from anchorlens.methods.checkpoints import load_checkpoint
    from anchorlens.methods.peft_import import peft_guidances
    from anchorlens.methods.peft_lora import apply_adapter, is_injected

    if isinstance(spec_or_model, GuidedModel):
        return spec_or_model
    if isinstance(spec_or_model, Base):
        return GuidedModel(spec_or_model, seed=seed)
    if isinstance(spec_or_model, MethodConfig):
        spec = Spec((spec_or_model,))
    elif isinstance(spec_or_model, Path):
        spec = parse_spec(str(spec_or_model))
    else:
        spec = parse_spec(spec_or_model)
    base_obj = _resolve_base(base, spec)
    guidances: list = []
    meta: dict[str, Any] = {}
    layered = [p for p in spec.parts if isinstance(p, Directory) and p.kind == "peft" and is_injected(p.path)]
    for layer_part in layered:  # LoRA-family adapters change the base's layers: applied by PEFT before guidance binds
        adapted = apply_adapter(base_obj, layer_part.path, merge=layer_part.merge, allow_other_base=allow_other_base)
        base_obj, meta["peft_adapter"] = adapted, adapted.facts
        if adapted.facts.get("other_base"):
            meta["other_base"] = meta.get("other_base", []) + adapted.facts["other_base"]
    for part in spec.parts:
        if part in layered:
            continue
        if isinstance(part, MethodConfig):
            guidances.append(part.build())
        elif part.kind == "checkpoint":
            loaded = load_checkpoint(part.path, base_obj, allow_other_base=allow_other_base)
            guidances.extend(loaded.guidances)
            other = meta.get("other_base", []) + loaded.meta.get("other_base", [])
            meta = {**loaded.meta, **meta, **({"other_base": other} if other else {})}
        else:
            notes: list[dict[str, Any]] = []
            guidances.extend(peft_guidances(part.path, base_obj, allow_other_base=allow_other_base, notes=notes))
            if notes:
                meta["other_base"] = meta.get("other_base", []) + notes
    guided = GuidedModel(base_obj, guidances, seed=seed)
    guided.meta = meta
    return guided
