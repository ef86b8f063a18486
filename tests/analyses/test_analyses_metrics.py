"""Derived metrics from reducer frames."""

from __future__ import annotations

import pandas as pd
import pytest
from analyses_helpers import hand_event, lookup

import anchorlens.analyses as A
from anchorlens.analyses.registry import make_reducer


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    reducers = {n: make_reducer(n) for n in ("role_flow", "first_token", "entropy")}
    for r in reducers.values():
        r.update(hand_event())
    return A.metrics_frame(reducers, anchors=("capsule", "first_token"))


def test_anchor_mass_weights_queries(frame):
    am = frame[(frame["metric"] == "anchor_mass") & (frame["key_role"] == "capsule")]
    assert set(am["query_role"]) == {"input"}
    # example 10: input queries q1 (0.6), q2 (0.5), q3 (0.1): (0.6+0.5+0.1)/3, not mean of role means 0.45
    assert lookup(am, example=10) == pytest.approx(0.4)
    assert am.set_index("example").loc[10, "count"] == 3
    assert lookup(am, example=11) == pytest.approx(0.0)


def test_anchor_mass_first_token(frame):
    am = frame[(frame["metric"] == "anchor_mass") & (frame["key_role"] == "first_token")]
    assert lookup(am, example=10) == pytest.approx(0.4)
    assert lookup(am, example=11) == pytest.approx(1.0)  # only the structural query, on key 1


def test_structural_special_island_anchor_structural(frame):
    st = frame[frame["metric"] == "structural_attention"]
    assert lookup(st, example=10, query_role="structural") == pytest.approx(0.4)
    assert lookup(st, example=10, query_role="content") == pytest.approx(0.2)
    assert lookup(st, example=10, query_role="all") == pytest.approx(0.2)
    assert set(st["key_role"]) == {"structural"}
    sp = frame[frame["metric"] == "special_attention"]
    assert (sp["value"] == 0).all()
    isl = frame[frame["metric"] == "island_score"]
    assert lookup(isl, example=10) == pytest.approx(1.0)
    assert lookup(isl, example=11) == pytest.approx((0.6 + 0.8) / 2)  # pooled over 2 guidance queries
    assert set(zip(isl["query_role"], isl["key_role"])) == {("guidance", "guidance")}
    ast = frame[frame["metric"] == "anchor_structural"]
    assert lookup(ast, example=10) == 0.0 and lookup(ast, example=11) == pytest.approx(0.2)


def test_flow_mass_pooled_custom(frame):
    fm = A.flow_mass(frame, ["structural", "content"], ["content"], metric="x")
    assert lookup(fm, example=10) == pytest.approx(0.7)
    with pytest.raises(ValueError):
        A.flow_mass(frame, ["structural"], ["all"])
    with pytest.raises(ValueError):
        A.flow_mass(frame.drop(columns="count"), ["structural"], ["content"])


def test_metrics_frame_without_derived(frame):
    r = make_reducer("role_flow")
    r.update(hand_event())
    base = A.metrics_frame([r], derived=False)
    assert set(base["metric"]) == {"role_flow"}
    assert A.metrics_frame([]).empty
    assert list(A.metrics_frame([]).columns) == list(A.COLUMNS)
