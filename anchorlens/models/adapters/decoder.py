"""One adapter for every decoder-only family; the families differ only in the data of a ``DecoderLayout``.

What a splice (inserted positions entering a block) must recompute, per family, is read from the
model and its config, never guessed:

- rotary cos/sin for the T+N positions, from the model's own rotary module (partial rotary in
  GPT-NeoX lives inside that module; Gemma 3 has one rotary per layer type: local and global);
- the attention mask for T+N positions: the padding/causal extension of ``Splice.mask``, then the
  sliding-window band (key index > query index - window) on the layers that slide (Mistral and
  Phi-3: every layer; Qwen2/3 and Gemma 2/3: the ``sliding_attention`` entries of
  ``config.layer_types``), exactly as ``transformers.masking_utils`` builds it for a T+N input;
- position ids (``Splice.positions``), shifted like a concatenated input's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from anchorlens.errors import UsageError
from anchorlens.models.adapters.base import ArchAdapter
from anchorlens.models.adapters.splice import Splice, like_mask, visible_of

SLIDING = "sliding_attention"


@dataclass(frozen=True)
class DecoderLayout:
    """Where a decoder-only family keeps things (attribute paths relative to the HF *ForCausalLM).

    family: the name anchorlens reports; model_types: HF ``config.model_type`` values;
    layers: path of the block list; attention: a block's self-attention attribute;
    rotary: path of the rotary module (None: positions added once at the input, as in GPT-2);
    rotary_by_layer_type: the rotary module takes the layer type (Gemma 3: local/global);
    block_args: the block forward's positional parameter names, in order;
    refuse: (config attribute, value, why) combinations anchorlens cannot mirror exactly.
    """

    family: str
    model_types: tuple[str, ...]
    layers: str = "model.layers"
    attention: str = "self_attn"
    rotary: str | None = "model.rotary_emb"
    rotary_by_layer_type: bool = False
    block_args: tuple[str, ...] = (
        "hidden_states",
        "attention_mask",
        "position_ids",
        "cache",
        "use_cache",
        "position_embeddings",
    )
    refuse: tuple[tuple[str, object, str], ...] = ()


def _path(obj: Any, dotted: str) -> Any:
    """``obj.a.b`` for ``dotted="a.b"``."""
    for name in dotted.split("."):
        obj = getattr(obj, name)
    return obj


def sliding_windows(config, num_layers: int) -> list[int | None]:
    """Per layer: the sliding window (keys with index > query index - window) or None for global attention.

    ``config.layer_types`` decides where a family has it (Qwen2/3, Gemma 2/3); otherwise
    ``config.sliding_window`` applies to every layer (Mistral, Phi-3) or is absent (Llama, GPT-2...).
    """
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is not None:
        return [window if types[i] == SLIDING else None for i in range(num_layers)]
    return [window] * num_layers


def window_band(mask: torch.Tensor, window: int) -> torch.Tensor:
    """A boolean mask [B, 1, Q, P+Q] (P leading prefix keys) restricted to key index > query index - window."""
    q_len, k_len = mask.shape[-2], mask.shape[-1]
    q = torch.arange(k_len - q_len, k_len, device=mask.device).view(q_len, 1)
    k = torch.arange(k_len, device=mask.device).view(1, k_len)
    return mask & (k > q - window)


class DecoderAdapter(ArchAdapter):
    """A decoder-only family (one ``decoder`` stack, causal self-attention) described by a ``DecoderLayout``."""

    stack_sequences = {"decoder": ("input", "input")}
    guidance_stacks = ("decoder",)
    supports_prefix = True

    def __init__(self, layout: DecoderLayout) -> None:
        self.layout = layout
        self.family = layout.family
        self.model_types = layout.model_types
        self.block_args = layout.block_args

    def check_config(self, config) -> None:
        """Refuse the layout's unmirrorable settings (one line naming the setting); ``config``: object or dict."""
        for attr, value, why in self.layout.refuse:
            setting = config.get(attr) if isinstance(config, Mapping) else getattr(config, attr, None)
            if setting == value:
                raise UsageError(
                    f"{self.family} with {attr}={value!r} ({why}) cannot be captured exactly; use a causal {self.family} model"
                )

    def blocks(self, model: torch.nn.Module, stack: str) -> list[torch.nn.Module]:
        """Decoder blocks at the layout's ``layers`` path."""
        return list(_path(model, self.layout.layers))

    def attention_module(self, block: torch.nn.Module, stack: str) -> torch.nn.Module:
        """The block's self-attention (the layout's ``attention`` attribute)."""
        return getattr(block, self.layout.attention)

    def kv_geometry(self, model: torch.nn.Module) -> tuple[int, int, int]:
        """(layers, key/value heads, head dim); grouped-query models have fewer kv heads."""
        cfg: Any = model.config
        heads = int(cfg.num_attention_heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        return len(self.blocks(model, "decoder")), int(getattr(cfg, "num_key_value_heads", None) or heads), head_dim

    def windows(self, model: torch.nn.Module) -> list[int | None]:
        """Per layer: sliding window or None (see ``sliding_windows``)."""
        config: Any = model.config
        return sliding_windows(config, len(self.blocks(model, "decoder")))

    def _layer_window(self, model: torch.nn.Module, layer: int | None) -> int | None:
        windows = self.windows(model)
        if layer is None:
            if len(set(windows)) > 1:
                raise TypeError(
                    f"{self.family} has sliding and global layers: splice_block_inputs needs the layer index"
                )
            return windows[0]
        return windows[layer]

    def _layer_type(self, model: torch.nn.Module, layer: int | None) -> str:
        if layer is None:
            raise TypeError(f"{self.family} has one rotary per layer type: splice_block_inputs needs the layer index")
        config: Any = model.config
        return str(config.layer_types[layer])

    def splice_block_inputs(self, model, stack, args, kwargs, hidden, splice: Splice, valid, memo, layer=None):
        """Extend mask and position ids, band the mask on sliding layers, recompute rotary cos/sin for T+N."""
        if self.layout.rotary is not None and kwargs.get("position_ids") is None:
            pos = torch.arange(splice.old_len, device=hidden.device).unsqueeze(0)
            kwargs = {**kwargs, "position_ids": pos}
        old_mask = self.get_arg(args, kwargs, "attention_mask")
        args, kwargs = super().splice_block_inputs(model, stack, args, kwargs, hidden, splice, valid, memo, layer)
        window = self._layer_window(model, layer)
        if window is not None:
            key = ("window", id(splice), id(old_mask), window)
            if key not in memo:
                memo[key] = (
                    old_mask,
                    self._window_mask(self.get_arg(args, kwargs, "attention_mask"), splice, valid, window),
                )
            args, kwargs = self.set_arg(args, kwargs, "attention_mask", memo[key][1])
        if self.layout.rotary is None:
            return args, kwargs
        layer_type = self._layer_type(model, layer) if self.layout.rotary_by_layer_type else None
        rope_key = ("rope", id(splice), layer_type)
        if rope_key not in memo:
            rotary = _path(model, self.layout.rotary)
            pos = kwargs["position_ids"]
            memo[rope_key] = rotary(hidden, pos) if layer_type is None else rotary(hidden, pos, layer_type)
        return self.set_arg(args, kwargs, "position_embeddings", memo[rope_key])

    def _window_mask(
        self, mask: torch.Tensor | None, splice: Splice, valid: torch.Tensor, window: int
    ) -> torch.Tensor | None:
        """The spliced mask [B, 1, T+N, P+T+N] with the sliding band; None stays None while T+N < window.

        None (no padding, no prefix) is plain causal attention: transformers leaves it None only
        while the input is shorter than the window, so once T+N reaches it the band must be explicit.
        """
        if mask is None:
            if splice.new_len < window:
                return None
            mask = torch.ones(splice.new_len, splice.new_len, dtype=torch.bool, device=valid.device).tril()
            mask = (mask & valid[:, None, :]).unsqueeze(1)
        return like_mask(window_band(visible_of(mask), window), mask)
