"""Streaming metrics on a tiny model equal the same metrics computed by hand from full maps."""

from __future__ import annotations

import math

import pytest
import torch

from anchorlens.capture.collect import collect_maps, encode_batches
from anchorlens.methods.spec import load_guided
from anchorlens.roles.kinds import Role
from anchorlens.workflows.inputs import resolve_inputs
from anchorlens.workflows.statistics import capture_statistics


@pytest.fixture(scope="module")
def measured(tiny_base):
    model = load_guided("instance", tiny_base("tiny-llama"))
    inputs = resolve_inputs("rte", None, 3)
    metrics = capture_statistics(model, inputs, batch_size=2)
    batches = encode_batches(model, inputs.examples, inputs.task.template, batch_size=3)
    maps = {m.example_id: m["decoder"] for m in collect_maps(model, batches, max_examples=3)}
    return metrics, maps


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


def test_role_flow_first_token_and_entropy_match_hand_computation(measured):
    metrics, maps = measured
    for example, sm in maps.items():
        q_roles, k_roles = sm.q_roles.tolist(), sm.k_roles.tolist()
        assert k_roles[0] == Role.INSTANCE  # the instance token is position 0
        content = [i for i, r in enumerate(q_roles) if r == Role.CONTENT]
        structural_keys = torch.tensor([r == Role.STRUCTURAL for r in k_roles])
        for layer in (0, 3):
            for head in (0, 2):
                p = sm.probs[sm.layers.index(layer), sm.heads.index(head)].double()  # [Q, K]
                flow = p[content][:, structural_keys].sum(-1).mean().item()
                assert _value(metrics, "role_flow", example, layer, head, "content", "structural") == pytest.approx(
                    flow, abs=1e-6
                )
                first = p[content][:, 0].mean().item()
                assert _value(metrics, "first_token_mass", example, layer, head, "content") == pytest.approx(
                    first, abs=1e-6
                )
                ent = []
                for q in range(p.shape[0]):
                    row = p[q, : q + 1]
                    h = -(row * row.clamp_min(1e-300).log()).sum().item()
                    ent.append(0.0 if q == 0 else h / math.log(q + 1))
                assert _value(metrics, "entropy", example, layer, head, "all") == pytest.approx(
                    sum(ent) / len(ent), abs=1e-5
                )


def test_anchor_mass_to_instance_pools_input_queries(measured):
    metrics, maps = measured
    example, sm = next(iter(maps.items()))
    inputs = [i for i, r in enumerate(sm.q_roles.tolist()) if r in (Role.SPECIAL, Role.STRUCTURAL, Role.CONTENT)]
    p = sm.probs[sm.layers.index(1), sm.heads.index(1)].double()
    expected = p[inputs][:, 0].mean().item()
    got = _value(metrics, "anchor_mass", example, 1, 1, "input", "instance")
    assert got == pytest.approx(expected, abs=1e-6)


def test_checkpoint_names_are_short_and_unique(tmp_path):
    from anchorlens.workflows.compare import checkpoint_names

    for d in ("prompt100/final", "capsule/final", "solo"):
        (tmp_path / d).mkdir(parents=True)
    specs = ["base", str(tmp_path / "prompt100/final"), str(tmp_path / "capsule/final"), str(tmp_path / "solo"), "base"]
    assert checkpoint_names(specs) == ["base", "prompt100/final", "capsule/final", "solo", "base#2"]


def test_inspect_and_capture_use_the_same_anchor_rule(tiny_base):
    from anchorlens.notebook.inspect import inspect

    model = load_guided("instance:pos=last", tiny_base("tiny-llama"))
    df = inspect(model, "The cat sat on the mat.").metrics()
    # inspect used to take the capsule as entropy anchor, so the instance's rows that capture gives were missing
    assert ((df.metric == "anchor_content_entropy") & (df.query_role == "instance")).any()
