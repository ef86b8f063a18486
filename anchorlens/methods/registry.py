"""The registered methods: one ``register_method(Config, Guidance)`` line per method."""

from __future__ import annotations

from typing import Any

from anchorlens.errors import UsageError
from anchorlens.methods.base import Guidance
from anchorlens.methods.capsule import Capsule, CapsuleConfig
from anchorlens.methods.config import METHOD_CONFIGS, MethodConfig, config_for_kind, register_method
from anchorlens.methods.deep_prompt import DeepPrompt, DeepPromptConfig
from anchorlens.methods.instance import InstanceConfig, InstanceToken
from anchorlens.methods.knockout import Knockout, KnockoutConfig
from anchorlens.methods.prefix import Prefix, PrefixConfig
from anchorlens.methods.soft_prompt import PromptConfig, SoftPrompt

register_method(PromptConfig, SoftPrompt)
register_method(DeepPromptConfig, DeepPrompt)
register_method(PrefixConfig, Prefix)
register_method(InstanceConfig, InstanceToken)
register_method(CapsuleConfig, Capsule)
register_method(KnockoutConfig, Knockout)

METHODS: dict[str, type[Guidance]] = {cls.kind: cls.guidance for cls in METHOD_CONFIGS.values()}


def method_config(entry: Any, where: str = "") -> MethodConfig:
    """A checkpoint's ``{"kind": "capsule", "options": {...}}`` -> its typed config (every field checked)."""
    at = f"{where}: " if where else ""

    if not isinstance(entry, dict):
        raise UsageError(f"{at}a method must be an object {{kind, options}}; got {type(entry).__name__}")
    unknown = sorted(set(entry) - {"kind", "options"})
    if unknown:
        raise UsageError(f"{at}unknown key {unknown[0]!r} in a method (this anchorlens knows kind, options)")
    if not isinstance(entry.get("kind"), str):
        raise UsageError(f"{at}a method's kind must be a string; got {entry.get('kind')!r}")
    cls = config_for_kind(entry["kind"], where)
    return cls.from_json(entry.get("options", {}), where)


def guidance_from_config(entry: Any) -> Guidance:
    """``{"kind": "capsule", "options": {...}}`` -> an unbound Guidance."""
    return method_config(entry).build()
