"""Massive activations (Sun et al. 2024) against HF ``output_hidden_states``, from the capture's own forward."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from anchorlens.analyses import default_reducers
from anchorlens.analyses.massive import MassiveActivationsReducer
from anchorlens.analyses.registry import make_reducer
from anchorlens.capture.collect import stream_statistics
from anchorlens.capture.options import CaptureOptions
from anchorlens.errors import UsageError
from anchorlens.tasks import bundled_examples, get_task

TOP = 3


def _batch(base, padding_side: str, n: int = 4):
    task = get_task("rte")
    base.tokenizer.padding_side = padding_side
    try:
        return base.encode([task.template.render(ex) for ex in bundled_examples("rte")[:n]])
    finally:
        base.tokenizer.padding_side = "right"


def _reference(base, batch) -> dict:
    """(layer, example) -> (sorted |h| desc, token position, dimension, median) from ``output_hidden_states``.

    hidden_states[i + 1] is block i's output for every block but the last (whose entry has the final norm
    applied), so the last block is left out."""
    with torch.no_grad():
        states = base.forward(batch, output_hidden_states=True).hidden_states
    out = {}
    for layer in range(len(states) - 2):
        for row, example in enumerate(batch.example_ids.tolist()):
            valid = batch.attention_mask[row].bool()
            mag = states[layer + 1][row][valid].abs().double()  # [n, d]
            flat = mag.flatten()
            order = torch.argsort(flat, descending=True)
            d = mag.shape[1]
            out[layer, example] = (
                flat[order].numpy(),
                (order // d).numpy(),
                (order % d).numpy(),
                float(flat.median()),  # the lower median, as the reducer's
                mag,
            )
    return out


def _value(frame: pd.DataFrame, metric: str, query_role: str | None = None) -> pd.Series:
    rows = frame[frame["metric"] == metric]
    rows = rows if query_role is None else rows[rows["query_role"] == query_role]
    return rows.set_index(["layer", "example"])["value"]


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_massive_activations_equal_output_hidden_states(tiny_base, padding_side):
    base = tiny_base("tiny-llama")
    batch = _batch(base, padding_side)
    assert batch.attention_mask.min() == 0, "the batch must contain padding"
    ref = _reference(base, batch)
    # thresholds from the tiny model's own scale, so that both flags split the entries
    top1 = np.array([v[0][0] for v in ref.values()])
    abs_threshold = float(np.median(top1))
    ratio = float(np.median([v[0][0] / v[3] for v in ref.values()]))
    reducer = MassiveActivationsReducer(top=TOP, abs_threshold=abs_threshold, ratio=ratio)
    reducers = [*default_reducers(), reducer]  # beside the attention statistics, in the same forward
    stream_statistics(base, [batch], reducers, options=CaptureOptions(mode="fast"))
    frame = reducer.frame()
    assert frame["head"].isna().all()
    assert set(frame["layer"]) == set(range(base.config.num_hidden_layers))
    median = _value(frame, "massive_median", "all")
    count = _value(frame, "massive_count", "all")
    # no position is inserted on a base: the input-only rows are the all-positions rows
    pd.testing.assert_series_equal(_value(frame, "massive_count", "input"), count)
    pd.testing.assert_series_equal(_value(frame, "massive_median", "input"), median)
    flags_abs, flags_ratio = [], []
    for key, (values, token, dim, med, mag) in ref.items():
        assert median[key] == pytest.approx(med, rel=1e-4)
        for r in range(TOP):
            assert _value(frame, f"massive_top{r + 1}")[key] == pytest.approx(values[r], rel=1e-4)
            assert _value(frame, f"massive_position_top{r + 1}")[key] == token[r]
            assert _value(frame, f"massive_dim_top{r + 1}")[key] == dim[r]
            flags_abs.append(_value(frame, f"massive_abs_top{r + 1}")[key])
            flags_ratio.append(_value(frame, f"massive_ratio_top{r + 1}")[key])
            assert flags_abs[-1] == float(values[r] > abs_threshold)
            assert flags_ratio[-1] == float(values[r] > ratio * med)
        expected = int(((mag > abs_threshold) & (mag > ratio * med)).sum())
        assert count[key] == expected
    assert 0 < np.mean(flags_abs) < 1 and 0 < np.mean(flags_ratio) < 1, "the thresholds must split the entries"
    roles = frame[frame["metric"] == "massive_top1"]["query_role"]
    assert set(roles) <= set(get_task("rte").roles) | {"special", "structural", "content"}


def test_massive_activations_of_a_guided_model_read_the_kept_sequence(tiny_base):
    from anchorlens.methods.spec import load_guided

    base = tiny_base("tiny-llama")
    model = load_guided("capsule", base=base)  # a capsule vector inserted in every block, removed after it
    batch = _batch(base, "left", n=2)
    reducer = MassiveActivationsReducer()
    stream_statistics(model, [batch], [reducer])
    frame = reducer.frame()
    assert set(frame["layer"]) == set(range(base.config.num_hidden_layers))
    # the capsule's position exists only inside each block: the stream between blocks has the input's positions
    lengths = dict(zip(batch.example_ids.tolist(), batch.attention_mask.sum(1).tolist(), strict=True))
    medians = frame[(frame["metric"] == "massive_median") & (frame["query_role"] == "all")]
    assert (medians["count"] == medians["example"].map(lengths)).all()


def test_state_merges_round_trips_and_refuses_bad_options(tiny_base):
    base = tiny_base("tiny-llama")
    batch = _batch(base, "right")
    rendered = [get_task("rte").template.render(ex) for ex in bundled_examples("rte")[:4]]
    one, two, whole = MassiveActivationsReducer(), MassiveActivationsReducer(), MassiveActivationsReducer()
    stream_statistics(base, [batch], [whole])
    stream_statistics(base, [base.encode(rendered[:2], example_ids=[0, 1])], [one])
    stream_statistics(base, [base.encode(rendered[2:], example_ids=[2, 3])], [two])
    one.merge(two)
    restored = make_reducer("massive_activations")
    restored.load_state_dict(one.state_dict())
    key = ["layer", "example", "metric"]
    a = whole.frame().sort_values(key).reset_index(drop=True)
    b = restored.frame().sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(a.drop(columns="value"), b.drop(columns="value"))
    assert np.allclose(a["value"], b["value"], rtol=1e-4)
    for bad in ({"top": 0}, {"abs_threshold": -1}, {"ratio": "x"}):
        with pytest.raises(UsageError):
            MassiveActivationsReducer(**bad)
