"""Adapter for T5 encoder-decoder models (relative position bias; three attention stacks)."""

from __future__ import annotations

from typing import Any

import torch

from anchorlens.errors import UsageError
from anchorlens.models.adapters.base import ArchAdapter
from anchorlens.models.adapters.discover import Discovered
from anchorlens.models.adapters.discovered import DiscoveredAdapter
from anchorlens.models.adapters.splice import Splice
from anchorlens.roles.encoding import Encoded


class T5Adapter(DiscoveredAdapter):
    """T5's discovered encoder, decoder and cross sites, with guidance in the encoder and decoder.

    The override exists because discovery cannot decide one thing: T5 computes its relative position bias in the
    first block of each stack and passes it to the others, so a splice must recompute it for T+N positions with
    ``compute_bias`` and hand later blocks the T-position bias again.
    """

    def __init__(self, found: Discovered) -> None:
        super().__init__(found)
        missing = {"encoder", "decoder", "cross"} - set(found.stacks)
        if missing:
            raise UsageError(
                f"{found.model_type}: no {', '.join(sorted(missing))} attention was found where T5 has one"
            )
        self.supports_guidance = True
        self.guidance_refusal = None
        self.supports_prefix = False
        self.prefix_refusal = "T5 takes no key-only prefix cache in anchorlens"
        self.guidance_stacks = ("encoder", "decoder")
        self.block_args = (
            "hidden_states",
            "attention_mask",
            "position_bias",
            "encoder_hidden_states",
            "encoder_attention_mask",
            "encoder_decoder_position_bias",
        )

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
        args, kwargs = ArchAdapter.splice_block_inputs(
            self, model, stack, args, kwargs, hidden, splice, valid, memo, layer
        )
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
