"""Tiny random bases built from transformers' own config classes with a fixed seed, for offline tests.

One base per verified family (``tiny-<family>``). Sliding-window families get a window of 8,
smaller than the test inputs, so the window matters; Gemma gets a soft-cap and a
``query_pre_attn_scalar`` different from the head dim, so both change the attention. The families added
with discovery (:data:`DISCOVERED`) are built by :func:`~anchorlens.models.tiny_any.tiny_config` from the config
class's defaults, with the family's mechanism switched on where the defaults leave it off or too large to matter
(chunks of 8 tokens, NoPE every other layer, temperature tuning from the first positions...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

from anchorlens.errors import UnknownNameError
from anchorlens.models.lm_class import lm_model_class
from anchorlens.models.tiny_any import SPECIAL_IDS, WINDOW, tiny_config
from anchorlens.models.tiny_tokenizers import tiny_tokenizer


@dataclass(frozen=True)
class TinySpec:
    """How to build one tiny base: tokenizer style, model class (None: the config's LM class), and its config."""

    style: str
    model_cls: type | None
    config: Callable[[Any], Any]


def _special(tok: Any) -> dict[str, int]:
    return {n: getattr(tok, n) for n in SPECIAL_IDS if getattr(tok, n, None) is not None}


def _any(model_type: str, style: str = "llama", **overrides: Any) -> TinySpec:
    """A tiny ``model_type`` from its config class's shrunk defaults plus ``overrides``."""
    return TinySpec(style, None, lambda tok: tiny_config(model_type, len(tok), _special(tok), **overrides))


def _common(tok: Any) -> dict:
    return dict(vocab_size=len(tok), pad_token_id=tok.pad_token_id)


def _decoder(tok: Any) -> dict:
    """Shape shared by the rotary decoder families: 4 layers, d=64, 4 query heads over 2 kv heads."""
    return dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        **_common(tok),
    )


_LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]

TINY: dict[str, TinySpec] = {
    "tiny-llama": TinySpec(
        "llama",
        LlamaForCausalLM,
        lambda tok: LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=512,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            **_common(tok),
        ),
    ),
    "tiny-qwen2": TinySpec(
        "llama",
        Qwen2ForCausalLM,
        lambda tok: Qwen2Config(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            **_common(tok),
        ),
    ),
    "tiny-gpt2": TinySpec(
        "gpt2",
        GPT2LMHeadModel,
        lambda tok: GPT2Config(
            n_embd=64,
            n_layer=4,
            n_head=4,
            n_positions=512,
            bos_token_id=tok.eos_token_id,
            eos_token_id=tok.eos_token_id,
            **_common(tok),
        ),
    ),
    "tiny-bert": TinySpec(
        "bert",
        BertForMaskedLM,
        lambda tok: BertConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            max_position_embeddings=512,
            **_common(tok),
        ),
    ),
    "tiny-t5": TinySpec(
        "t5",
        T5ForConditionalGeneration,
        lambda tok: T5Config(  # type: ignore[call-arg]
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=3,
            num_decoder_layers=3,
            num_heads=4,
            relative_attention_num_buckets=8,
            decoder_start_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            **_common(tok),
        ),
    ),
    "tiny-qwen3": TinySpec("llama", Qwen3ForCausalLM, lambda tok: Qwen3Config(**_decoder(tok))),
    "tiny-mistral": TinySpec(
        "llama",
        MistralForCausalLM,
        lambda tok: MistralConfig(
            sliding_window=WINDOW,
            **_decoder(tok),
        ),
    ),
    "tiny-gemma2": TinySpec(
        "llama",
        Gemma2ForCausalLM,
        lambda tok: Gemma2Config(
            sliding_window=WINDOW,
            layer_types=_LAYER_TYPES,
            query_pre_attn_scalar=8,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=5.0,
            initializer_range=0.1,
            **_decoder(tok),
        ),
    ),
    "tiny-gemma3": TinySpec(
        "llama",
        Gemma3ForCausalLM,
        lambda tok: Gemma3TextConfig(
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            query_pre_attn_scalar=8,
            initializer_range=0.1,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            **_decoder(tok),
        ),
    ),
    "tiny-phi3": TinySpec(
        "llama",
        Phi3ForCausalLM,
        lambda tok: Phi3Config(
            sliding_window=WINDOW,
            **{k: v for k, v in _decoder(tok).items() if k != "head_dim"},
        ),
    ),
    "tiny-olmo2": TinySpec(
        "llama",
        Olmo2ForCausalLM,
        lambda tok: Olmo2Config(
            **{k: v for k, v in _decoder(tok).items() if k != "head_dim"},
        ),
    ),
    "tiny-gpt-neox": TinySpec(
        "gpt2",
        GPTNeoXForCausalLM,
        lambda tok: GPTNeoXConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            max_position_embeddings=512,
            use_parallel_residual=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
            bos_token_id=tok.eos_token_id,
            eos_token_id=tok.eos_token_id,
            **_common(tok),
        ),
    ),
}
# Families verified through discovery alone (no adapter code of their own): model_type -> tiny base.
DISCOVERED: dict[str, TinySpec] = {
    "tiny-mixtral": _any("mixtral", sliding_window=WINDOW),
    "tiny-qwen2-moe": _any("qwen2_moe", decoder_sparse_step=1, mlp_only_layers=[]),
    "tiny-qwen3-moe": _any("qwen3_moe"),
    "tiny-olmo": _any("olmo", clip_qkv=0.02),
    "tiny-olmo3": _any("olmo3"),
    "tiny-olmoe": _any("olmoe"),
    "tiny-smollm3": _any("smollm3", no_rope_layer_interval=2),
    "tiny-gpt-oss": _any("gpt_oss"),
    "tiny-gemma": _any("gemma"),
    "tiny-phi": _any("phi", qk_layernorm=True),
    "tiny-granite": _any("granite", attention_multiplier=0.5),
    "tiny-starcoder2": _any("starcoder2", sliding_window=WINDOW),
    "tiny-falcon": _any("falcon"),
    "tiny-cohere2": _any("cohere2"),
    "tiny-deepseek-v3": _any("deepseek_v3", first_k_dense_replace=1),
    "tiny-llama4-text": _any(
        "llama4_text", attention_chunk_size=WINDOW, no_rope_layer_interval=2, floor_scale=4, attn_scale=0.5
    ),
    "tiny-qwen3-5-text": _any("qwen3_5_text", full_attention_interval=2),
    "tiny-lfm2": _any("lfm2", full_attn_idxs=[1, 3]),
    "tiny-roberta": _any("roberta", style="bert"),
    "tiny-modernbert": _any("modernbert", style="bert", local_attention=WINDOW, global_attn_every_n_layers=2),
}
TINY.update(DISCOVERED)
TINY_BASES = tuple(TINY)


def tiny_spec(name: str) -> TinySpec:
    """The build recipe of a tiny base; UnknownNameError lists the choices."""
    if name not in TINY:
        raise UnknownNameError(f"unknown tiny base {name!r}; choose one of: {', '.join(TINY_BASES)}")
    return TINY[name]


def build_tiny(
    name: str, attn_implementation: str = "sdpa", seed: int = 0, overrides: dict[str, Any] | None = None
) -> tuple[torch.nn.Module, Any]:
    """A tiny random (model, tokenizer) pair, identical for the same name and seed (eager where sdpa is unsupported).

    ``overrides``: config attributes set after the config is built (tests switch a mechanism off with them)."""
    spec = tiny_spec(name)
    tok = tiny_tokenizer(spec.style)
    config = spec.config(tok)
    for key, value in (overrides or {}).items():
        setattr(config, key, value)
    model_cls = spec.model_cls or lm_model_class(config)
    if model_cls is None:
        raise UnknownNameError(f"tiny base {name!r}: transformers has no language-model class for it")
    if attn_implementation == "sdpa" and not getattr(model_cls, "_supports_sdpa", True):
        attn_implementation = "eager"  # what transformers itself picks for a family sdpa cannot serve (Gemma 2)
    config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    model.eval()
    return model, tok
