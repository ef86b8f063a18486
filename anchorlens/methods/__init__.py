"""Guidance methods (soft/deep prompts, instance tokens, capsules, prefixes) and the guided model."""

from __future__ import annotations

from anchorlens.methods.base import Guidance, LayerPositions, masked_mean
from anchorlens.methods.capsule import CAPSULE_FUSIONS, CAPSULE_MEANS, Capsule, CapsuleConfig
from anchorlens.methods.config import (
    DEFAULT_CONTEXT,
    MAX_GUIDANCE_BYTES,
    METHOD_CONFIGS,
    MethodConfig,
    config_class,
    register_method,
)
from anchorlens.methods.deep_prompt import DeepPrompt, DeepPromptConfig
from anchorlens.methods.guided import GuidedModel
from anchorlens.methods.instance import INSTANCE_MODES, InstanceConfig, InstanceToken
from anchorlens.methods.positions import POSITION_NAMES, Position
from anchorlens.methods.prefix import Prefix, PrefixConfig
from anchorlens.methods.registry import METHODS, guidance_from_config, method_config
from anchorlens.methods.soft_prompt import PAPER_PROMPT_LENGTH, PromptConfig, SoftPrompt
from anchorlens.methods.spec import Directory, Spec, load_guided, parse_spec

__all__ = [
    "CAPSULE_FUSIONS",
    "CAPSULE_MEANS",
    "DEFAULT_CONTEXT",
    "INSTANCE_MODES",
    "MAX_GUIDANCE_BYTES",
    "METHODS",
    "METHOD_CONFIGS",
    "PAPER_PROMPT_LENGTH",
    "POSITION_NAMES",
    "Capsule",
    "CapsuleConfig",
    "DeepPrompt",
    "DeepPromptConfig",
    "Directory",
    "Guidance",
    "GuidedModel",
    "InstanceConfig",
    "InstanceToken",
    "LayerPositions",
    "MethodConfig",
    "Position",
    "Prefix",
    "PrefixConfig",
    "PromptConfig",
    "SoftPrompt",
    "Spec",
    "config_class",
    "guidance_from_config",
    "load_guided",
    "masked_mean",
    "method_config",
    "parse_spec",
    "register_method",
]
