"""Run a model on encoded batches with capture active."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from anchorlens.capture.hidden import block_output_hooks
from anchorlens.capture.options import CaptureOptions
from anchorlens.capture.selection import Selection, Site
from anchorlens.capture.session import CaptureSession, Sink, activate
from anchorlens.engine.attention import install
from anchorlens.models.base import skip_lm_head
from anchorlens.roles.encoding import Encoded
from anchorlens.roles.layout import LayoutProvider
from anchorlens.roles.scheme import RoleScheme
from anchorlens.roles.templates import Rendered


class CaptureTarget(Protocol):
    """What capture runs (a GuidedModel): its model, adapter, tokenization, attention sites, layouts and forward."""

    @property
    def device(self) -> torch.device:
        """Device batches go to."""
        ...

    @property
    def model(self) -> torch.nn.Module:
        """The HF model whose attention calls are captured."""
        ...

    @property
    def adapter(self) -> Any:
        """The architecture adapter (stack names and their query/key sequences)."""
        ...

    @property
    def context_length(self) -> int | None:
        """Longest input the base's positions allow (None: relative positions)."""
        ...

    def encode(
        self,
        rendered: Sequence[Rendered],
        example_ids: Sequence[int] | None = None,
        max_length: int | None = None,
        scheme: RoleScheme = ...,
    ) -> Encoded:
        """Tokenize rendered examples with roles (``scheme``: the run's roles and token rules)."""
        ...

    def sites(self) -> list[tuple[Site, torch.nn.Module]]:
        """Every (site, attention module) pair."""
        ...

    def layout(self, batch: Encoded) -> LayoutProvider:
        """Roles of queries and keys at every site for this batch."""
        ...

    def forward(self, batch: Encoded, **kwargs):
        """Run the model on the batch."""
        ...


def num_heads(model: torch.nn.Module) -> int | None:
    """Attention heads per layer from the model's (text) config, or None when it does not say."""
    config: Any = getattr(model, "config", None)
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    value = getattr(config, "num_attention_heads", None)
    return int(value) if isinstance(value, int) else None


def stack_layers(target: CaptureTarget) -> tuple[dict[str, int], dict[str, set[int]]]:
    """(layers per stack, the layers with softmax attention per stack): hybrid models have blocks without it."""
    attention: dict[str, set[int]] = {}
    for site, _ in target.sites():
        attention.setdefault(site.stack, set()).add(site.layer)
    layers = {stack: target.adapter.num_layers(target.model, stack) for stack in attention}
    return layers, attention


def check_selection(target: CaptureTarget, selection: Selection) -> None:
    """Raise UsageError (one line, the valid range) when ``selection`` names stacks/layers/heads ``target`` lacks,
    or only layers without softmax attention.

    Call it where a selection enters (before creating output or loading data); every capture also checks.
    """
    layers, attention = stack_layers(target)
    selection.validate(layers, num_heads(target.model), attention)


def capture_batch(
    target: CaptureTarget,
    batch: Encoded,
    sink: Sink,
    selection: Selection = Selection(),
    need_logits: bool = True,
    options: CaptureOptions = CaptureOptions(),
    scratch: dict | None = None,
):
    """Forward one batch with capture active; returns the model's outputs.

    ``need_logits=False`` (statistics-only runs) skips the full-vocabulary logits of every
    position where the model allows it; attention is unaffected. ``options`` choose the output mode
    (``auto``: fast without logits, strict with) and the recompute's memory budget. A selection the
    model does not have raises UsageError before the forward. ``scratch``: a dict the calls for one stream of
    batches share, so the recompute's buffers are allocated once (see :class:`CaptureSession`).
    """
    batch = batch.to(target.device)
    session = CaptureSession(
        target.sites(),
        sink,
        target.layout(batch),
        batch.example_ids,
        selection,
        options.resolved(need_logits),
        num_heads(target.model),
        scratch,
        stack_layers(target)[0],
    )
    install(target.model)
    kwargs = {} if need_logits else skip_lm_head(target.model)
    if hasattr(sink, "begin_batch"):
        sink.begin_batch(batch)
    with activate(session), torch.no_grad(), block_output_hooks(target, session):
        return target.forward(batch, **kwargs)
