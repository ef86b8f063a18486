"""GuidedModel.next_token_logits: the LM head only at the asked positions equals the full logits read there."""

from __future__ import annotations

import pytest
import torch

from anchorlens.methods import load_guided

from .helpers import rte_batch

SPECS = [
    "base",
    "instance",
    "capsule:pos=middle",
    "capsule:n=2,fusion=prepend,pos=last",
    "prompt:n=3",
    "deep-prompt:n=2,pos=2",
    "prompt:n=2+instance+capsule",
    "instance+knockout:keys=instance,mode=renorm",
]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gpt2"])
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("spec", SPECS)
def test_logits_at_positions_equal_the_full_logits(tiny_base, name, side, spec):
    base = tiny_base(name)
    guided = load_guided(spec, base=base, seed=1)
    batch = rte_batch(base, side)
    valid = batch.attention_mask.bool()
    last = torch.where(valid, torch.arange(valid.shape[1]), -1).amax(1)  # each row's last token (the answer)
    first = valid.int().argmax(1)
    for positions in (last, first + 2):  # rows at different positions, and any position, not only the last
        with torch.no_grad():
            full = guided.forward(batch).logits[torch.arange(batch.batch_size), positions]
            got = guided.next_token_logits(batch, positions)
        assert got.shape == full.shape
        torch.testing.assert_close(got, full, atol=2e-5, rtol=1e-5)
