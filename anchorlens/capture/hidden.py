"""Block outputs during a capture: the residual stream of the selected layers, from the same forward.

A sink that wants hidden states (``wants_hidden`` true, e.g. a :class:`~anchorlens.capture.sinks.StreamSink` with
a reducer that defines ``update_hidden``) gets one :class:`~anchorlens.capture.event.HiddenEvent` per selected
block and batch through ``consume_hidden``: a forward hook on each block hands over the block's output as the
next block receives it. No second forward, no ``output_hidden_states`` (which would keep every layer at once).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from anchorlens.capture.event import HiddenEvent
from anchorlens.capture.session import CaptureSession
from anchorlens.roles.layout import LayoutProvider, SequenceRoles


def wants_hidden(sink: Any) -> bool:
    """Whether ``sink`` asks for block outputs (its ``wants_hidden`` is true and it has ``consume_hidden``)."""
    return bool(getattr(sink, "wants_hidden", False)) and callable(getattr(sink, "consume_hidden", None))


def flowing_roles(provider: LayoutProvider, adapter: Any, stack: str, layer: int, length: int) -> SequenceRoles | None:
    """Roles of the ``length`` positions leaving block ``layer`` of ``stack``: the layout's queries when they are as
    many; else (a guidance inserted positions for this block only and removed them again) the kept sequence the
    provider carries (a guided layout's plan); None when neither fits."""
    q = provider.layout(stack, layer).q
    if q.roles.shape[1] == length:
        return q
    sequences = getattr(getattr(provider, "plan", None), "sequences", None) or getattr(provider, "sequences", None)
    name = adapter.stack_sequences[stack][0]
    if isinstance(sequences, dict) and name in sequences and sequences[name].roles.shape[1] == length:
        kept: SequenceRoles = sequences[name]
        return SequenceRoles(kept.roles, kept.valid, q.table)
    return None


@contextmanager
def block_output_hooks(target: Any, session: CaptureSession) -> Iterator[None]:
    """Hook the blocks of the session's selected self-attention sites while the block runs (nothing when the sink
    wants no hidden states); the hooks are removed afterwards, even on error."""
    sink = session.sink
    if not wants_hidden(sink):
        yield
        return
    adapter, model = target.adapter, target.model
    handles = []
    try:
        for site in session.selected_sites:
            if adapter.block_stack(site.stack) != site.stack:  # cross-attention lives in the decoder's blocks
                continue
            block = adapter.blocks(model, site.stack)[site.layer]
            handles.append(block.register_forward_hook(_hook(adapter, session, site.stack, site.layer)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _hook(adapter: Any, session: CaptureSession, stack: str, layer: int):
    """The forward hook of one block: its output hidden states to the sink."""

    def hook(module: torch.nn.Module, args: tuple, output: Any) -> None:
        hidden = adapter.block_output_hidden(output)
        roles = flowing_roles(session.layout, adapter, stack, layer, hidden.shape[1])
        if roles is None:
            return
        session.sink.consume_hidden(HiddenEvent(stack, layer, hidden.detach(), roles, session.example_ids))  # type: ignore[attr-defined]

    return hook
