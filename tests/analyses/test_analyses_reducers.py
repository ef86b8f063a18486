"""Metric reducers on hand-built and random attention events."""

from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd
import pytest
import torch
from analyses_helpers import CAP, CON, STR, hand_event, lookup, make_event, random_event, split_event
from hypothesis import given, settings
from hypothesis import strategies as st

import anchorlens.analyses as A
from anchorlens.analyses.registry import make_reducer, reducer_names
from anchorlens.capture.reducer import Reducer


def feed(name: str, events, **options):
    r = make_reducer(name, **options)
    for e in events:
        r.update(e)
    return r


def frames_equal(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), rtol=1e-9, atol=1e-12)


def test_registered_names():
    assert {"role_flow", "first_token", "entropy"} <= set(reducer_names())
    for name in ("role_flow", "first_token", "entropy"):
        reducer = make_reducer(name)
        assert isinstance(reducer, Reducer) and reducer.name == name
        assert list(reducer.frame().columns) == list(A.COLUMNS)


def test_role_flow_hand_computed():
    df = feed("role_flow", [hand_event()]).frame()
    assert list(df.columns) == list(A.COLUMNS)
    assert set(df["head"]) == {5} and set(df["metric"]) == {"role_flow"}
    e0 = dict(example=10)
    assert lookup(df, **e0, query_role="capsule", key_role="capsule") == pytest.approx(1.0)
    assert lookup(df, **e0, query_role="structural", key_role="capsule") == pytest.approx(0.6)
    assert lookup(df, **e0, query_role="structural", key_role="structural") == pytest.approx(0.4)
    assert lookup(df, **e0, query_role="content", key_role="capsule") == pytest.approx(0.3)
    assert lookup(df, **e0, query_role="content", key_role="structural") == pytest.approx(0.2)
    assert lookup(df, **e0, query_role="content", key_role="content") == pytest.approx(0.5)
    assert lookup(df, **e0, query_role="all", key_role="capsule") == pytest.approx(0.55)
    assert lookup(df, **e0, query_role="all", key_role="content") == pytest.approx(0.25)
    e1 = dict(example=11)
    assert lookup(df, **e1, query_role="structural", key_role="structural") == pytest.approx(1.0)
    assert lookup(df, **e1, query_role="soft_prompt", key_role="soft_prompt") == pytest.approx(0.6)
    assert lookup(df, **e1, query_role="capsule", key_role="structural") == pytest.approx(0.2)
    assert lookup(df, **e1, query_role="all", key_role="structural") == pytest.approx(1.6 / 3)
    assert lookup(df, **e1, query_role="all", key_role="special") == 0.0  # padding key not counted
    counts = df.drop_duplicates(["example", "query_role"]).set_index(["example", "query_role"])["count"]
    assert counts[(10, "content")] == 2 and counts[(10, "all")] == 4 and counts[(11, "all")] == 3
    assert (11, "special") not in counts.index  # the padding query is ignored
    assert not df["value"].isna().any()


def test_first_token_left_padding():
    df = feed("first_token", [hand_event()]).frame()
    assert set(df["metric"]) == {"first_token_mass"} and set(df["key_role"]) == {""}
    assert lookup(df, example=10, query_role="all") == pytest.approx(2.2 / 4)
    assert lookup(df, example=10, query_role="content") == pytest.approx(0.3)
    # example 11: the first valid key is index 1, not the padding at index 0
    assert lookup(df, example=11, query_role="all") == pytest.approx(1.6 / 3)
    assert lookup(df, example=11, query_role="capsule") == pytest.approx(0.2)


def test_first_token_anchor_position():
    df = feed("first_token", [hand_event()], anchor_position=1).frame()
    assert lookup(df, example=10, query_role="all") == pytest.approx((0 + 0.4 + 0.2 + 0.2) / 4)
    assert lookup(df, example=11, query_role="all") == pytest.approx((0 + 0.6 + 0.3) / 3)
    last = feed("first_token", [hand_event()], anchor_position=-1).frame()
    assert lookup(last, example=10, query_role="all") == pytest.approx(0.4 / 4)
    far = feed("first_token", [hand_event()], anchor_position=3).frame()
    assert set(far["example"]) == {10}  # example 11 has only 3 valid keys


def test_anchor_key_index():
    valid = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]]).bool()
    idx, found = A.anchor_key_index(valid, 0)
    assert idx[:2].tolist() == [2, 0] and found.tolist() == [True, True, False]
    idx, found = A.anchor_key_index(valid, -1)
    assert idx[:2].tolist() == [3, 3]


def entropy_of(*p):
    p = np.asarray(p)
    return float(-(p * np.log(p)).sum())


def test_entropy_hand_computed():
    df = feed("entropy", [hand_event()]).frame()
    ent = df[df["metric"] == "entropy"]
    ex0 = [
        0.0,
        entropy_of(0.6, 0.4) / math.log(2),
        entropy_of(0.5, 0.2, 0.3) / math.log(3),
        entropy_of(0.1, 0.2, 0.3, 0.4) / math.log(4),
    ]
    assert lookup(ent, example=10, query_role="capsule") == 0.0  # one visible key -> 0
    assert lookup(ent, example=10, query_role="content") == pytest.approx((ex0[2] + ex0[3]) / 2)
    assert lookup(ent, example=10, query_role="all") == pytest.approx(sum(ex0) / 4)
    ex1 = [0.0, entropy_of(0.4, 0.6) / math.log(2), entropy_of(0.2, 0.3, 0.5) / math.log(3)]
    assert lookup(ent, example=11, query_role="all") == pytest.approx(sum(ex1) / 3)
    # neither capsule query sees a content key: no anchor_content_entropy rows
    assert df[df["metric"] == "anchor_content_entropy"].empty


def test_anchor_content_entropy():
    roles = torch.tensor([[CON, CON, STR, CAP], [CON, CAP, STR, STR]])
    vis = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    probs = torch.zeros(2, 1, 4, 4)
    probs[:, 0, :, 0] = 1.0
    probs[0, 0, 3] = torch.tensor([0.1, 0.3, 0.2, 0.4])  # capsule: content part [0.25, 0.75]
    probs[1, 0, 1] = torch.tensor([0.0, 0.0, 0.5, 0.5])  # capsule with no mass on content
    ev = make_event(probs, roles, visible=vis)
    df = feed("entropy", [ev]).frame()
    ace = df[df["metric"] == "anchor_content_entropy"]
    assert list(ace["example"]) == [0]  # example 1's capsule puts no mass on content: left out
    row = ace.iloc[0]
    assert (row["query_role"], row["key_role"]) == ("capsule", "content")
    assert row["value"] == pytest.approx(entropy_of(0.25, 0.75) / math.log(2))
    all_roles = feed("entropy", [ev], anchor_role=None).frame()
    assert set(all_roles[all_roles["metric"] == "anchor_content_entropy"]["query_role"]) == {
        "content",
        "capsule",
        "structural",
    }
    inst = feed("entropy", [ev], anchor_role="instance").frame()
    assert inst[inst["metric"] == "anchor_content_entropy"].empty


@pytest.mark.parametrize("t", [2, 5, 9])
def test_uniform_rows_entropy_one(t):
    b, h = 3, 2
    probs = torch.full((b, h, t, t), 1.0 / t)
    ev = make_event(probs, torch.randint(0, 6, (b, t), generator=torch.Generator().manual_seed(t)))
    ent = feed("entropy", [ev], anchor_role=None).frame()
    vals = ent[ent["metric"] == "entropy"]["value"]
    assert np.allclose(vals, 1.0, atol=1e-5)


def test_one_hot_rows_entropy_zero():
    b, h, t = 2, 3, 6
    probs = torch.nn.functional.one_hot(torch.randint(0, t, (b, h, t)), t).float()
    ev = make_event(probs, torch.randint(0, 6, (b, t)))
    ent = feed("entropy", [ev]).frame()
    assert np.allclose(ent["value"], 0.0, atol=1e-6)


def test_visible_broadcast_equals_per_example():
    ev = random_event(3, b=4, t=6, lengths=[6, 6, 6, 6])
    vis1 = ev.visible[:1]
    ev1 = type(ev)(ev.stack, ev.layer, ev.heads, ev.probs, vis1, ev.layout, ev.example_ids)
    for name in ("role_flow", "first_token", "entropy"):
        frames_equal(feed(name, [ev]).frame(), feed(name, [ev1]).frame())


ALL_NAMES = ("role_flow", "first_token", "entropy")


def batches():
    """The same 12 examples at two sites, as one list of events."""
    full = [
        random_event(s, b=12, t=8, layer=layer, example_ids=list(range(100, 112)), nan_padding=True)
        for s, layer in ((1, 0), (2, 3))
    ]
    return full


@pytest.mark.parametrize("name", ALL_NAMES)
def test_batch_size_and_order_invariance(name):
    full = batches()
    one = feed(name, full).frame()
    rng = np.random.default_rng(0)
    pieces = []
    for ev in full:
        perm = rng.permutation(12)
        for chunk in np.array_split(perm, 5):
            pieces.append(split_event(ev, chunk.tolist()))
    rng.shuffle(pieces)
    frames_equal(one, feed(name, pieces).frame())


@pytest.mark.parametrize("name", ALL_NAMES)
def test_merge_equals_single_reducer(name):
    full = batches()
    pieces = [split_event(ev, idx) for ev in full for idx in ([0, 1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11])]
    single = feed(name, pieces)
    a, b = feed(name, pieces[::2]), feed(name, pieces[1::2])
    b.merge(a)
    frames_equal(single.frame(), b.frame())
    empty = make_reducer(name)
    empty.merge(single)
    frames_equal(single.frame(), empty.frame())


def test_merge_rejects_other_kinds():
    with pytest.raises(TypeError):
        make_reducer("role_flow").merge(make_reducer("entropy"))
    with pytest.raises(ValueError):
        make_reducer("first_token").merge(make_reducer("first_token", anchor_position=2))


@pytest.mark.parametrize("name", ALL_NAMES)
def test_state_dict_round_trip(name):
    full = batches()
    r = feed(name, full[:1])
    buf = io.BytesIO()
    torch.save(r.state_dict(), buf)
    buf.seek(0)
    fresh = make_reducer(name)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    frames_equal(r.frame(), fresh.frame())
    r.update(full[1])
    fresh.update(full[1])
    frames_equal(r.frame(), fresh.frame())
    with pytest.raises(ValueError):
        make_reducer("role_flow" if name != "role_flow" else "entropy").load_state_dict(r.state_dict())


def test_heads_from_different_events_and_repeated_examples():
    a = random_event(5, b=2, h=2, heads=[0, 1])
    b = random_event(6, b=2, h=2, heads=[7, 1])
    df = feed("role_flow", [a, b]).frame()
    assert sorted(set(df["head"])) == [0, 1, 7]
    # head 1 got both events of the same examples: counts add up
    count = {h: df[(df["head"] == h) & (df["query_role"] == "all")]["count"].sum() for h in (0, 1, 7)}
    assert count[1] == count[0] + count[7] and count[0] > 0 and count[7] > 0


def test_fully_padded_example_gives_no_rows():
    ev = random_event(8, b=3, lengths=[0, 4, 7], nan_padding=True, example_ids=[1, 2, 3])
    for name in ALL_NAMES:
        df = feed(name, [ev]).frame()
        assert 1 not in set(df["example"])
        assert not df["value"].isna().any()


def test_average_heads():
    df = feed("role_flow", [random_event(9, h=3)]).frame()
    avg = A.average_heads(df)
    assert avg["head"].isna().all() and str(avg["head"].dtype) == "Int64"
    assert list(avg.columns) == list(A.COLUMNS)
    one = avg.iloc[0]
    sel = df[
        (df["example"] == one["example"])
        & (df["query_role"] == one["query_role"])
        & (df["key_role"] == one["key_role"])
    ]
    assert one["value"] == pytest.approx(sel["value"].mean())


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    b=st.integers(1, 4),
    h=st.integers(1, 3),
    t=st.integers(1, 9),
    left=st.booleans(),
    causal=st.booleans(),
    nan_pad=st.booleans(),
    scale=st.sampled_from([0.0, 1.0, 30.0]),
)
def test_properties(seed, b, h, t, left, causal, nan_pad, scale):
    ev = random_event(seed, b=b, h=h, t=t, left_pad=left, causal=causal, nan_padding=nan_pad, scale=scale)
    df = A.metrics_frame([feed(n, [ev]) for n in ALL_NAMES], anchors=("capsule", "first_token"))
    assert not df["value"].isna().any()
    assert ((df["value"] >= -1e-9) & (df["value"] <= 1 + 1e-6)).all()
    assert (df["count"] > 0).all()
    flow = df[df["metric"] == "role_flow"]
    if not flow.empty:
        sums = flow.groupby(["example", "layer", "head", "query_role"])["value"].sum()
        assert np.allclose(sums, 1.0, atol=1e-5)  # every valid query sees at least itself
    n_valid = ev.layout.q.valid.sum(1)
    ex_with_queries = set(ev.example_ids[n_valid > 0].tolist())
    assert set(df["example"]) == ex_with_queries


def test_make_reducer_works_in_a_fresh_process():
    """Bug (issue 10): make_reducer("role_flow") said "none registered" unless analyses was imported."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "from anchorlens.analyses.registry import make_reducer\n"
        "print(*(make_reducer(n).name for n in ('role_flow', 'first_token', 'entropy')))"
    )
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, check=True)
    assert out.stdout.split() == ["role_flow", "first_token", "entropy"]


def test_unknown_reducer_name_is_unknown_name_error():
    from anchorlens.errors import UnknownNameError

    with pytest.raises(UnknownNameError, match=r"unknown reducer 'nope': choose one of .*role_flow"):
        make_reducer("nope")


@pytest.mark.parametrize("name", ["role_flow", "first_token", "entropy"])
def test_shifted_scores_give_the_same_state_as_probabilities_alone(name):
    """Captured events carry shifted logits (entropy without a logarithm); the result equals xlogy on probs."""
    from dataclasses import replace

    from anchorlens.engine.call import AttentionCall
    from anchorlens.engine.probs import chunk_probs

    event = random_event(seed=3)
    b, h, q, k = event.probs.shape
    g = torch.Generator().manual_seed(0)
    query, key = torch.randn(b, h, q, 8, generator=g) * 2, torch.randn(b, h, k, 8, generator=g) * 2
    mask = event.visible.expand(b, 1, q, k)
    call = AttentionCall(query, key, key, mask, 0.5, False, None, None, None, None)
    probs, scores, log_norm, _ = chunk_probs(call, 0, q, None)
    with_scores = replace(event, probs=probs, scores=scores, log_norm=log_norm, cache={})
    without = replace(event, probs=probs, scores=None, log_norm=None, cache={})
    a, b_ = feed(name, [with_scores]).frame(), feed(name, [without]).frame()
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b_.reset_index(drop=True), rtol=0, atol=2e-6)
