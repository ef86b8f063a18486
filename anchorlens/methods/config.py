"""One typed config per method (PEFT style): a frozen dataclass registered under its spec name.

The spec parser (``capsule:fusion=prepend,pos=last``), checkpoints (``anchorlens.json``),
sweeps and parameter tables all derive from these dataclasses: field types (``int``,
``Literal`` choices, positions, stacks) decide how a value is read from spec text or from JSON,
``__post_init__`` checks the values, ``to_spec()`` prints a spec that parses back to an equal
config, and ``build()`` makes the Guidance. Adding a method = one module with a config and a
Guidance, plus one ``register_method(Config, Guidance)`` line in ``registry.py``.

Bounds (what a spec or a file may allocate): positions per example (``n``, ``k``) at most the
base's context length (``DEFAULT_CONTEXT`` when it has none, e.g. T5), and every method's
parameter tensors at most ``MAX_GUIDANCE_BYTES`` (float32), checked before anything is allocated.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args, get_origin

from anchorlens.errors import UnknownNameError, UsageError
from anchorlens.methods.base import Guidance
from anchorlens.methods.positions import Position

DEFAULT_CONTEXT = 4096  # bound on inserted positions for bases without a context length (T5)
MAX_GUIDANCE_BYTES = 4 * 2**30  # refuse guidance parameters above 4 GiB (float32)
FLOAT_BYTES = 4
POSITION_ALIASES = {"pos": "position"}


def human_bytes(n: float) -> str:
    """``5.4 GiB``-style size."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _choices(hint: Any) -> tuple[Any, ...] | None:
    """The choices of a ``Literal[...]`` hint, else None."""
    return get_args(hint) if get_origin(hint) is Literal else None


@dataclass(frozen=True)
class MethodConfig:
    """Base of the method configs; subclasses are frozen dataclasses with documented fields.

    ClassVars: ``name`` (spec name), ``kind`` (checkpoint kind), ``aliases`` (other spec
    names), ``guidance`` (the Guidance class, set by ``register_method``), ``context_bounded``
    (fields counting positions per example, bounded by the base's context length).
    """

    name: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    guidance: ClassVar[type[Guidance]]
    context_bounded: ClassVar[tuple[str, ...]] = ()

    # ------------------------------------------------------------------ checks
    def __post_init__(self) -> None:
        """Normalise positions and stacks, check ints are >= 1 and Literal values are choices."""
        hints = self.field_types()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            hint = hints[f.name]
            if f.name == "position":
                object.__setattr__(self, f.name, Position.parse(value).value)
            elif f.name == "stacks":
                object.__setattr__(self, f.name, _normalise_stacks(value, self.name))
            elif hint is int:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise UsageError(f"{self.name}: option {f.name} needs an integer; got {value!r}")
                if value < 1:
                    raise UsageError(f"{self.name}: option {f.name} must be >= 1; got {f.name}={value}")
            elif (choices := _choices(hint)) is not None and value not in choices:
                raise UsageError(
                    f"unknown {self.name} {f.name} {value!r}; choose one of: {', '.join(map(str, choices))}"
                )

    @classmethod
    def field_types(cls) -> dict[str, Any]:
        """Resolved type hints of the dataclass fields."""
        hints = typing.get_type_hints(cls)
        return {f.name: hints[f.name] for f in dataclasses.fields(cls)}

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """Option names as written in specs (``position`` is written ``pos``)."""
        return tuple("pos" if f.name == "position" else f.name for f in dataclasses.fields(cls))

    @classmethod
    def options_help(cls) -> str:
        """One line per option: ``name (type, default): doc``."""
        hints = cls.field_types()
        lines = []
        for f in dataclasses.fields(cls):
            choices = _choices(hints[f.name])
            kind = "|".join(map(str, choices)) if choices else getattr(hints[f.name], "__name__", str(hints[f.name]))
            lines.append(
                f"{'pos' if f.name == 'position' else f.name} ({kind}, default {f.default}): {f.metadata.get('doc', '')}"
            )
        return "\n".join(lines)

    # ------------------------------------------------------------------ reading
    @classmethod
    def from_text(cls, options: dict[str, str]) -> MethodConfig:
        """From spec options (``{"fusion": "prepend", "pos": "last"}``, values as text)."""
        hints = cls.field_types()
        kwargs: dict[str, Any] = {}
        for raw, text in options.items():
            key = POSITION_ALIASES.get(raw, raw)
            if key not in hints:
                raise UsageError(
                    f"unknown option {raw!r} for {cls.name}; valid options: {', '.join(cls.option_names())} (as name=value)"
                )
            kwargs[key] = _from_text(cls.name, key, hints[key], text)
        return cls(**kwargs)

    @classmethod
    def from_json(cls, options: Any, where: str = "") -> MethodConfig:
        """From a checkpoint's ``options`` object; every value type-checked, unknown names refused."""
        at = f"{where}: " if where else ""
        if not isinstance(options, dict):
            raise UsageError(f"{at}options of {cls.kind} must be an object; got {type(options).__name__}")
        hints = cls.field_types()
        unknown = [k for k in options if k not in hints]
        if unknown:
            raise UnknownNameError(
                f"{at}unknown option {unknown[0]!r} for method {cls.kind} (this anchorlens knows {', '.join(hints)}); "
                "upgrade anchorlens or remove it"
            )
        for key, value in options.items():
            _check_json(cls, key, hints[key], value, at)
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in options.items()})

    # ------------------------------------------------------------------ writing
    def to_options(self) -> dict[str, Any]:
        """JSON-able options (every field; tuples as lists) for ``anchorlens.json``."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    def to_spec(self) -> str:
        """The spec text (options that differ from the defaults); ``parse_spec(to_spec())`` gives an equal config."""
        opts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            text = "all" if value is None else "/".join(value) if isinstance(value, tuple) else str(value)
            opts.append(f"{'pos' if f.name == 'position' else f.name}={text}")
        return f"{self.name}:{','.join(opts)}" if opts else self.name

    def __str__(self) -> str:
        """The spec text."""
        return self.to_spec()

    # ------------------------------------------------------------------ building
    def build(self):
        """The (unbound) Guidance this config describes."""
        return self.guidance(**dataclasses.asdict(self))

    def count(self) -> int:
        """Positions inserted per example (per layer for layer-level methods)."""
        raise NotImplementedError

    def parameter_count(self, base) -> int:
        """Float parameters this method allocates on ``base`` (before allocating them)."""
        return 0

    def check_fits(self, base) -> None:
        """UsageError (one line, with the limit) when the config would allocate more than the base allows."""
        limit = base.context_length or DEFAULT_CONTEXT
        need = self.parameter_count(base) * FLOAT_BYTES
        for name in self.context_bounded:
            value = getattr(self, name)
            if value > limit:
                size = f", would allocate {human_bytes(need)}" if need else ""
                raise UsageError(
                    f"{self.to_spec()}: {name}={value} exceeds the base's context length {limit} ({base.spec}{size}); "
                    f"use {name} <= {limit}"
                )
        if need > MAX_GUIDANCE_BYTES:
            raise UsageError(
                f"{self.to_spec()} would allocate {human_bytes(need)} of guidance parameters on {base.spec}; "
                f"the limit is {human_bytes(MAX_GUIDANCE_BYTES)}: use smaller options"
            )


def _normalise_stacks(value: Any, method: str) -> tuple[str, ...] | None:
    """None (every stack the base supports) or a tuple of stack names."""
    if value is None:
        return None
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, (tuple, list)) or not all(isinstance(s, str) and s for s in value):
        raise UsageError(f"{method}: stacks must be stack names (encoder, decoder); got {value!r}")
    return tuple(value) or None


def _from_text(method: str, key: str, hint: Any, text: str) -> Any:
    """A spec option value (text) as the field's type."""
    text = text.strip()
    if key == "position":
        return Position.parse(text).value
    if key == "stacks":
        return None if text == "all" else tuple(s for s in text.split("/") if s)
    if hint is int:
        try:
            return int(text)
        except ValueError:
            raise UsageError(f"{method}: option {key} needs an integer; got {text!r}") from None
    return text.lower() if _choices(hint) is not None else text


def _check_json(cls: type[MethodConfig], key: str, hint: Any, value: Any, at: str) -> None:
    """UsageError naming the option when a JSON value has the wrong type for the field."""

    def bad(expected: str) -> UsageError:
        return UsageError(f"{at}option {key} of method {cls.kind} must be {expected}; got {value!r}")

    if key == "position":
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise bad("a position name or an integer")
    elif key == "stacks":
        if value is not None and not (isinstance(value, list) and all(isinstance(s, str) for s in value)):
            raise bad("null or a list of stack names")
    elif hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
    elif _choices(hint) is not None and not isinstance(value, str):
        raise bad(f"one of {', '.join(map(str, _choices(hint) or ()))}")


# ---------------------------------------------------------------------- registry
METHOD_CONFIGS: dict[str, type[MethodConfig]] = {}  # spec name -> config class
_BY_KIND: dict[str, type[MethodConfig]] = {}


def register_method(config: type[MethodConfig], guidance: type[Guidance]) -> type[MethodConfig]:
    """Register ``config`` under its spec name (and kind, aliases) as the description of ``guidance``."""
    config.guidance = guidance
    guidance.config_class = config
    METHOD_CONFIGS[config.name] = config
    _BY_KIND[config.kind] = config
    return config


def config_class(name: str) -> type[MethodConfig] | None:
    """The config class for a spec name, alias or checkpoint kind; None if unknown."""
    key = name.strip().lower()
    if key in METHOD_CONFIGS:
        return METHOD_CONFIGS[key]
    if key in _BY_KIND:
        return _BY_KIND[key]
    for cls in METHOD_CONFIGS.values():
        if key in cls.aliases:
            return cls
    return None


def config_for_kind(kind: Any, where: str = "") -> type[MethodConfig]:
    """The config class for a checkpoint's method ``kind``; UnknownNameError lists the known kinds."""
    cls = _BY_KIND.get(kind) if isinstance(kind, str) else None
    if cls is None:
        at = f"{where}: " if where else ""
        raise UnknownNameError(
            f"{at}unknown method kind {kind!r} (this anchorlens knows {', '.join(_BY_KIND)}); upgrade anchorlens"
        )
    return cls
