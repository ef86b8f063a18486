"""The embedded SmolLM2-135M: capsule size and equations on the real model (skips when absent)."""

from __future__ import annotations

import torch

from anchorlens.capture.run import capture_batch
from anchorlens.methods import Capsule, GuidedModel, load_guided

from .helpers import Collect, rte_batch
from .test_capsule_reference import reference_decoder_only


def test_smollm2_capsule_has_17280_parameters_and_matches_hand_loop(smollm2):
    guided = GuidedModel(smollm2, [Capsule(init="random")], seed=0)
    assert guided.num_trainable() == 30 * 576 == 17_280
    batch = rte_batch(smollm2, "left")
    with torch.no_grad():
        got = guided.forward(batch).logits
        want = reference_decoder_only(smollm2, batch, guided.guidances[0].p["decoder"], "first")
    diff = float((got - want).abs()[batch.attention_mask.bool()].max())
    print(f"capsule smollm2 left first: max abs diff {diff:.2e}")
    assert diff <= 1e-4


def test_smollm2_capture_with_instance_and_capsule(smollm2):
    guided = load_guided("instance+capsule:pos=last", base=smollm2)
    batch = rte_batch(smollm2, "right")
    sink = Collect()
    capture_batch(guided, batch, sink)
    assert len(sink.events) == smollm2.num_layers
