"""One parser from a spec string to a GuidedModel; every CLI command and ``inspect`` go through it.

Grammar: parts joined by ``+``; a part is ``base``, a method with options
(``capsule:fusion=prepend,pos=last``), an anchorlens checkpoint directory, or a PEFT adapter
directory. Examples: ``instance:k=2,pos=middle``, ``prompt:n=10+instance``, ``runs/ckpt+instance``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from anchorlens.errors import UsageError
from anchorlens.methods.base import Guidance
from anchorlens.methods.capsule import Capsule
from anchorlens.methods.deep_prompt import DeepPrompt
from anchorlens.methods.guided import GuidedModel
from anchorlens.methods.instance import InstanceToken
from anchorlens.methods.positions import Position
from anchorlens.methods.soft_prompt import SoftPrompt


def _int(name: str) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise UsageError(f"option {name} needs an integer; got {text!r}") from None

    return convert


def _stacks(text: str) -> tuple[str, ...] | None:
    """``encoder``, ``decoder``, ``encoder/decoder`` or ``all``."""
    return None if text == "all" else tuple(s for s in text.split("/") if s)


def _position(text: str) -> str | int:
    return Position.parse(text).value


@dataclass(frozen=True)
class MethodSpec:
    """A spec name, the class it builds and its options (spec name -> (constructor kwarg, converter))."""

    cls: type[Guidance]
    options: dict[str, tuple[str, Callable[[str], Any]]] = field(default_factory=dict)


_POS = {"pos": ("position", _position), "position": ("position", _position)}
METHOD_SPECS: dict[str, MethodSpec] = {
    "instance": MethodSpec(InstanceToken, {"k": ("k", _int("k")), "mode": ("mode", str), **_POS}),
    "capsule": MethodSpec(
        Capsule,
        {"fusion": ("fusion", str), "rank": ("rank", _int("rank")), "init": ("init", str), "stacks": ("stacks", _stacks), **_POS},
    ),
    "prompt": MethodSpec(SoftPrompt, {"n": ("n", _int("n")), "init": ("init", str), **_POS}),
    "deep-prompt": MethodSpec(DeepPrompt, {"n": ("n", _int("n")), "stacks": ("stacks", _stacks), **_POS}),
}
_ALIASES = {"soft-prompt": "prompt", "soft_prompt": "prompt", "deep_prompt": "deep-prompt", "deepprompt": "deep-prompt"}
_BASE_NAMES = ("base", "none", "")
_CHOICES = "base, instance, capsule, prompt, deep-prompt, an anchorlens checkpoint directory or a PEFT adapter directory"


@dataclass(frozen=True)
class Part:
    """One ``+``-separated part: a method with options, or a directory (``checkpoint``/``peft``)."""

    kind: str  # "method", "checkpoint", "peft", "base"
    name: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None


def _directory_part(path: Path, text: str) -> Part:
    from anchorlens.methods.checkpoints import is_checkpoint
    from anchorlens.methods.peft_import import is_peft_dir

    if is_checkpoint(path):
        return Part("checkpoint", text, path=path)
    if is_peft_dir(path):
        return Part("peft", text, path=path)
    raise UsageError(f"{text} is a directory but neither an anchorlens checkpoint (anchorlens.json) nor a PEFT adapter (adapter_config.json)")


def _parse_part(text: str) -> Part:
    """Parse one part; UsageError names the valid choices."""
    text = text.strip()
    path = Path(text).expanduser()
    if text and path.is_dir():
        return _directory_part(path, text)
    name, _, opts = text.partition(":")
    key = _ALIASES.get(name.strip().lower(), name.strip().lower())
    if key in _BASE_NAMES:
        if opts:
            raise UsageError(f"'base' takes no options; got {text!r}")
        return Part("base")
    if key not in METHOD_SPECS:
        if "/" in text or text.startswith("."):
            raise UsageError(f"no such directory {text!r}; expected {_CHOICES}")
        raise UsageError(f"unknown method {name!r} in spec; use {_CHOICES}")
    spec = METHOD_SPECS[key]
    kwargs: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in opts.split(","))):
        opt, eq, value = item.partition("=")
        opt = opt.strip().lower()
        if not eq or opt not in spec.options:
            valid = ", ".join(k for k in spec.options if k != "position")
            raise UsageError(f"unknown option {item!r} for {key}; valid options: {valid} (as name=value)")
        target, convert = spec.options[opt]
        kwargs[target] = convert(value.strip())
    return Part("method", key, kwargs)


def parse_spec(spec: str) -> list[Part]:
    """Split ``spec`` on ``+`` (unless the whole spec is a directory) and parse each part."""
    text = spec.strip()
    if text and Path(text).expanduser().is_dir():
        return [_parse_part(text)]
    return [_parse_part(p) for p in text.split("+")] if text else [Part("base")]


def load_guided(spec: str, base=None, base_spec: str | None = None, seed: int = 0) -> GuidedModel:
    """Build the GuidedModel for ``spec`` on ``base`` (loaded from ``base_spec``, a checkpoint's own base, or the default)."""
    from anchorlens.methods.checkpoints import checkpoint_guidances, read_meta
    from anchorlens.models.loading import DEFAULT_BASE, load_base
    from anchorlens.methods.peft_import import peft_guidances

    parts = parse_spec(spec)
    if base is None:
        if base_spec is None:
            saved = [read_meta(p.path).get("base", {}).get("spec") for p in parts if p.kind == "checkpoint"]
            base_spec = next((s for s in saved if s), DEFAULT_BASE)
        base = load_base(base_spec)
    guidances: list[Guidance] = []
    for part in parts:
        if part.kind == "checkpoint":
            guidances.extend(checkpoint_guidances(part.path, base))
        elif part.kind == "peft":
            guidances.extend(peft_guidances(part.path, base))
        elif part.kind == "method":
            guidances.append(METHOD_SPECS[part.name].cls(**part.options))
    return GuidedModel(base, guidances, seed=seed)
