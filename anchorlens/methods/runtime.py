"""Per-forward hooks that splice layer-level guidance positions in and out of every block."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from anchorlens.methods.base import LayerPositions
from anchorlens.methods.plan import Plan, Spliced
from anchorlens.roles.kinds import GUIDANCE_ROLES


def input_tokens(roles: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: positions whose role is an input role (the built-in special, structural, content and every
    role a task adds), not guidance (guidance roles have the same ids in every run's table)."""
    mask = torch.ones_like(roles, dtype=torch.bool)
    for role in GUIDANCE_ROLES:
        mask &= roles != int(role)
    return mask


class LayerSplicer:
    """Installs, for one forward, a pre-hook (insert) and a post-hook (remove) on each guided block."""

    def __init__(self, base, plan: Plan) -> None:
        self.base = base
        self.plan = plan
        self.memo: dict = {}

    @contextmanager
    def installed(self) -> Iterator[LayerSplicer]:
        """Hooks active for the duration of the block; removed afterwards even on error."""
        handles = []
        adapter, model = self.base.adapter, self.base.model
        try:
            for stack, per_layer in self.plan.layers.items():
                for layer, block in enumerate(adapter.blocks(model, stack)):
                    spliced = per_layer[layer]
                    if spliced is None:
                        continue
                    handles.append(block.register_forward_pre_hook(self._pre(stack, layer, spliced), with_kwargs=True))
                    handles.append(
                        block.register_forward_hook(self._post(stack, layer, spliced), with_kwargs=True, prepend=True)
                    )
            with adapter.forward_context(model, self.memo):
                yield self
        finally:
            for h in handles:
                h.remove()
            self.memo.clear()

    def _kept(self, stack: str) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, T] validity and input-token mask of the kept sequence flowing through ``stack``."""
        seq = self.plan.sequences[self.base.adapter.stack_sequences[stack][0]]
        valid = seq.valid.bool()
        return valid, valid & input_tokens(seq.roles)

    def _pre(self, stack: str, layer: int, spliced: Spliced):
        adapter, model = self.base.adapter, self.base.model

        def hook(module, args, kwargs):
            hidden = adapter.block_hidden(args, kwargs)
            valid, tokens = (m.to(hidden.device) for m in self._kept(stack))
            vectors = [
                g.layer_vectors(stack, layer, hidden, valid, tokens).to(hidden.dtype) for g, _, _ in spliced.owners
            ]
            new_hidden = spliced.splice.apply(hidden, torch.cat(vectors, dim=1))
            return adapter.splice_block_inputs(
                model,
                stack,
                args,
                kwargs,
                new_hidden,
                spliced.splice,
                spliced.roles.valid.to(hidden.device),
                self.memo,
                layer=layer,
            )

        return hook

    def _post(self, stack: str, layer: int, spliced: Spliced):
        adapter, model = self.base.adapter, self.base.model

        def hook(module, args, kwargs, output):
            hidden = adapter.block_output_hidden(output)
            valid = spliced.roles.valid.to(hidden.device).bool()
            inserted = spliced.splice.inserted.to(hidden.device)
            tokens = valid & ~inserted & input_tokens(spliced.roles.roles.to(hidden.device))
            for g, start, end in spliced.owners:
                g.after_layer(stack, layer, hidden, LayerPositions(valid, inserted, tokens, spliced.own(start, end)))
            return adapter.strip_block_output(
                model, stack, output, spliced.splice.remove(hidden), spliced.splice, self.memo
            )

        return hook
