"""gpt-oss's learned sink: reported as its own pseudo-key in maps and as the ``learned_sink`` metric, checked
against what HF eager's rows miss over the real keys."""

from __future__ import annotations

import torch

from anchorlens.analyses.learned_sink import LearnedSinkReducer
from anchorlens.capture.maps import LEARNED_SINK_TOKEN
from anchorlens.capture.maps_io import load_maps, save_maps
from anchorlens.capture.run import capture_batch
from anchorlens.capture.sinks import MapSink, StreamSink
from anchorlens.methods.spec import load_guided

from .helpers import eager_attentions
from .test_exactness import _batch


def test_maps_carry_the_learned_sink_as_an_extra_key_column(tiny_base, tmp_path):
    base = tiny_base("tiny-gpt-oss")
    batch = _batch(base, "left", n=2)
    sink = MapSink()
    capture_batch(base, batch, sink)
    maps = sink.maps(base.adapter.stack_sequences)
    reference = eager_attentions(base, batch)["decoder"]
    for row, amap in enumerate(maps):
        stack = amap["decoder"]
        assert stack.learned_sink is not None and stack.learned_sink.shape == stack.probs.shape[:3]
        probs, tokens = stack.with_learned_sink()
        assert tokens[-1] == LEARNED_SINK_TOKEN and probs.shape[-1] == stack.probs.shape[-1] + 1
        torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:3]), rtol=0, atol=1e-5)
        valid = batch.attention_mask[row].bool()
        for i, layer in enumerate(stack.layers):
            missing = 1 - reference[layer][row][:, valid][:, :, valid].sum(-1)  # [H, Q]
            assert float((stack.learned_sink[i] - missing).abs().max()) <= 1e-5
    save_maps({"gpt-oss": maps[0]}, tmp_path / "maps")
    back = load_maps(tmp_path / "maps")["gpt-oss"]["decoder"]
    assert back.learned_sink is not None
    torch.testing.assert_close(back.learned_sink, maps[0]["decoder"].learned_sink, rtol=0, atol=0)


def test_models_without_a_learned_sink_have_none(tiny_base):
    base = tiny_base("tiny-llama")
    sink = MapSink()
    capture_batch(base, _batch(base, "right", n=1), sink)
    stack = sink.maps(base.adapter.stack_sequences)[0]["decoder"]
    assert stack.learned_sink is None and stack.with_learned_sink()[0] is stack.probs
    reducer = LearnedSinkReducer()
    capture_batch(base, _batch(base, "right", n=2), StreamSink([reducer]), need_logits=False)
    assert reducer.frame().empty


def _eager(model, batch) -> tuple[torch.Tensor, ...]:
    """Eager ``output_attentions`` of a guided model's forward (its implementation restored afterwards)."""
    before = model.model.config._attn_implementation
    model.model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return model.forward(batch, output_attentions=True).attentions
    finally:
        model.model.set_attn_implementation(before)


def test_learned_sink_metric_is_the_mean_sink_mass_of_valid_queries(tiny_base):
    """Per example, layer and head: the metric's ``all`` row equals the mean over the example's valid queries of
    1 - (eager row sum over real keys), on the base and with an instance token."""
    base = tiny_base("tiny-gpt-oss")
    batch = _batch(base, "left", n=3)
    for spec in ("base", "instance"):
        model = load_guided(spec, base=base)
        reducer = LearnedSinkReducer()
        capture_batch(model, batch, StreamSink([reducer]), need_logits=False)
        rows = reducer.frame().query("query_role == 'all'")
        assert set(rows["metric"]) == {"learned_sink"} and set(rows["key_role"]) == {""}
        valid = model.layout(batch).layout("decoder", 0).q.valid
        for layer, attn in enumerate(_eager(model, batch)):
            missing = 1 - attn.float().sum(-1)  # [B, H, Q]
            want = (missing * valid[:, None, :]).sum(-1) / valid.sum(-1, keepdim=True)  # [B, H]
            got = rows[rows["layer"] == layer].sort_values(["example", "head"])["value"].to_numpy()
            assert len(got) == want.numel() and abs(got - want.flatten().numpy()).max() <= 1e-5, (spec, layer)


def test_default_statistics_report_the_learned_sink_only_where_there_is_one(tiny_base):
    """The default reducers include learned_sink: gpt-oss gets rows (decomposition + sink = 1), Llama none."""
    from anchorlens.analyses import default_reducers, metrics_frame
    from anchorlens.capture.collect import stream_statistics

    frames = {}
    for name in ("tiny-gpt-oss", "tiny-llama"):
        base = tiny_base(name)
        reducers = default_reducers()
        stream_statistics(base, [_batch(base, "left", n=2)], reducers)
        frames[name] = metrics_frame(reducers)
    assert "learned_sink" in set(frames["tiny-gpt-oss"]["metric"])
    assert "learned_sink" not in set(frames["tiny-llama"]["metric"])
    sink = frames["tiny-gpt-oss"].query("metric == 'learned_sink' and query_role == 'all'")["value"]
    assert float(sink.min()) > 0.01
