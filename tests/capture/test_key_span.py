"""Key spans: the kernel plan hands a call without a mask to its observer as each query's span of keys (O(q)), not
as a q x K mask, and the statistics stay those of the materialised plan."""

from __future__ import annotations

import pytest
import torch

from anchorlens.analyses import default_reducers
from anchorlens.capture.options import CaptureOptions
from anchorlens.capture.run import capture_batch
from anchorlens.capture.sinks import StreamSink
from anchorlens.engine.call import AttentionCall, KeySpan, trim_unseen_keys, visible_keys
from anchorlens.engine.kernel import kernel_available
from anchorlens.tasks.bundled import bundled_examples
from anchorlens.tasks.registry import get_task


def _call(q_len: int, k_len: int, causal: bool, window: int | None) -> AttentionCall:
    query = torch.zeros(1, 2, q_len, 4)
    key = torch.zeros(1, 2, k_len, 4)
    return AttentionCall(query, key, key, None, 0.5, causal, None, None, window, None)


@pytest.mark.parametrize(
    ("q_len", "k_len", "causal", "window"),
    [(9, 9, True, None), (9, 9, True, 3), (4, 9, True, None), (4, 9, True, 2), (9, 9, False, None), (1, 1, True, 5)],
)
def test_a_span_is_the_trimmed_mask(q_len, k_len, causal, window):
    """For every chunk of a call without a mask, the span's dense form is exactly the trimmed visible mask, and its
    prefix-sum counts equal summing weights under that mask, per query (``counts``) and per key (``key_counts``)."""
    call = _call(q_len, k_len, causal, window)
    weights = torch.rand(2, k_len, 3, generator=torch.Generator().manual_seed(q_len * k_len))
    for start, stop in [(0, q_len), (0, max(1, q_len // 2)), (q_len // 2, q_len)]:
        if start >= stop:
            continue
        span = KeySpan.of(call, start, stop)
        assert span is not None
        expected = trim_unseen_keys(visible_keys(call, start, stop))
        assert torch.equal(span.dense(), expected)
        assert span.key_count == expected.shape[-1]
        dense_counts = torch.matmul(expected.double(), weights[:, None, : span.key_count].double())
        assert torch.allclose(span.counts(weights), dense_counts, atol=1e-12)
        queries = torch.rand(2, stop - start, generator=torch.Generator().manual_seed(start))
        received = torch.matmul(queries[:, None, None, :].double(), expected.double()).squeeze(2)
        assert torch.allclose(span.key_counts(queries), received, atol=1e-12)
        keys = torch.tensor([0, span.key_count - 1])
        assert torch.equal(span.sees(keys), expected[..., keys])


def test_a_call_with_a_mask_has_no_span():
    call = _call(3, 3, True, None)
    masked = AttentionCall(
        call.query, call.key, call.value, torch.ones(1, 1, 3, 3, dtype=torch.bool), 0.5, False, None, None, None, None
    )
    assert KeySpan.of(masked, 0, 3) is None


class _Spans(StreamSink):
    """A stream sink that also records what visibility its events carried."""

    def __init__(self, reducers):
        super().__init__(reducers)
        self.spans = self.masks = 0
        self.largest_mask = 0

    def consume(self, event):
        if event.key_span is not None:
            assert event.visible is None
            self.spans += 1
        else:
            self.masks += 1
            self.largest_mask = max(self.largest_mask, event.visible.numel())
        super().consume(event)


@pytest.mark.skipif(not kernel_available(), reason="this PyTorch lacks the CPU flash kernel")
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_kernel_plan_without_a_mask_emits_spans_and_equals_the_materialised_plan(tiny_base, name):
    """One unpadded example (no mask reaches the attention): under the kernel plan every event carries a key span and
    no mask, in several query chunks, and the default reducers' frames equal the materialised plan's within 1e-5."""
    base = tiny_base(name)
    task = get_task("rte")
    batch = base.encode([task.template.render(bundled_examples("rte")[0])])
    assert int(batch.attention_mask.min()) == 1
    small_budget = 4096  # bytes: several query chunks per call
    runs = {}
    for plan in ("kernel", "materialised"):
        sink = _Spans(default_reducers())
        capture_batch(
            base, batch, sink, need_logits=False, options=CaptureOptions(plan=plan, memory_budget=small_budget)
        )
        sink.close()
        runs[plan] = sink
    kernel, materialised = runs["kernel"], runs["materialised"]
    assert kernel.spans > len(set(kernel.plans)) and kernel.masks == 0  # several chunks per site, all spans
    assert set(kernel.plans.values()) == {"kernel"}
    assert materialised.spans == 0
    for a, b in zip(kernel.reducers, materialised.reducers, strict=True):
        fa, fb = a.frame(), b.frame()
        assert len(fa) == len(fb), a.name
        if fa.empty:
            continue
        assert fa.drop(columns="value").equals(fb.drop(columns="value")), a.name
        assert float((fa["value"] - fb["value"]).abs().max()) <= 1e-5, a.name
