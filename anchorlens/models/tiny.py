"""Tiny random bases built from transformers' own config classes with a fixed seed, for offline tests.

One base per supported family (``tiny-<family>``). Sliding-window families get a window of 8,
smaller than the test inputs, so the window matters; Gemma gets a soft-cap and a
``query_pre_attn_scalar`` different from the head dim, so both change the attention.
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
from anchorlens.models.tiny_tokenizers import tiny_tokenizer

WINDOW = 8  # sliding window of the tiny sliding-window families: smaller than any test input


@dataclass(frozen=True)
class TinySpec:
    """How to build one tiny base: tokenizer style, model class, and its config from the tokenizer."""

    style: str
    model_cls: type
    config: Callable[[Any], Any]


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
TINY_BASES = tuple(TINY)


def tiny_spec(name: str) -> TinySpec:
    """The build recipe of a tiny base; UnknownNameError lists the choices."""
    if name not in TINY:
        raise UnknownNameError(f"unknown tiny base {name!r}; choose one of: {', '.join(TINY_BASES)}")
    return TINY[name]


def build_tiny(name: str, attn_implementation: str = "sdpa", seed: int = 0) -> tuple[torch.nn.Module, Any]:
    """A tiny random (model, tokenizer) pair, identical for the same name and seed (eager where sdpa is unsupported)."""
    spec = tiny_spec(name)
    tok = tiny_tokenizer(spec.style)
    config = spec.config(tok)
    if attn_implementation == "sdpa" and not getattr(spec.model_cls, "_supports_sdpa", True):
        attn_implementation = "eager"  # what transformers itself picks for a family sdpa cannot serve (Gemma 2)
    config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = spec.model_cls(config)
    model.eval()
    return model, tok
