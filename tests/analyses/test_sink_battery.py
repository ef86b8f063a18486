"""The sink battery (Gu et al. 2024) against alpha_h(k) computed directly from HF eager ``output_attentions``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from analyses_helpers import make_event, random_event

from anchorlens.analyses import sink_rates
from anchorlens.analyses.registry import make_reducer
from anchorlens.analyses.sink_battery import SinkBatteryReducer, check_eps, eps_label
from anchorlens.capture.collect import stream_statistics
from anchorlens.capture.options import CaptureOptions
from anchorlens.errors import UsageError
from anchorlens.tasks import bundled_examples, get_task
from tests.capture.helpers import eager_attentions

TOP = 3


def _batch(base, padding_side: str, n: int = 4):
    task = get_task("rte")
    base.tokenizer.padding_side = padding_side
    try:
        return base.encode([task.template.render(ex) for ex in bundled_examples("rte")[:n]])
    finally:
        base.tokenizer.padding_side = "right"


def _reference(base, batch) -> dict:
    """(layer, example, head) -> (alpha per valid key [n], received mass per valid key [n]) from eager maps."""
    window = getattr(base.config, "sliding_window", None)
    layer_types = getattr(base.config, "layer_types", None)
    maps = eager_attentions(base, batch)["decoder"]
    out = {}
    for layer, probs in maps.items():
        windowed = window is not None and (layer_types is None or layer_types[layer] == "sliding_attention")
        for row, example in enumerate(batch.example_ids.tolist()):
            valid = batch.attention_mask[row].bool()
            a = probs[row][:, valid][:, :, valid].double()  # [H, n, n]: valid queries and keys
            n = a.shape[-1]
            i = torch.arange(n)[:, None]
            k = torch.arange(n)[None, :]
            sees = i >= k
            if windowed:
                sees &= (i - k) < window
            received = (a * sees).sum(1)  # [H, n]
            alpha = received / sees.sum(0)
            for head in range(a.shape[0]):
                out[layer, example, head] = (alpha[head].numpy(), received[head].numpy())
    return out


def _value(frame: pd.DataFrame, metric: str) -> pd.Series:
    rows = frame[frame["metric"] == metric]
    return rows.set_index(["layer", "example", "head"])["value"]


@pytest.mark.parametrize(
    ("name", "padding_side"),
    [
        ("tiny-mistral", "left"),  # grouped heads, a sliding window, left padding: the quick check
        pytest.param("tiny-mistral", "right", marks=pytest.mark.slow),
        pytest.param("tiny-llama", "left", marks=pytest.mark.slow),
        pytest.param("tiny-llama", "right", marks=pytest.mark.slow),
    ],
)
def test_battery_equals_eager_reference_in_query_chunks(tiny_base, name, padding_side):
    base = tiny_base(name)
    batch = _batch(base, padding_side)
    assert batch.attention_mask.min() == 0, "the batch must contain padding"
    ref = _reference(base, batch)
    alpha_first = np.array([v[0][0] for v in ref.values()])
    eps = tuple(float(np.round(np.quantile(alpha_first, q), 4)) for q in (0.3, 0.7))  # flags of both kinds
    reducer = SinkBatteryReducer(eps=eps, top=TOP)
    counter = _Counting(reducer)
    stream_statistics(base, [batch], [counter], options=CaptureOptions(mode="fast", memory_budget=40_000))
    assert counter.chunks > 0, "a tiny memory budget must split the calls into query chunks"
    frame = reducer.frame()
    first = _value(frame, "sink_alpha_first")
    assert len(first) == len(ref)
    got_first = np.array([first[key] for key in ref])
    assert np.abs(got_first - alpha_first).max() < 1e-5
    for r in range(TOP):
        alpha_top = _value(frame, f"sink_alpha_top{r + 1}")
        pos_top = _value(frame, f"sink_position_top{r + 1}")
        for key, (alpha, received) in ref.items():
            order = np.argsort(-received, kind="stable")
            assert pos_top[key] == order[r], (key, r)
            assert abs(alpha_top[key] - alpha[order[r]]) < 1e-5
    for e in eps:
        heads = _value(frame, eps_label("sink_head", e))
        expected = {key: float(v[0][0] > e) for key, v in ref.items()}
        assert {key: heads[key] for key in ref} == expected
        any_heads = _value(frame, eps_label("sink_head_any", e))
        for key, (alpha, received) in ref.items():
            top = np.argsort(-received, kind="stable")[:TOP]
            assert any_heads[key] == float(alpha[top].max() > e)
        rates = frame[frame["metric"] == eps_label("sink_rate", e)]
        assert rates["head"].isna().all()
        for (layer, example), value in rates.set_index(["layer", "example"])["value"].items():
            assert value == pytest.approx(
                np.mean([expected[layer, example, h] for h in range(base.config.num_attention_heads)])
            )
    assert 0 < np.mean(list(expected.values())) < 1, "the thresholds must split the heads"


class _Counting:
    """Wraps a reducer and counts the events that were query chunks (not whole calls)."""

    def __init__(self, reducer) -> None:
        self.reducer = reducer
        self.name = reducer.name
        self.chunks = 0

    def update(self, event) -> None:
        self.chunks += int(event.probs.shape[2] < (event.query_total or event.probs.shape[2]))
        self.reducer.update(event)

    def flush(self) -> None:
        self.reducer.flush()


def test_battery_roles_positions_and_rates_on_a_synthetic_event():

    # 2 valid keys after one left pad; head 0 sinks on the first valid key, head 1 on the second
    probs = torch.zeros(1, 2, 3, 3)
    probs[0, 0, 1, 1] = 1.0
    probs[0, 0, 2] = torch.tensor([0.0, 0.9, 0.1])
    probs[0, 1, 1, 1] = 1.0
    probs[0, 1, 2] = torch.tensor([0.0, 0.2, 0.8])
    valid = torch.tensor([[False, True, True]])
    roles = torch.tensor([[0, 1, 2]])
    visible = (torch.ones(3, 3).tril().bool() & valid[0][None, :])[None, None]
    event = make_event(probs, roles, valid, visible=visible, example_ids=[7])
    reducer = SinkBatteryReducer(eps=[0.5, 0.3], top=2)
    reducer.update(event)
    frame = reducer.frame()
    first = frame[frame["metric"] == "sink_alpha_first"].set_index("head")
    assert first.loc[0, "value"] == pytest.approx(0.95) and first.loc[1, "value"] == pytest.approx(0.6)
    assert set(first["key_role"]) == {"structural"}
    top1 = frame[frame["metric"] == "sink_position_top1"].set_index("head")
    assert top1.loc[0, "value"] == 0 and top1.loc[1, "value"] == 0  # received 1.9 and 1.2 beat 0.1 and 0.8
    top2 = frame[frame["metric"] == "sink_alpha_top2"].set_index("head")
    assert top2.loc[1, "value"] == pytest.approx(0.8) and top2.loc[1, "key_role"] == "content"
    heads = frame[frame["metric"] == "sink_head@0.5"].set_index("head")["value"]
    assert heads.to_dict() == {0: 1.0, 1: 1.0}
    any_heads = frame[frame["metric"] == "sink_head_any@0.3"].set_index("head")["value"]
    assert any_heads.to_dict() == {0: 1.0, 1: 1.0}
    rates = sink_rates(frame, eps=0.5)
    assert rates["sink_rate"].tolist() == [1.0, 1.0] and rates["layer"].tolist() == [0, -1]


def test_battery_merges_state_and_round_trips():

    events = [random_event(seed, example_ids=[3 * seed, 3 * seed + 1, 3 * seed + 2]) for seed in range(4)]
    whole = SinkBatteryReducer()
    for event in events:
        whole.update(event)
    left, right = SinkBatteryReducer(), SinkBatteryReducer()
    for i, event in enumerate(events):
        (left if i % 2 else right).update(event)
    left.merge(right)
    restored = SinkBatteryReducer()
    restored.load_state_dict(left.state_dict())
    key = ["example", "layer", "head", "metric"]
    a = whole.frame().sort_values(key, na_position="first").reset_index(drop=True)
    b = restored.frame().sort_values(key, na_position="first").reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)
    with pytest.raises(ValueError):
        left.merge(_wrong := SinkBatteryReducer(eps=0.5))  # noqa: F841
    assert isinstance(make_reducer("sink_battery", eps=[0.1, 0.3]), SinkBatteryReducer)


@pytest.mark.parametrize("eps", [0.0, 1.0, -0.2, "x", []])
def test_eps_outside_the_unit_interval_is_one_usage_line(eps):
    with pytest.raises(UsageError, match="eps"):
        check_eps(eps)
    with pytest.raises(UsageError):
        SinkBatteryReducer(eps=eps)


def test_top_must_be_positive():
    with pytest.raises(UsageError, match="top"):
        SinkBatteryReducer(top=0)


def test_evidence_reducers_are_opt_in_beside_the_defaults():
    from anchorlens.analyses import DEFAULT_REDUCERS, EVIDENCE_REDUCERS, default_reducers

    assert [r.name for r in default_reducers()] == list(DEFAULT_REDUCERS)
    names = [r.name for r in default_reducers(extra=EVIDENCE_REDUCERS)]
    assert names == [*DEFAULT_REDUCERS, *EVIDENCE_REDUCERS]
    (battery,) = [r for r in default_reducers(extra={"sink_battery": {"eps": [0.1, 0.5]}}) if r.name == "sink_battery"]
    assert battery.state_options()["eps"] == [0.1, 0.5]
