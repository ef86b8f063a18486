"""The sink-aware decomposition: sums to 1 per query, equals hand computation from full maps,
and metrics the causal mask fixes are flagged, not reported."""

from __future__ import annotations

import math

import pytest
import torch
from analyses_helpers import make_event, random_event
from hypothesis import given, settings
from hypothesis import strategies as st

from anchorlens.analyses import structural_attention
from anchorlens.analyses.decomposition import DecompositionReducer
from anchorlens.analyses.registry import make_reducer
from anchorlens.capture.event import AttentionEvent
from anchorlens.roles.kinds import Role
from anchorlens.roles.layout import Layout, SequenceRoles

INPUT = (Role.SPECIAL, Role.STRUCTURAL, Role.CONTENT)


def _query_slice(event: AttentionEvent, lo: int, hi: int) -> AttentionEvent:
    """The same event restricted to queries lo:hi (keys unchanged), as a chunked capture hands it."""
    q = SequenceRoles(event.layout.q.roles[:, lo:hi], event.layout.q.valid[:, lo:hi])
    return AttentionEvent(
        event.stack,
        event.layer,
        event.heads,
        event.probs[:, :, lo:hi],
        event.visible[:, :, lo:hi],
        Layout(q, event.layout.k),
        event.example_ids,
    )


def _parts(df):
    d = df[(df.metric == "decomposition") & (df.key_role != "guidance")]
    return d.groupby(["example", "layer", "head", "query_role"]).value.sum()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), t=st.integers(1, 9), b=st.integers(1, 4))
def test_parts_sum_to_one_per_query_group(seed, t, b):
    r = make_reducer("decomposition")
    r.update(random_event(seed, b=b, h=2, t=t, nan_padding=seed % 2 == 0))
    sums = _parts(r.frame())
    assert ((sums - 1.0).abs() < 1e-6).all(), sums


def test_each_query_sums_to_one_and_query_chunks_add_up():
    event = random_event(3, b=3, h=2, t=8, lengths=[8, 5, 3])
    whole = make_reducer("decomposition")
    whole.update(event)
    chunked = make_reducer("decomposition")
    for lo, hi in ((0, 3), (3, 4), (4, 8)):
        chunked.update(_query_slice(event, lo, hi))
    a, b = whole.frame(), chunked.frame()
    # float32 per-query mass summed over each chunk's queries in float32, then in float64 across chunks
    assert len(a) == len(b) and (a.value - b.value).abs().max() < 1e-6
    # one query at a time: every single valid input query's parts sum to 1
    for q in range(8):
        one = make_reducer("decomposition")
        one.update(_query_slice(event, q, q + 1))
        sums = _parts(one.frame())
        assert ((sums - 1.0).abs() < 1e-6).all()


def test_sink_is_first_input_key_not_guidance():
    # keys: [instance, structural(sink), content, content]; one content query row by hand
    probs = torch.tensor([[[[1, 0, 0, 0], [0.3, 0.7, 0, 0], [0.2, 0.5, 0.3, 0], [0.4, 0.1, 0.2, 0.3]]]])
    roles = torch.tensor([[Role.INSTANCE, Role.STRUCTURAL, Role.CONTENT, Role.CONTENT]])
    visible = torch.ones(4, 4, dtype=torch.bool).tril()[None, None]
    r = DecompositionReducer()
    r.update(make_event(probs, roles, visible=visible))
    df = r.frame()

    def get(q, k):
        return float(df[(df.metric == "decomposition") & (df.query_role == q) & (df.key_role == k)].value.iloc[0])

    # input queries 1..3: sink (key 1) = (0.7 + 0.5 + 0.1) / 3; instance = (0.3 + 0.2 + 0.4) / 3
    assert get("input", "sink") == pytest.approx(1.3 / 3)
    assert get("input", "instance") == pytest.approx(0.9 / 3)
    assert get("input", "guidance") == pytest.approx(0.9 / 3)
    assert get("input", "structural") == pytest.approx(0.0)  # the only structural key is the sink
    assert get("input", "content") == pytest.approx(0.8 / 3)  # 0.3 + (0.2 + 0.3)
    share = df[(df.metric == "visible_share") & (df.query_role == "input") & (df.key_role == "instance")]
    assert float(share.value.iloc[0]) == pytest.approx(3 / 9)  # 3 of the 9 visible (query, key) pairs


def test_state_round_trip_and_merge():
    e1, e2 = random_event(1, example_ids=[0, 1, 2]), random_event(2, example_ids=[2, 3, 4])
    a = make_reducer("decomposition")
    a.update(e1)
    b = make_reducer("decomposition")
    b.update(e2)
    a.merge(b)
    c = make_reducer("decomposition")
    c.load_state_dict(a.state_dict())
    whole = make_reducer("decomposition")
    whole.update(e1)
    whole.update(e2)
    for other in (a, c):
        x, y = whole.frame(), other.frame()
        assert len(x) == len(y) and (x.value - y.value).abs().max() < 1e-12


# -- real capture on tiny-llama: parts equal hand computation from full maps ---------------------


@pytest.fixture(scope="module")
def measured(tiny_base):
    from anchorlens.capture.collect import collect_maps, encode_batches
    from anchorlens.methods.spec import load_guided
    from anchorlens.workflows.inputs import resolve_inputs
    from anchorlens.workflows.statistics import capture_statistics

    inputs = resolve_inputs("rte", None, 2)
    out = {}
    for spec in ("instance", "instance:pos=last", "prompt:n=3"):
        model = load_guided(spec, tiny_base("tiny-llama"))
        metrics = capture_statistics(model, inputs, batch_size=2)
        batches = encode_batches(model, inputs.examples, inputs.task.template, batch_size=2)
        maps = {m.example_id: m["decoder"] for m in collect_maps(model, batches, max_examples=2)}
        out[spec] = (metrics, maps)
    return out


def _value(df, metric, example, layer, head, q, k=""):
    row = df[
        (df.metric == metric)
        & (df.example == example)
        & (df.layer == layer)
        & (df["head"] == head)
        & (df.query_role == q)
        & (df.key_role == k)
    ]
    assert len(row) == 1, (metric, q, k, len(row))
    return float(row.value.iloc[0])


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["instance", "prompt:n=3"])
def test_decomposition_equals_hand_computation_from_maps(measured, spec):
    metrics, maps = measured[spec]
    pooled = structural_attention(metrics, query_roles=INPUT)
    for example, sm in maps.items():
        q_roles, k_roles = sm.q_roles.tolist(), sm.k_roles.tolist()
        inputs = [i for i, r in enumerate(q_roles) if r in INPUT]
        sink = next(i for i, r in enumerate(k_roles) if r in INPUT)
        assert k_roles[0] not in INPUT  # guidance first: the sink is NOT position 0
        for layer in (0, 2):
            for head in (0, 3):
                p = sm.probs[sm.layers.index(layer), sm.heads.index(head)].double()[inputs]  # [Q_in, K]
                parts = {"sink": p[:, sink].mean().item()}
                for role in Role:
                    keys = [k for k, r in enumerate(k_roles) if r == role and k != sink]
                    parts[role.label] = p[:, keys].sum(-1).mean().item() if keys else 0.0
                for label, expected in parts.items():
                    assert _value(metrics, "decomposition", example, layer, head, "input", label) == pytest.approx(
                        expected, abs=1e-6
                    ), label
                assert math.isclose(sum(parts.values()), 1.0, abs_tol=1e-5)
                # structural attention (role_flow) = structural-without-sink (+ the sink when it is structural)
                got = _value(pooled, "structural_attention", example, layer, head, "input", "structural")
                sink_part = parts["sink"] if k_roles[sink] == Role.STRUCTURAL else 0.0
                assert got == pytest.approx(parts["structural"] + sink_part, abs=1e-6)
                # headline entropy pools input queries only
                ent = []
                for q in inputs:
                    row = sm.probs[sm.layers.index(layer), sm.heads.index(head), q].double()
                    row = row[row > 0]
                    n_vis = q + 1  # causal, no padding in per-example maps
                    ent.append(float(-(row * row.log()).sum() / math.log(n_vis)) if n_vis > 1 else 0.0)
                assert _value(metrics, "entropy", example, layer, head, "input") == pytest.approx(
                    sum(ent) / len(ent), abs=1e-5
                )


@pytest.mark.slow
def test_guidance_absorption_is_mass_over_visible_share(measured):
    metrics, maps = measured["instance"]
    example, sm = next(iter(maps.items()))
    q_roles = sm.q_roles.tolist()
    inputs = [i for i, r in enumerate(q_roles) if r in INPUT]
    p = sm.probs[sm.layers.index(1), sm.heads.index(1)].double()
    mass = p[inputs][:, 0].mean().item()
    share = len(inputs) / sum(q + 1 for q in inputs)  # one instance key among q+1 visible keys, pooled
    got = _value(metrics, "guidance_absorption", example, 1, 1, "input", "instance")
    assert got == pytest.approx(mass / share, rel=1e-6)


@pytest.mark.slow
def test_causal_mask_fixed_metrics_are_flagged_not_reported(measured):
    first, _ = measured["instance"]
    for metric, q, k in (("island_score", "guidance", "guidance"), ("anchor_structural", "instance", "structural")):
        rows = first[(first.metric == metric) & (first.query_role == q) & (first.key_role == k)]
        assert len(rows) and rows.value.isna().all() and rows.fixed.str.startswith("fixed by the causal mask").all()
    last, _ = measured["instance:pos=last"]
    rows = last[(last.metric == "anchor_mass") & (last.query_role == "input") & (last.key_role == "instance")]
    assert len(rows) and rows.value.isna().all() and (rows.fixed != "").all()
    # at last the instance token's own attention is free: measured, not flagged
    rows = last[(last.metric == "anchor_structural") & (last.query_role == "instance")]
    assert len(rows) and rows.value.notna().all() and (rows.fixed == "").all()
    measured_rows = first[(first.metric == "decomposition") & (first.query_role == "input")]
    assert (measured_rows.fixed == "").all() and measured_rows.value.notna().all()
