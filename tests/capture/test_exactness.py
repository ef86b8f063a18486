"""Captured probabilities equal HF eager attentions on every family; outputs equal the plain forward."""

from __future__ import annotations

import pytest
import torch

from anchorlens.analyses import default_reducers
from anchorlens.capture.options import CaptureOptions
from anchorlens.capture.run import capture_batch
from anchorlens.capture.selection import Selection
from anchorlens.capture.sinks import StreamSink
from anchorlens.models.tiny import TINY_BASES
from anchorlens.tasks import bundled_examples, get_task

from .helpers import Collect, eager_attentions, plain_logits

BASES = list(TINY_BASES)  # every supported family


def _batch(base, padding_side: str, n: int = 4):
    task = get_task("rte")
    examples = bundled_examples("rte")[:n]
    base.tokenizer.padding_side = padding_side
    try:
        return base.encode([task.template.render(ex) for ex in examples])
    finally:
        base.tokenizer.padding_side = "right"


def _max_valid_diff(event, reference: torch.Tensor) -> float:
    """Largest |captured - eager| over real (non-padding) query rows."""
    ref = reference.index_select(1, event.heads)
    rows = event.layout.q.valid[:, None, :, None]
    return float(((event.probs - ref.float()).abs() * rows).max())


@pytest.mark.parametrize("name", BASES)
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_capture_equals_eager_output_attentions(tiny_base, name, padding_side):
    base = tiny_base(name)
    batch = _batch(base, padding_side)
    assert batch.attention_mask.min() == 0, "the batch must contain padding"
    window = getattr(base.config, "sliding_window", None)
    assert window is None or batch.attention_mask.sum(1).min() > 2 * window, "the window must matter"
    sink = Collect()
    out = capture_batch(base, batch, sink)
    reference = eager_attentions(base, batch)
    expected_sites = {(s.stack, s.layer) for s, _ in base.sites()}
    assert {(e.stack, e.layer) for e in sink.events} == expected_sites
    diffs = [_max_valid_diff(event, reference[event.stack][event.layer]) for event in sink.events]
    # padding positions are compared nowhere: eager gives fully masked rows uniform weights, sdpa/anchorlens zeros
    rows = (batch.target_mask if base.is_encoder_decoder else batch.attention_mask).bool()
    logits_diff = float((out.logits - plain_logits(base, batch)).abs()[rows].max())
    print(f"exactness {name} {padding_side}: maps max |d| {max(diffs):.1e}, logits max |d| {logits_diff:.1e}")
    assert max(diffs) <= 1e-5, [(e.stack, e.layer, d) for e, d in zip(sink.events, diffs) if d > 1e-5]
    assert logits_diff <= 1e-5
    for event in sink.events:  # the learned sink's mass is what eager's rows miss over the real keys
        if event.learned_sink is not None:
            ref = reference[event.stack][event.layer].index_select(1, event.heads).float()
            missing = 1 - ref.sum(-1)  # [B, H, Q]
            rows = event.layout.q.valid[:, None, :]
            assert float(((event.learned_sink - missing).abs() * rows).max()) <= 1e-5


@pytest.mark.parametrize("name", BASES)
def test_rows_sum_to_one_over_visible_keys(tiny_base, name):
    base = tiny_base(name)
    batch = _batch(base, "right")
    sink = Collect()
    capture_batch(base, batch, sink)
    for event in sink.events:
        valid_q = event.layout.q.valid
        sums = event.probs.sum(-1)  # [B,H,Q]
        if event.learned_sink is not None:  # a learned sink is a pseudo-key: real keys + sink = 1
            assert float(event.learned_sink.min()) >= 0.0 and float(event.learned_sink.max()) > 1e-3
            sums = sums + event.learned_sink
        assert torch.allclose(sums[valid_q[:, None, :].expand_as(sums)], torch.ones(()), atol=1e-5)
        hidden = ~(event.visible & event.layout.k.valid[:, None, None, :])
        assert float((event.probs * hidden).abs().max()) == 0.0
        if event.stack in ("decoder",) and not base.is_encoder_decoder:
            q, k = event.probs.shape[-2:]
            assert float(event.probs[..., torch.triu(torch.ones(q, k, dtype=torch.bool), 1)].abs().max()) == 0.0


def test_selection_filters_sites_and_heads(tiny_base):
    base = tiny_base("tiny-qwen2")  # grouped-query attention: 4 query heads over 2 kv heads
    batch = _batch(base, "right")
    everything, chosen = Collect(), Collect()
    capture_batch(base, batch, everything)
    capture_batch(base, batch, chosen, Selection(layers=(0, -1), heads=(1, 3)))
    assert [(e.stack, e.layer) for e in chosen.events] == [("decoder", 0), ("decoder", 3)]
    full = {e.layer: e for e in everything.events}
    for event in chosen.events:
        assert event.heads.tolist() == [1, 3]
        torch.testing.assert_close(event.probs, full[event.layer].probs[:, [1, 3]])


def test_glob_names_select_t5_stacks(tiny_base):
    base = tiny_base("tiny-t5")
    batch = _batch(base, "right")
    sink = Collect()
    capture_batch(base, batch, sink, Selection(names=("cross.*", "encoder.0")))
    assert sorted((e.stack, e.layer) for e in sink.events) == [("cross", 0), ("cross", 1), ("cross", 2), ("encoder", 0)]


def test_no_session_means_no_overhead_path(tiny_base):
    base = tiny_base("tiny-llama")
    batch = _batch(base, "right")
    with torch.no_grad():
        plain = base.forward(batch).logits
    torch.testing.assert_close(plain, plain_logits(base, batch), rtol=0, atol=0)


def test_bf16_capture_is_normalized_and_close_to_fp32(tiny_base):
    base32, base16 = tiny_base("tiny-llama"), tiny_base("tiny-llama", "bfloat16")
    batch = _batch(base32, "left")
    a, b = Collect(), Collect()
    capture_batch(base32, batch, a)
    capture_batch(base16, batch, b)
    for e32, e16 in zip(a.events, b.events):
        assert e16.probs.dtype == torch.float32
        valid = e16.layout.q.valid[:, None, :].expand(e16.probs.shape[:3])
        assert torch.allclose(e16.probs.sum(-1)[valid], torch.ones(()), atol=1e-5)
        assert _max_valid_diff(e16, e32.probs) < 0.05


def test_t5_decoder_and_cross_attention_with_a_padded_target(tiny_base):
    base = tiny_base("tiny-t5")
    batch = _batch(base, "right")
    g = torch.Generator().manual_seed(0)
    batch.target_ids = torch.randint(3, 300, (batch.batch_size, 5), generator=g)
    batch.target_mask = torch.ones_like(batch.target_ids)
    batch.target_mask[0, 3:] = 0
    batch.target_roles = torch.full_like(batch.target_ids, 2)
    sink = Collect()
    capture_batch(base, batch, sink)
    reference = eager_attentions(base, batch)
    stacks = {e.stack for e in sink.events}
    assert stacks == {"encoder", "decoder", "cross"}
    for event in sink.events:
        assert event.probs.shape[-2] == (5 if event.stack != "encoder" else batch.input_ids.shape[1])
        assert _max_valid_diff(event, reference[event.stack][event.layer]) <= 1e-5, (event.stack, event.layer)


class _AskColumns(Collect):
    """Collect that asks for sums over fixed random key columns [B, K, 5], as the built-in reducers' sink does."""

    def __init__(self) -> None:
        super().__init__()
        self.columns: dict = {}

    def key_columns(self, layout, device, dtype):
        k = layout.k.roles
        if id(k) not in self.columns:  # the entry keeps k alive: its id is not reused meanwhile
            g = torch.Generator().manual_seed(len(self.columns))
            self.columns[id(k)] = (k, torch.rand(*k.shape, 5, generator=g).to(device, dtype))
        return self.columns[id(k)][1]


@pytest.mark.parametrize("name", BASES)
def test_fast_mode_sums_the_sinks_key_columns_in_the_outputs_product(tiny_base, name):
    """Fast mode computes the output and the key-column sums in one product: the sums equal the captured
    probabilities' sums over the columns and the logits stay those of the plain forward."""
    base = tiny_base(name)
    batch = _batch(base, "left")
    asked, plain = _AskColumns(), Collect()
    out = capture_batch(base, batch, asked, options=CaptureOptions(mode="fast"))
    reference = capture_batch(base, batch, plain, options=CaptureOptions(mode="fast"))
    assert len(asked.events) == len(plain.events) > 0
    for event, other in zip(asked.events, plain.events, strict=True):
        assert other.key_sums is None and event.key_sums is not None, (event.stack, event.layer)
        columns = event.key_columns[:, : event.key_count]  # [B, K', 5] of the layout's K keys
        want = torch.matmul(event.probs, columns[:, None])  # [B, H, q, 5]
        assert event.key_sums.shape == want.shape
        assert float((event.key_sums - want).abs().max()) <= 1e-6, (event.stack, event.layer)
        torch.testing.assert_close(event.probs, other.probs, rtol=0, atol=0)
    rows = (batch.target_mask if base.is_encoder_decoder else batch.attention_mask).bool()
    assert float((out.logits - reference.logits).abs()[rows].max()) <= 1e-6
    assert float((out.logits - plain_logits(base, batch)).abs()[rows].max()) <= 1e-5


def test_no_fused_sums_in_strict_mode_or_with_bf16_values(tiny_base):
    """Strict mode keeps sdpa's output (no product to share); bf16 values would round the sums to bf16."""
    batch = _batch(tiny_base("tiny-llama"), "right")
    for base, mode in ((tiny_base("tiny-llama"), "strict"), (tiny_base("tiny-llama", "bfloat16"), "fast")):
        sink = _AskColumns()
        capture_batch(base, batch, sink, options=CaptureOptions(mode=mode))
        assert sink.events and all(e.key_sums is None and e.key_columns is None for e in sink.events)


def test_default_reducers_give_the_same_frames_with_fused_and_separate_sums(tiny_base):
    """The built-in reducers read the capture's fused sums in fast mode and sum the probabilities themselves in
    strict mode: the frames agree to float rounding on every family."""
    for name in BASES:
        base = tiny_base(name)
        batch = _batch(base, "left")
        fused, separate = default_reducers(), default_reducers()
        capture_batch(base, batch, StreamSink(fused), need_logits=False, options=CaptureOptions(mode="fast"))
        capture_batch(base, batch, StreamSink(separate), need_logits=False, options=CaptureOptions(mode="strict"))
        for a, b in zip(fused, separate, strict=True):
            fa, fb = a.frame(), b.frame()
            # learned_sink has rows only where the model has learned sinks (gpt-oss)
            assert len(fa) == len(fb) and (len(fa) > 0 or a.name == "learned_sink"), (name, a.name)
            if fa.empty:
                continue
            assert (fa.drop(columns="value") == fb.drop(columns="value")).all().all(), (name, a.name)
            assert float((fa["value"] - fb["value"]).abs().max()) <= 2e-6, (name, a.name)
