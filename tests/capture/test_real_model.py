"""Exactness on the embedded SmolLM2 with a real RTE example (skips without model or data)."""

from __future__ import annotations

import torch

from anchorlens.capture.run import capture_batch
from anchorlens.tasks import get_task, load_examples

from .helpers import Collect, eager_attentions, sdpa_logits


def test_smollm2_capture_equals_eager_on_real_rte(smollm2, shared_data):
    task = get_task("rte")
    examples = load_examples(shared_data / "superglue" / "RTE" / "train.jsonl", task, limit=3)
    batch = smollm2.encode([task.template.render(ex) for ex in examples], example_ids=[0, 1, 2])
    assert batch.attention_mask.min() == 0  # real examples differ in length: padded batch
    sink = Collect()
    out = capture_batch(smollm2, batch, sink)
    reference = eager_attentions(smollm2, batch)["decoder"]
    assert len(sink.events) == 30
    worst = 0.0
    for event in sink.events:
        rows = event.layout.q.valid[:, None, :, None]
        worst = max(worst, float(((event.probs - reference[event.layer]).abs() * rows).max()))
    assert worst <= 1e-5, worst
    torch.testing.assert_close(out.logits, sdpa_logits(smollm2, batch), rtol=0, atol=1e-5)
