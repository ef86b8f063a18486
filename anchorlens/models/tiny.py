"""Tiny random bases built from configs with a fixed seed, for offline tests."""
from __future__ import annotations

import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

from anchorlens.models.tiny_tokenizers import tiny_tokenizer

TINY_BASES = ("tiny-llama", "tiny-qwen2", "tiny-gpt2", "tiny-bert", "tiny-t5")


def _config(name: str, tok) -> tuple[type, object]:
    vocab = len(tok)
    common = dict(vocab_size=vocab, pad_token_id=tok.pad_token_id)
    if name == "tiny-llama":
        return LlamaForCausalLM, LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=512, bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id, **common,
        )
    if name == "tiny-qwen2":
        return Qwen2ForCausalLM, Qwen2Config(
            hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, **common,
        )
    if name == "tiny-gpt2":
        return GPT2LMHeadModel, GPT2Config(
            n_embd=64, n_layer=4, n_head=4, n_positions=512, bos_token_id=tok.eos_token_id,
            eos_token_id=tok.eos_token_id, **common,
        )
    if name == "tiny-bert":
        return BertForMaskedLM, BertConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            max_position_embeddings=512, **common,
        )
    if name == "tiny-t5":
        return T5ForConditionalGeneration, T5Config(
            d_model=64, d_kv=16, d_ff=128, num_layers=3, num_decoder_layers=3, num_heads=4,
            relative_attention_num_buckets=8, decoder_start_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id, **common,
        )
    raise ValueError(f"unknown tiny base {name!r}; choose one of: {', '.join(TINY_BASES)}")


def build_tiny(name: str, attn_implementation: str = "sdpa", seed: int = 0) -> tuple[torch.nn.Module, object]:
    """A tiny random (model, tokenizer) pair, identical for the same name and seed."""
    style = name.removeprefix("tiny-").replace("qwen2", "llama")
    tok = tiny_tokenizer(style)
    model_cls, config = _config(name, tok)
    config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    model.eval()
    return model, tok
