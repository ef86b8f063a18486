"""From examples to batches and statistics: length order, and buffers allocated once per stream."""

from __future__ import annotations

from anchorlens.analyses import default_reducers
from anchorlens.capture import session as session_mod
from anchorlens.capture.collect import encode_batches, stream_statistics
from anchorlens.tasks import bundled_examples, get_task


def test_batches_are_length_sorted_longest_first_and_keep_every_example(tiny_base):
    base = tiny_base("tiny-llama")
    examples = bundled_examples("rte")[:7]
    template = get_task("rte").template
    batches = list(encode_batches(base, examples, template, batch_size=2))
    chars = [len(template.render(examples[i]).text) for b in batches for i in b.example_ids.tolist()]
    assert chars == sorted(chars, reverse=True) and chars[0] > chars[-1]  # rendered length, longest first
    tokens = [int(b.attention_mask.sum(1).max()) for b in batches]
    assert tokens[0] == max(tokens)  # so the first batch sizes the buffers
    assert sorted(i for b in batches for i in b.example_ids.tolist()) == list(range(7))


def test_a_stream_reuses_one_set_of_buffers_for_all_its_batches(tiny_base, monkeypatch):
    """The longest batch comes first, so the recompute's buffers are allocated once and every later batch reuses
    them (a buffer per batch would be freed and allocated again, which fragments the heap)."""
    base = tiny_base("tiny-llama")
    examples = bundled_examples("rte")[:6]
    batches = list(encode_batches(base, examples, get_task("rte").template, batch_size=2))
    seen: list[dict] = []
    original = session_mod.CaptureSession.scratch_buffer

    def spy(self, name, numel, dtype, device):
        buf = original(self, name, numel, dtype, device)
        seen.append({"scratch": id(self.scratch), "name": name, "buffer": buf.data_ptr()})
        return buf

    monkeypatch.setattr(session_mod.CaptureSession, "scratch_buffer", spy)
    reducers = stream_statistics(base, batches, default_reducers())
    for reducer in reducers:  # flushed: nothing staged or pending, no staging buffer kept
        assert not reducer._stager._open and not reducer._stager.ready and not reducer._stager._scratch
        assert not reducer._sums._pending
    assert len({s["scratch"] for s in seen}) == 1  # one dict for the whole stream
    for name in ("logits", "probs", "work"):
        assert len({s["buffer"] for s in seen if s["name"] == name}) == 1, name
    assert len(seen) > 3 * len(batches)
