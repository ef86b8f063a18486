"""The decoder-only families anchorlens supports, as data: where each keeps its blocks, attention and rotary.

Adding a family whose mechanism is already covered (rotary or learned positions, causal masks,
sliding windows, per-layer-type rotary) is one ``DecoderLayout`` row here; a new mechanism is a
new adapter module.
"""

from __future__ import annotations

from anchorlens.models.adapters.decoder import DecoderLayout

_GPT2_ARGS = (
    "hidden_states",
    "cache",
    "attention_mask",
    "encoder_hidden_states",
    "encoder_attention_mask",
    "use_cache",
)
_NEOX_ARGS = ("hidden_states", "attention_mask", "position_ids", "use_cache", "layer_past", "position_embeddings")

DECODER_LAYOUTS: tuple[DecoderLayout, ...] = (
    DecoderLayout("llama", ("llama",)),
    DecoderLayout("qwen2", ("qwen2",)),
    DecoderLayout("qwen3", ("qwen3",)),
    DecoderLayout("mistral", ("mistral",)),
    DecoderLayout("gemma2", ("gemma2",)),
    DecoderLayout(
        "gemma3",
        ("gemma3_text",),
        rotary_by_layer_type=True,
        refuse=(("use_bidirectional_attention", True, "bidirectional attention, as in EmbeddingGemma"),),
    ),
    DecoderLayout("phi3", ("phi3",)),
    DecoderLayout("olmo2", ("olmo2",)),
    DecoderLayout(
        "gpt_neox",
        ("gpt_neox",),
        layers="gpt_neox.layers",
        attention="attention",
        rotary="gpt_neox.rotary_emb",
        block_args=_NEOX_ARGS,
    ),
    # GPT-2 adds learned absolute positions once, to the input embeddings: positions kept from the
    # input (soft prompts, instance tokens) get their slot's position embedding, per-layer inserted
    # positions (deep prompts, capsules) get none, and real tokens keep the ones they got at the input.
    DecoderLayout("gpt2", ("gpt2",), layers="transformer.h", attention="attn", rotary=None, block_args=_GPT2_ARGS),
)
