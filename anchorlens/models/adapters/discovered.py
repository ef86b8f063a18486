"""The adapter of a discovered model: sites, blocks, stacks and per-layer splicing read from its ``Discovered`` layout.

A splice (positions inserted into the sequence entering a block) extends every block argument by what it carries,
as the probe found it, never by the family's name:

- ``hidden``: the spliced hidden states;
- ``mask``: a 4D mask through ``Splice.mask`` (padding and causality), then the layer's sliding band (key index >
  query index - window) or attention chunks (equal (index - left padding) // chunk), exactly as
  ``transformers.masking_utils`` builds them for a T+N input; a 2D padding mask (linear-attention and convolution
  layers of hybrid models) becomes the spliced validity;
- ``positions``: ``Splice.positions`` (shifted as a concatenated input's);
- ``rotary``: recomputed for T+N by calling again, with the spliced position ids, the module whose output the
  block received in this forward (one per layer type in Gemma 3, complex frequencies in Llama 4, partial rotary
  inside the module in Phi or GPT-NeoX).

Anything else that depends on the sequence makes the layout refuse guidance (``guidance_refusal``). A mask that
carries more than visibility (one per head, or a position bias such as Falcon's ALiBi) cannot be extended: the
layout refuses positions inserted per layer (``layer_refusal``: no guidance stacks) and keeps input-level guidance,
for which the model builds its own mask.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from anchorlens.errors import UsageError
from anchorlens.models.adapters.base import ArchAdapter
from anchorlens.models.adapters.discover import CHUNKED, SLIDING, Discovered
from anchorlens.models.adapters.probe import mask_carries_bias
from anchorlens.models.adapters.site import Site
from anchorlens.models.adapters.splice import Splice, like_mask, visible_of
from anchorlens.roles.encoding import Encoded

_PRODUCER_CALLS = "producer_calls"


def window_band(mask: torch.Tensor, window: int) -> torch.Tensor:
    """A boolean mask [B, 1, Q, P+Q] (P leading prefix keys) restricted to key index > query index - window."""
    q_len, k_len = mask.shape[-2], mask.shape[-1]
    q = torch.arange(k_len - q_len, k_len, device=mask.device).view(q_len, 1)
    k = torch.arange(k_len, device=mask.device).view(1, k_len)
    return mask & (k > q - window)


def chunk_band(mask: torch.Tensor, valid: torch.Tensor, chunk: int) -> torch.Tensor:
    """A boolean mask [B, 1, Q, P+Q] restricted to keys in the query's chunk: equal (index - left padding) // chunk.

    valid: [B, P+Q] bool validity of every key (prefix included); left padding = invalid keys before the first
    valid one, as ``masking_utils.chunked_overlay`` counts it.
    """
    q_len, k_len = mask.shape[-2], mask.shape[-1]
    left = (valid.long().cumsum(-1) == 0).sum(-1).view(-1, 1, 1, 1)  # [B, 1, 1, 1]
    q = torch.arange(k_len - q_len, k_len, device=mask.device).view(1, 1, q_len, 1)
    k = torch.arange(k_len, device=mask.device).view(1, 1, 1, k_len)
    return mask & (
        torch.div(k - left, chunk, rounding_mode="floor") == torch.div(q - left, chunk, rounding_mode="floor")
    )


def _tensor_ids(value: Any) -> tuple[int, ...]:
    """id() of a tensor, or of each tensor of a tuple/list."""
    if isinstance(value, torch.Tensor):
        return (id(value),)
    if isinstance(value, tuple | list):
        return tuple(id(v) for v in value if isinstance(v, torch.Tensor))
    return ()


class DiscoveredAdapter(ArchAdapter):
    """An architecture adapter built from a discovered layout (any model whose attention runs through the interface)."""

    def __init__(self, found: Discovered) -> None:
        self.found = found
        self.family = found.model_type
        self.model_types = (found.model_type,)
        self.stack_sequences = {name: stack.sequences for name, stack in found.stacks.items()}
        decoder = found.stacks.get("decoder")
        self.causal = decoder is not None and decoder.causal and not found.is_encoder_decoder
        self.guidance_refusal = found.guidance_refusal
        self.supports_guidance = found.guidance_refusal is None
        self.supports_prefix = found.prefix_refusal is None
        self.prefix_refusal = found.prefix_refusal
        # positions inserted per layer: refused on their own when the blocks' masks carry a bias (input-level is exact)
        self.layer_guidance_refusal = found.layer_refusal
        self.guidance_stacks = ("decoder",) if self.supports_guidance and found.layer_refusal is None else ()
        first = self.block_stack(next(iter(found.stacks)))
        self.block_args = found.block_args[first].positional if first in found.block_args else ("hidden_states",)

    # ------------------------------------------------------------------ where things are
    def blocks(self, model: torch.nn.Module, stack: str) -> list[torch.nn.Module]:
        """The blocks of ``stack`` (for ``cross``: the decoder's)."""
        blocks: Any = model.get_submodule(self.found.stacks[stack].blocks)
        return list(blocks)

    def attention_module(self, block: torch.nn.Module, stack: str) -> torch.nn.Module:
        """The ``stack``'s attention module inside ``block`` (at the same path as in the stack's first site)."""
        sites = self.found.sites_of(stack)
        if not sites:
            raise UsageError(f"{self.family} has no {stack} attention")
        prefix = f"{self.found.stacks[stack].blocks}.{sites[0].layer}."
        return block.get_submodule(sites[0].path[len(prefix) :])

    def attention_sites(self, model: torch.nn.Module) -> list[tuple[Site, torch.nn.Module]]:
        """Every discovered (site, attention module) pair; layers without softmax attention have none."""
        return [(Site(s.stack, s.layer), model.get_submodule(s.path)) for s in self.found.sites]

    def stack_causal(self, stack: str) -> bool:
        """Whether ``stack``'s self-attention is causal (as its calls' masks showed)."""
        return self.found.stacks[stack].causal if stack in self.found.stacks else self.causal

    def kv_geometry(self, model: torch.nn.Module) -> tuple[int, int, int]:
        """(layers, key/value heads, key head dim) of the decoder, as its attention calls showed them."""
        if self.found.prefix_refusal is not None:
            raise UsageError(f"no key-only prefix on {self.family}: {self.found.prefix_refusal}")
        site = self.found.sites_of("decoder")[0]
        return self.found.stacks["decoder"].num_layers, site.kv_heads, site.key_dim

    # ------------------------------------------------------------------ running
    def model_inputs(self, batch: Encoded) -> dict[str, torch.Tensor]:
        """Keyword arguments of the HF forward; an encoder-decoder also gets the batch's target side."""
        inputs = super().model_inputs(batch)
        if not self.found.is_encoder_decoder:
            return inputs
        if batch.target_ids is None:
            raise UsageError(
                f"a {self.family} base needs decoder inputs: encode the batch with a target side (Base.encode adds one)"
            )
        return {**inputs, "decoder_input_ids": batch.target_ids, "decoder_attention_mask": batch.target_mask}  # type: ignore[dict-item]

    def forward(self, model: torch.nn.Module, batch: Encoded, **kwargs):
        """Run the HF model on ``batch`` without a cache (bidirectional encoders take no cache argument)."""
        if self.found.is_encoder_decoder:
            return model(**self.model_inputs(batch), use_cache=False, **kwargs)
        return super().forward(model, batch, **kwargs)

    # ------------------------------------------------------------------ guidance mechanics
    @contextmanager
    def forward_context(self, model: torch.nn.Module, memo: dict) -> Iterator[None]:
        """For one guided forward: remember how each rotary producer was called and what it returned, so that a
        splice can call it again for T+N positions."""
        paths = {p for args in self.found.block_args.values() for per in args.rotary.values() for p in per if p}
        calls: dict[int, tuple[torch.nn.Module, tuple, dict]] = memo.setdefault(_PRODUCER_CALLS, {})
        handles = []

        def record(module, args, kwargs, output):
            for i in _tensor_ids(output):
                calls[i] = (module, args, kwargs, output)

        for path in paths:
            handles.append(model.get_submodule(path).register_forward_hook(record, with_kwargs=True))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def splice_block_inputs(self, model, stack, args, kwargs, hidden, splice: Splice, valid, memo, layer=None):
        """Extend every block argument by its discovered role (see the module docstring)."""
        if layer is None:
            raise TypeError(f"{self.family}: splice_block_inputs needs the layer index")
        if self.guidance_refusal is not None:
            raise UsageError(f"no inserted positions on {self.family}: {self.guidance_refusal}")
        if self.layer_guidance_refusal is not None:
            raise UsageError(f"no positions inserted per layer on {self.family}: {self.layer_guidance_refusal}")
        roles = self.found.block_args[self.block_stack(stack)].roles
        for name, role in roles.items():
            if role == "hidden":
                args, kwargs = self.set_arg(args, kwargs, name, hidden)
                continue
            value = self.get_arg(args, kwargs, name)
            if role == "mask":
                new = self._mask(value, stack, layer, splice, valid, memo)
                if new is not None or value is not None:
                    args, kwargs = self.set_arg(args, kwargs, name, new)
            elif role == "positions" and value is not None:
                key = ("pos", id(splice), id(value))
                if key not in memo:
                    memo[key] = (value, splice.positions(value))
                args, kwargs = self.set_arg(args, kwargs, name, memo[key][1])
            elif role == "rotary" and value is not None:
                args, kwargs = self.set_arg(args, kwargs, name, self._rotary(value, hidden, splice, memo))
            elif role == "sequence" and value is not None:
                raise UsageError(
                    f"no inserted positions on {self.family}: its blocks take {name}, which depends on the sequence"
                )
        return args, kwargs

    def _mask(self, mask, stack: str, layer: int, splice: Splice, valid: torch.Tensor, memo: dict):
        """The block's mask for the spliced sequence (None stays None where transformers would also pass none)."""
        attention = self.found.layer_kinds[self.block_stack(stack)][layer] == "attention"
        if mask is not None and mask.dim() == 2:  # a recurrent layer's padding mask [B, T]
            return valid.to(mask.dtype)
        if not attention:
            return mask if mask is None else splice.mask(mask, self.stack_causal(stack), valid)
        kind, size = self.found.masks[self.block_stack(stack)][layer]
        key = ("mask", stack, id(splice), id(mask), kind, size)
        if key not in memo:
            memo[key] = (mask, self._banded(mask, stack, splice, valid, kind, size))
        return memo[key][1]

    def _banded(self, mask, stack: str, splice: Splice, valid: torch.Tensor, kind: str, size: int | None):
        """Splice.mask's extension of ``mask``, then the layer's band; an absent mask is built once T+N needs one.

        A sliding band only narrows as positions are inserted (the old window is kept within the new one), so it
        is applied to the extension. Chunk boundaries move instead: a chunked layer's mask is rebuilt from
        causality, padding and the new chunks (prefix keys stay visible), as transformers builds it for T+N.
        """
        if mask is not None and mask.dim() == 4 and (mask.shape[1] != 1 or mask_carries_bias(mask)):
            raise UsageError(
                f"no positions inserted per layer on {self.family}: its attention mask carries more than visibility "
                f"(shape {list(mask.shape)}: one mask per head or a position bias such as ALiBi), which anchorlens "
                "cannot extend; use input-level guidance (instance, soft prompt) on it"
            )
        if mask is None:
            needs = (kind == SLIDING and size is not None and splice.new_len >= size) or (
                kind == CHUNKED and size is not None and splice.new_len > size
            )
            if not needs:
                return None
        if mask is None or kind == CHUNKED:
            prefix = 0 if mask is None else mask.shape[-1] - mask.shape[-2]
            n = splice.new_len
            causal = torch.ones(n, n + prefix, dtype=torch.bool, device=valid.device).tril(prefix)
            keys = torch.cat(
                [torch.ones(valid.shape[0], prefix, dtype=torch.bool, device=valid.device), valid.bool()], 1
            )
            built = (causal & keys[:, None, :]).unsqueeze(1)
            template = built if mask is None else mask
            if kind == CHUNKED and size is not None:
                built = chunk_band(built, keys, size)
            return (
                like_mask(window_band(built, size), template)
                if kind == SLIDING and size
                else like_mask(built, template)
            )
        mask = splice.mask(mask, self.stack_causal(stack), valid)
        if kind == SLIDING and size is not None:
            return like_mask(window_band(visible_of(mask), size), mask)
        return mask

    def _rotary(self, value, hidden: torch.Tensor, splice: Splice, memo: dict):
        """The position embeddings for T+N positions: the producer that made ``value`` called again with spliced ids."""
        calls = memo.get(_PRODUCER_CALLS, {})
        found = next((calls[i] for i in _tensor_ids(value) if i in calls), None)
        if found is None:
            raise UsageError(
                f"no inserted positions on {self.family}: its blocks' position embeddings do not come from a module "
                "anchorlens can call again for a longer sequence"
            )
        module, args, kwargs, _ = found
        key = ("rope", id(module), id(splice), _tensor_ids(value))
        if key in memo:
            return memo[key][1]
        old = splice.old_len

        def respliced(a):
            if isinstance(a, torch.Tensor) and not a.is_floating_point() and a.dim() in (1, 2) and a.shape[-1] == old:
                return splice.positions(a.view(-1, old))  # position ids [B|1, T] -> [B, T+N]
            if isinstance(a, torch.Tensor) and not a.is_floating_point() and a.dim() == 3 and a.shape[-1] == old:
                return torch.stack([splice.positions(part) for part in a])  # multi-axis ids [A, B|1, T] (M-RoPE)
            if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dim() >= 2 and a.shape[1] == old:
                return hidden
            return a

        new_args = tuple(respliced(a) for a in args)
        new_kwargs = {k: respliced(v) for k, v in kwargs.items()}
        if all(a is b for a, b in zip(new_args, args)) and all(new_kwargs[k] is kwargs[k] for k in kwargs):
            raise UsageError(
                f"no inserted positions on {self.family}: its rotary module is called without position ids"
            )
        out = module(*new_args, **new_kwargs)
        memo[key] = (value, out)
        return out
