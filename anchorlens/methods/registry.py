"""Guidance classes by kind, for checkpoints and specs."""
from __future__ import annotations

from typing import Any

from anchorlens.errors import UsageError
from anchorlens.methods.base import Guidance
from anchorlens.methods.capsule import Capsule
from anchorlens.methods.deep_prompt import DeepPrompt
from anchorlens.methods.instance import InstanceToken
from anchorlens.methods.prefix import Prefix
from anchorlens.methods.soft_prompt import SoftPrompt

METHODS: dict[str, type[Guidance]] = {cls.kind: cls for cls in (SoftPrompt, DeepPrompt, InstanceToken, Capsule, Prefix)}


def guidance_from_config(entry: dict[str, Any]) -> Guidance:
    """``{"kind": "capsule", "options": {...}}`` -> an unbound Guidance."""
    kind = entry.get("kind")
    if kind not in METHODS:
        raise UsageError(f"unknown method kind {kind!r} in checkpoint; known: {', '.join(METHODS)}")
    return METHODS[kind].from_options(entry.get("options", {}))
