"""Guidance methods (soft/deep prompts, instance tokens, capsules, prefixes) and the guided model."""
from __future__ import annotations

from anchorlens.methods.base import Guidance, masked_mean
from anchorlens.methods.capsule import CAPSULE_FUSIONS, Capsule
from anchorlens.methods.deep_prompt import DeepPrompt
from anchorlens.methods.guided import GuidedModel
from anchorlens.methods.instance import INSTANCE_MODES, InstanceToken
from anchorlens.methods.positions import POSITION_NAMES, Position
from anchorlens.methods.prefix import Prefix
from anchorlens.methods.registry import METHODS, guidance_from_config
from anchorlens.methods.soft_prompt import SoftPrompt
from anchorlens.methods.spec import METHOD_SPECS, load_guided, parse_spec

__all__ = [
    "CAPSULE_FUSIONS",
    "INSTANCE_MODES",
    "METHODS",
    "METHOD_SPECS",
    "POSITION_NAMES",
    "Capsule",
    "DeepPrompt",
    "Guidance",
    "GuidedModel",
    "InstanceToken",
    "Position",
    "Prefix",
    "SoftPrompt",
    "guidance_from_config",
    "load_guided",
    "masked_mean",
    "parse_spec",
]
