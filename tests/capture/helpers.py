"""Test helpers: a sink that keeps every event, and eager references."""

from __future__ import annotations

from dataclasses import replace

import torch

from anchorlens.capture.certificate import eager_reference


class Collect:
    """Sink that keeps every event (tests only: holds all maps)."""

    def __init__(self) -> None:
        self.events: list = []

    def consume(self, event) -> None:
        # probs and logits live in buffers the capture reuses for the next call: keep copies
        scores = None if event.scores is None else event.scores.clone()
        self.events.append(replace(event, probs=event.probs.clone(), scores=scores, cache={}))


def eager_attentions(base, batch) -> dict:
    """Reference attentions from HF eager ``output_attentions``: per stack, layer -> [B,H,Q,K] (the certificate's
    reference, keyed by the discovered layers of the sites: hybrid models have layers without softmax)."""
    return eager_reference(base, batch)


def plain_logits(base, batch) -> torch.Tensor:
    """Logits of the model's plain forward, no anchorlens function at all: sdpa, or eager for a family
    sdpa cannot serve (Gemma 2's soft-capping), as transformers itself chooses."""
    model = base.model
    before = model.config._attn_implementation
    plain = "sdpa" if getattr(type(model), "_supports_sdpa", True) else "eager"
    model.set_attn_implementation(plain)
    try:
        with torch.no_grad():
            return base.forward(batch).logits
    finally:
        model.set_attn_implementation(before)


sdpa_logits = plain_logits  # the name the real-model tests use
