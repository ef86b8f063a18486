"""The architecture adapter: the one place that knows where an architecture keeps things."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from anchorlens.models.adapters.site import Site
from anchorlens.models.adapters.splice import Splice
from anchorlens.roles.encoding import Encoded


class ArchAdapter:
    """Knows an architecture's attention sites, blocks, embeddings and how to run it on a batch.

    Subclasses (or instances built from a discovered layout, see ``discovered.DiscoveredAdapter``) set
    ``family``, ``model_types`` and ``stack_sequences`` (each stack's query and key sequence names, ``input``
    or ``target``) and implement ``blocks``/``attention_module``.
    """

    family: str = ""
    model_types: tuple[str, ...] = ()
    stack_sequences: dict[str, tuple[str, str]] = {}
    causal: bool = True
    # Guidance (inserted positions). ``guidance_stacks``: self-attention stacks whose blocks accept
    # per-layer inserted positions; ``block_args``: the block forward's positional parameter names.
    supports_guidance: bool = True
    guidance_refusal: str | None = None  # why positions cannot be inserted (when supports_guidance is False)
    supports_prefix: bool = False
    prefix_refusal: str | None = None  # why no key-only prefix (when supports_prefix is False)
    guidance_stacks: tuple[str, ...] = ()
    block_args: tuple[str, ...] = ("hidden_states",)

    def check_config(self, config) -> None:
        """Refuse (UsageError, one line) a configuration (object or config.json dict) anchorlens cannot mirror exactly."""

    def blocks(self, model: torch.nn.Module, stack: str) -> list[torch.nn.Module]:
        """The transformer blocks of ``stack``, in order (for ``cross``: the decoder blocks)."""
        raise NotImplementedError

    def attention_module(self, block: torch.nn.Module, stack: str) -> torch.nn.Module:
        """The attention module of one block that receives the ``stack``'s attention call."""
        raise NotImplementedError

    def embeddings(self, model: torch.nn.Module) -> torch.nn.Module:
        """The input token embedding module."""
        embeddings: torch.nn.Module = model.get_input_embeddings()  # type: ignore[operator]
        return embeddings

    def stacks(self) -> tuple[str, ...]:
        """Names of this architecture's attention stacks."""
        return tuple(self.stack_sequences)

    def attention_sites(self, model: torch.nn.Module) -> list[tuple[Site, torch.nn.Module]]:
        """Every (site, attention module) pair of the model."""
        out = []
        for stack in self.stacks():
            for layer, block in enumerate(self.blocks(model, stack)):
                out.append((Site(stack, layer), self.attention_module(block, stack)))
        return out

    def num_layers(self, model: torch.nn.Module, stack: str | None = None) -> int:
        """Number of blocks in ``stack`` (default: the first stack)."""
        return len(self.blocks(model, stack or self.stacks()[0]))

    def model_inputs(self, batch: Encoded) -> dict[str, torch.Tensor]:
        """Keyword arguments of the HF forward for ``batch``."""
        return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}

    def forward(self, model: torch.nn.Module, batch: Encoded, **kwargs):
        """Run the HF model on ``batch`` without a cache."""
        return (
            model(**self.model_inputs(batch), use_cache=False, **kwargs)
            if self.causal
            else model(**self.model_inputs(batch), **kwargs)
        )

    # ------------------------------------------------------------------ guidance mechanics
    @contextmanager
    def forward_context(self, model: torch.nn.Module, memo: dict) -> Iterator[None]:
        """Hooks a guided forward needs beside the block hooks (none here); ``memo``: the forward's shared cache."""
        yield

    def block_stack(self, stack: str) -> str:
        """The stack whose blocks host ``stack``'s attention (``cross`` lives in decoder blocks)."""
        return "decoder" if stack == "cross" else stack

    def stack_causal(self, stack: str) -> bool:
        """Whether self-attention in ``stack`` is causal."""
        return self.causal

    def token_embeddings(self, model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """[B, T] ids -> [B, T, d] input token embeddings (before any position embedding)."""
        return self.embeddings(model)(ids)

    def forward_embeds(
        self,
        model: torch.nn.Module,
        batch: Encoded,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        cache=None,
        **kwargs,
    ):
        """Run the model from input embeddings [B, T', d] and their 2D mask [B, P+T'] (P: cache length)."""
        if cache is not None:
            return model(
                inputs_embeds=inputs_embeds, attention_mask=attention_mask, cache=cache, use_cache=True, **kwargs
            )
        return model(inputs_embeds=inputs_embeds, attention_mask=attention_mask, use_cache=False, **kwargs)

    def kv_geometry(self, model: torch.nn.Module) -> tuple[int, int, int]:
        """(layers, key/value heads, head dim) of the self-attention stack, for key-only prefixes."""
        raise NotImplementedError(f"{self.family} has no key-only prefix support")

    def get_arg(self, args: tuple, kwargs: dict, name: str):
        """A block argument by name, wherever the caller put it (positionally or by keyword)."""
        i = self.block_args.index(name) if name in self.block_args else len(args)
        return args[i] if i < len(args) else kwargs.get(name)

    def set_arg(self, args: tuple, kwargs: dict, name: str, value) -> tuple[tuple, dict]:
        """Replace a block argument where the caller put it (keyword if it was absent)."""
        i = self.block_args.index(name) if name in self.block_args else len(args)
        if i < len(args):
            args = args[:i] + (value,) + args[i + 1 :]
        else:
            kwargs = {**kwargs, name: value}
        return args, kwargs

    def has_arg(self, args: tuple, kwargs: dict, name: str) -> bool:
        """Whether the caller passed ``name``."""
        i = self.block_args.index(name) if name in self.block_args else len(args)
        return i < len(args) or name in kwargs

    def block_hidden(self, args: tuple, kwargs: dict) -> torch.Tensor:
        """Hidden states [B, T, d] entering a block."""
        return self.get_arg(args, kwargs, "hidden_states")

    def splice_block_inputs(
        self,
        model: torch.nn.Module,
        stack: str,
        args: tuple,
        kwargs: dict,
        hidden: torch.Tensor,
        splice: Splice,
        valid: torch.Tensor,
        memo: dict,
        layer: int | None = None,
    ) -> tuple[tuple, dict]:
        """Block arguments for the spliced hidden states [B, T+N, d]: mask and position ids extended.

        valid: [B, T+N] bool validity of the spliced sequence; memo: per-forward cache shared by
        all layers (the same splice recurs at every layer); layer: the block's index in ``stack``
        (families whose blocks differ per layer, e.g. sliding/global attention, need it).
        """
        args, kwargs = self.set_arg(args, kwargs, "hidden_states", hidden)
        mask = self.get_arg(args, kwargs, "attention_mask")
        if mask is not None:
            mask_key = ("mask", stack, id(splice), id(mask))
            if mask_key not in memo:
                memo[mask_key] = (mask, splice.mask(mask, self.stack_causal(stack), valid))
            args, kwargs = self.set_arg(args, kwargs, "attention_mask", memo[mask_key][1])
        pos = kwargs.get("position_ids")
        if pos is not None:
            pos_key = ("pos", stack, id(splice))
            if pos_key not in memo:
                memo[pos_key] = splice.positions(pos)
            kwargs = {**kwargs, "position_ids": memo[pos_key]}
        return args, kwargs

    def block_output_hidden(self, output) -> torch.Tensor:
        """Hidden states [B, T+N, d] a block returned."""
        return output[0] if isinstance(output, tuple) else output

    def strip_block_output(
        self, model: torch.nn.Module, stack: str, output, hidden: torch.Tensor, splice: Splice, memo: dict
    ):
        """The block's output with the stripped hidden states [B, T, d] in place of the spliced ones."""
        if isinstance(output, tuple):
            return (hidden, *output[1:])
        return hidden
