"""Mean attention maps (StreamingLLM's Fig. 2) against an independent average of HF eager ``output_attentions``.

The reference runs every example alone (no padding) through the HF model with eager attention, averages its
heads, and adds the map on a grid aligned at position 0, counting each cell over the examples whose query could
see the key (causal: key <= query). The reducer sees padded, length-sorted batches, possibly in query chunks.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from anchorlens.analyses.mean_maps import (
    MeanMapReducer,
    default_layers,
    load_mean_maps,
    mean_attention_maps,
    save_mean_maps,
)
from anchorlens.capture.collect import collect_maps, encode_batches, stream_statistics
from anchorlens.capture.options import CaptureOptions
from anchorlens.methods.spec import load_guided
from anchorlens.tasks import bundled_examples, get_task

N = 5


def _examples(n: int = N):
    return bundled_examples("rte")[:n]


def _eager_reference(base, examples, layers) -> np.ndarray:
    """[L, T, T] mean over examples of head-mean eager maps, aligned at position 0, NaN where no example sees."""
    template = get_task("rte").template
    model = base.model
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    maps = []
    try:
        for ex in examples:
            enc = base.encode([template.render(ex)])
            with torch.no_grad():
                out = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, output_attentions=True)
            maps.append([out.attentions[layer][0].double().mean(0).numpy() for layer in layers])
    finally:
        model.set_attn_implementation(before)
    longest = max(m[0].shape[0] for m in maps)
    sums = np.zeros((len(layers), longest, longest))
    counts = np.zeros_like(sums)
    for per_layer in maps:
        n = per_layer[0].shape[0]
        sees = np.tril(np.ones((n, n)))
        for i, a in enumerate(per_layer):
            sums[i, :n, :n] += a * sees
            counts[i, :n, :n] += sees
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _run(target, examples, layers=None, batch_size=2, **kw):
    template = get_task("rte").template
    return mean_attention_maps(target, encode_batches(target, examples, template, batch_size=batch_size), layers, **kw)


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("budget", [None, 4096])  # 4096: every call arrives in query chunks
def test_mean_maps_equal_the_eager_average(tiny_base, padding_side, budget):
    base = tiny_base("tiny-llama")
    layers = default_layers(base.model.config.num_hidden_layers)
    reference = _eager_reference(base, _examples(), layers)
    options = CaptureOptions() if budget is None else CaptureOptions(memory_budget=budget)
    old = base.tokenizer.padding_side
    base.tokenizer.padding_side = padding_side
    try:
        got = _run(base, _examples(), layers, options=options)
    finally:
        base.tokenizer.padding_side = old
    assert got.layers == list(layers) and got.n_examples == N and got.heads == base.model.config.num_attention_heads
    mean = got.mean()
    assert mean.shape == reference.shape  # the grid is the longest example, no more
    assert np.array_equal(np.isnan(mean), np.isnan(reference))  # n/a exactly where no example sees the key
    assert np.isnan(mean[:, np.triu_indices(mean.shape[1], k=1)[0], np.triu_indices(mean.shape[1], k=1)[1]]).all()
    np.testing.assert_allclose(mean, reference, rtol=0, atol=1e-6, equal_nan=True)
    lengths = sorted(len(base.encode([get_task("rte").template.render(ex)]).tokens[0]) for ex in _examples())
    assert got.complete_queries == lengths[0]  # rows past the shortest input average fewer examples
    assert got.q_examples.tolist() == [sum(n > i for n in lengths) for i in range(lengths[-1])]


def test_rows_of_a_single_example_sum_to_one_and_cap_crops_exactly(tiny_base):
    base = tiny_base("tiny-llama")
    whole = _run(base, _examples(3), (0, 2))
    capped = _run(base, _examples(3), (0, 2), max_positions=10)
    assert capped.shape == (10, 10)
    np.testing.assert_allclose(capped.mean(), whole.mean()[:, :10, :10], rtol=0, atol=1e-12, equal_nan=True)
    one = _run(base, _examples(1), (1,))
    np.testing.assert_allclose(np.nansum(one.mean()[0], axis=1), 1.0, atol=1e-6)


def test_states_merge_and_round_trip(tiny_base, tmp_path):
    base = tiny_base("tiny-llama")
    template = get_task("rte").template
    examples = _examples(4)
    whole = _run(base, examples, (0, 3))
    parts = []
    for ids in ([0, 1], [2, 3]):
        reducer = MeanMapReducer((0, 3))
        batches = encode_batches(base, [examples[i] for i in ids], template, batch_size=2, example_ids=ids)
        stream_statistics(base, batches, [reducer])
        parts.append(reducer)
    restored = MeanMapReducer((0, 3))
    restored.load_state_dict(parts[0].state_dict())
    restored.merge(parts[1])
    # other batches (other padding) change the float32 capture by rounding only
    np.testing.assert_allclose(restored.state.mean(), whole.mean(), rtol=0, atol=1e-6, equal_nan=True)
    np.testing.assert_array_equal(restored.state.counts, whole.counts)
    assert sorted(restored.state.example_ids) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="share examples"):
        restored.merge(parts[1])
    saved = load_mean_maps(save_mean_maps({"a": whole, "b": restored.state}, tmp_path / "mean_maps")[0].with_suffix(""))
    assert list(saved) == ["a", "b"]
    for name, m in (("a", whole), ("b", restored.state)):
        assert torch.equal(saved[name].sums, m.sums) and torch.equal(saved[name].counts, m.counts)
        assert saved[name].layers == m.layers and saved[name].example_ids == m.example_ids
        assert (saved[name].sink_position, saved[name].sink_token, saved[name].heads) == (
            m.sink_position,
            m.sink_token,
            m.heads,
        )
    frame = restored.frame()
    assert len(frame) == int((restored.state.counts > 0).sum()) and (frame["key"] <= frame["query"]).all()


def test_guidance_is_aligned_before_the_sink_and_matches_each_examples_maps(tiny_base):
    """With an instance token at 0 the sink is at 1 in every example; the mean equals the mean of the full maps
    of each example (MapSink, checked against eager in the capture tests), aligned at position 0."""
    guided = load_guided("instance", tiny_base("tiny-llama"))
    template = get_task("rte").template
    got = _run(guided, _examples(4), (0, 2))
    assert got.key_role(0) == "instance" and got.query_role(0) == "instance"
    assert got.sink_position == 1 and got.key_role(1) != "instance"
    maps = collect_maps(guided, encode_batches(guided, _examples(4), template, batch_size=2), max_examples=4)
    longest = max(m["decoder"].probs.shape[-1] for m in maps)
    sums, counts = np.zeros((2, longest, longest)), np.zeros((2, longest, longest))
    for m in maps:
        probs = m["decoder"].probs.double().mean(1).numpy()  # [L, Q, K]
        n = probs.shape[-1]
        sees = np.tril(np.ones((n, n)))
        for i, layer in enumerate((0, 2)):
            sums[i, :n, :n] += probs[m["decoder"].layers.index(layer)] * sees
            counts[i, :n, :n] += sees
    expected = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    np.testing.assert_allclose(got.mean(), expected, rtol=0, atol=1e-6, equal_nan=True)


def test_default_layers_are_streamingllms_choice():
    assert default_layers(30) == (0, 1, 15, 29)
    assert default_layers(4) == (0, 1, 2, 3)
    assert default_layers(1) == (0,)
