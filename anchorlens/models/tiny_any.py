"""A tiny random model of any ``model_type`` transformers can build, from its own config class.

The config class's defaults are shrunk generically (width, layers, heads, experts, vocabulary; a
sliding window of 8 where the family has one) and the model is built with a fixed seed. Used by
``anchorlens models --survey`` and the tests of discovered families; nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from anchorlens.errors import UsageError
from anchorlens.models.lm_class import lm_model_class

WINDOW = 8  # sliding window of every tiny model that has one: smaller than the test inputs
MAX_PARAMETERS = 20_000_000  # a shrunk config larger than this is refused before any weight is allocated

# Field -> tiny value, applied where the config class has the field. Head dims are 16, 4 query heads over 2
# key/value heads (grouped-query), 4 experts with 2 per token, 4 layers.
SHRINK: dict[str, Any] = {
    "hidden_size": 64,
    "d_model": 64,
    "n_embd": 64,
    "intermediate_size": 128,
    "ffn_hidden_size": 128,
    "d_ff": 128,
    "n_inner": 128,
    "num_hidden_layers": 4,
    "num_layers": 4,
    "n_layer": 4,
    "num_attention_heads": 4,
    "n_head": 4,
    "num_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "d_kv": 16,
    "max_position_embeddings": 512,
    "n_positions": 512,
    "rotary_dim": 8,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "global_attn_every_n_layers": 2,
    "local_attention": 8,
    "tie_word_embeddings": False,
}


SPECIAL_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id", "mask_token_id")


def _fields(config: Any) -> dict[str, Any]:
    """The config's own fields and their defaults (a dataclass config, or its ``to_dict``)."""
    if dataclasses.is_dataclass(config):
        return {f.name: getattr(config, f.name, None) for f in dataclasses.fields(config)}
    return config.to_dict()


@contextmanager
def _quiet() -> Iterator[None]:
    """transformers' warnings off for the block."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def tiny_config(model_type: str, vocab_size: int, special: dict[str, int] | None = None, **overrides: Any) -> Any:
    """The config of a tiny ``model_type``: its class's defaults shrunk by :data:`SHRINK`, then ``overrides``.

    ``special``: pad/bos/eos token ids of the tokenizer. A window of :data:`WINDOW` is set where the default
    has one; layer types are re-derived for the new depth by the config class itself.
    """
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise UsageError(f"transformers has no model_type {model_type!r}")
    cls = CONFIG_MAPPING[model_type]
    with _quiet():  # some defaults warn about themselves (special ids outside the default vocabulary)
        defaults = _fields(cls())
    values: dict[str, Any] = {k: v for k, v in SHRINK.items() if k in defaults}
    values["vocab_size"] = vocab_size
    if defaults.get("sliding_window") is not None:
        values["sliding_window"] = WINDOW
    if "kv_lora_rank" in defaults and "num_attention_heads" in values:
        values["num_key_value_heads"] = values["num_attention_heads"]  # latent attention expands to every head
    if "layer_types" in defaults:
        values["layer_types"] = None  # derived again for the new depth
    values.update({k: v for k, v in (special or {}).items() if k in defaults})
    values.update(overrides)
    return cls(**values)


def parameter_count(model_cls: type, config: Any) -> int:
    """Parameters of ``model_cls(config)``, counted on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = model_cls(config)
    return sum(p.numel() for p in model.parameters())


def build_tiny_any(
    model_type: str, tokenizer: Any, *, seed: int = 0, attn_implementation: str = "sdpa", **overrides: Any
) -> torch.nn.Module:
    """A tiny random model of ``model_type`` with its language-model head (the causal LM class, else masked LM,
    else seq2seq), vocabulary sized for ``tokenizer``; UsageError (one line) when none can be built small."""
    special = {name: getattr(tokenizer, name) for name in SPECIAL_IDS if getattr(tokenizer, name, None) is not None}
    config = tiny_config(model_type, len(tokenizer), special, **overrides)
    if getattr(config, "is_encoder_decoder", False):
        special_start = special.get("pad_token_id", 0)
        config.decoder_start_token_id = special_start
    mapping = lm_model_class(config)
    if mapping is None:
        raise UsageError(f"{model_type}: transformers has no language-model class for it")
    count = parameter_count(mapping, config)
    if count > MAX_PARAMETERS:
        raise UsageError(f"{model_type}: the shrunk config still has {count:,} parameters (over {MAX_PARAMETERS:,})")
    if attn_implementation == "sdpa" and not getattr(mapping, "_supports_sdpa", True):
        attn_implementation = "eager"  # what transformers itself picks for a family sdpa cannot serve
    config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = mapping(config)
    return model.eval()
