"""Test helpers: a sink that keeps every event, and eager references."""

from __future__ import annotations

from dataclasses import replace

import torch


class Collect:
    """Sink that keeps every event (tests only: holds all maps)."""

    def __init__(self) -> None:
        self.events: list = []

    def consume(self, event) -> None:
        # probs and logits live in buffers the capture reuses for the next call: keep copies
        scores = None if event.scores is None else event.scores.clone()
        self.events.append(replace(event, probs=event.probs.clone(), scores=scores, cache={}))


def eager_attentions(base, batch) -> dict:
    """Reference attentions from HF eager ``output_attentions``: per stack, layer -> [B,H,Q,K].

    Eager returns one map per softmax-attention layer in order; hybrid models have layers without one, so the
    maps are keyed by the discovered layers of their sites."""
    model = base.model
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = base.forward(batch, output_attentions=True)
    finally:
        model.set_attn_implementation(before)
    if base.is_encoder_decoder:
        maps = {"encoder": out.encoder_attentions, "decoder": out.decoder_attentions, "cross": out.cross_attentions}
    else:
        maps = {base.adapter.stacks()[0]: out.attentions}
    layers: dict[str, list[int]] = {}
    for site, _ in base.sites():
        layers.setdefault(site.stack, []).append(site.layer)
    return {stack: dict(zip(layers[stack], tensors, strict=True)) for stack, tensors in maps.items()}


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
