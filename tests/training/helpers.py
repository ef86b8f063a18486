"""Small shared pieces for the training tests."""

from __future__ import annotations

import torch

from anchorlens.methods import load_guided
from anchorlens.tasks import bundled_examples
from anchorlens.training import TrainConfig


def rte(n: int = 12) -> list[dict]:
    """The first ``n`` bundled RTE examples."""
    return bundled_examples("rte", limit=n)


def guided(base, spec: str = "capsule"):
    """A fresh guided model on the shared tiny base."""
    return load_guided(spec, base=base)


def config(**kw) -> TrainConfig:
    """A tiny config: no evals, no early stopping, unless overridden."""
    opts = dict(steps=4, lr=3e-3, batch_size=4, eval_every=0, save_every=0, patience=None)
    opts.update(kw)
    return TrainConfig(**opts)


def same_state(a, b) -> bool:
    """Bitwise-equal guidance tensors."""
    sa, sb = a.guidance_state_dict(), b.guidance_state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
