"""Adapter for T5 encoder-decoder models (relative position bias; three attention stacks)."""

from __future__ import annotations

from typing import Any

import torch

from anchorlens.errors import UsageError
from anchorlens.models.adapters.base import ArchAdapter
from anchorlens.models.adapters.splice import Splice
from anchorlens.roles.encoding import Encoded


class T5Adapter(ArchAdapter):
    """Encoder self-attention, decoder self-attention and decoder cross-attention."""

    family = "t5"
    model_types = ("t5", "mt5")
    stack_sequences = {
        "encoder": ("input", "input"),
        "decoder": ("target", "target"),
        "cross": ("target", "input"),
    }
    causal = False
    guidance_stacks = ("encoder", "decoder")
    block_args = (
        "hidden_states",
        "attention_mask",
        "position_bias",
        "encoder_hidden_states",
        "encoder_attention_mask",
        "encoder_decoder_position_bias",
    )

    def blocks(self, model: torch.nn.Module, stack: str) -> list[torch.nn.Module]:
        """Encoder blocks for ``encoder``; decoder blocks for ``decoder`` and ``cross``."""
        t5: Any = model
        side = t5.encoder if stack == "encoder" else t5.decoder
        return list(side.block)

    def attention_module(self, block: torch.nn.Module, stack: str) -> torch.nn.Module:
        """``layer[0].SelfAttention`` or, for ``cross``, ``layer[1].EncDecAttention``."""
        t5_block: Any = block
        if stack == "cross":
            return t5_block.layer[1].EncDecAttention
        return t5_block.layer[0].SelfAttention

    def model_inputs(self, batch: Encoded) -> dict[str, torch.Tensor]:
        """Encoder inputs plus decoder inputs (the batch's target side)."""
        if batch.target_ids is None:
            raise UsageError(
                "a T5 base needs decoder inputs: encode the batch with a target side (Base.encode adds one)"
            )
        return {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "decoder_input_ids": batch.target_ids,
            "decoder_attention_mask": batch.target_mask,  # type: ignore[dict-item]
        }

    def forward(self, model: torch.nn.Module, batch: Encoded, **kwargs):
        """Run encoder and decoder without a cache."""
        return model(**self.model_inputs(batch), use_cache=False, **kwargs)

    def stack_causal(self, stack: str) -> bool:
        """The decoder's self-attention is causal; the encoder's is not."""
        return stack == "decoder"

    def forward_embeds(self, model, batch: Encoded, inputs_embeds, attention_mask, cache=None, **kwargs):
        """Encoder from embeddings [B, T', d] and mask [B, T']; decoder from the batch's target ids."""
        if cache is not None:
            raise UsageError(
                "T5 takes no key-only prefix cache in anchorlens: use prefix tuning on a decoder-only base"
            )
        if batch.target_ids is None:
            raise UsageError(
                "a T5 base needs decoder inputs: encode the batch with a target side (Base.encode adds one)"
            )
        return model(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            decoder_input_ids=batch.target_ids,
            decoder_attention_mask=batch.target_mask,
            use_cache=False,
            **kwargs,
        )

    def _bias(self, model, stack: str, length: int, device, memo: dict) -> torch.Tensor:
        """Relative position bias [1, H, L, L] of ``stack`` for ``length`` positions (block 0's table)."""
        key = ("t5bias", stack, length)
        if key not in memo:
            attn: Any = self.attention_module(self.blocks(model, stack)[0], stack)
            memo[key] = attn.compute_bias(length, length, device=device)
        return memo[key]

    def splice_block_inputs(self, model, stack, args, kwargs, hidden, splice: Splice, valid, memo, layer=None):
        """Also recompute the relative position bias for T+N and extend cross-attention rows."""
        args, kwargs = super().splice_block_inputs(model, stack, args, kwargs, hidden, splice, valid, memo, layer)
        bias = self._bias(model, stack, splice.new_len, hidden.device, memo)
        args, kwargs = self.set_arg(args, kwargs, "position_bias", bias)
        for name in ("encoder_attention_mask", "encoder_decoder_position_bias"):
            value = self.get_arg(args, kwargs, name)
            if value is not None:
                args, kwargs = self.set_arg(args, kwargs, name, splice.rows(value))
        return args, kwargs

    def strip_block_output(self, model, stack, output, hidden, splice: Splice, memo):
        """Return the T-position bias and cross-attention bias so later blocks see unspliced shapes."""
        _, _, cross_bias = output
        bias = self._bias(model, stack, splice.old_len, hidden.device, memo)
        if cross_bias is not None:
            cross_bias = splice.unrows(cross_bias)
        return hidden, bias, cross_bias
