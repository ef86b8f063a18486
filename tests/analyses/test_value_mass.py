"""Value-aware (norm-based) mass against a reference built by hand from the tiny model's own v_proj and o_proj."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from anchorlens.analyses import default_reducers
from anchorlens.analyses.value_mass import ValueMassReducer
from anchorlens.capture.collect import stream_statistics
from anchorlens.capture.options import CaptureOptions
from anchorlens.errors import UsageError
from anchorlens.roles.table import BUILTIN_ROLES
from anchorlens.tasks import bundled_examples, get_task
from tests.capture.helpers import eager_attentions


def _batch(base, padding_side: str, n: int = 4):
    task = get_task("rte")
    base.tokenizer.padding_side = padding_side
    try:
        return base.encode([task.template.render(ex) for ex in bundled_examples("rte")[:n]])
    finally:
        base.tokenizer.padding_side = "right"


def _reference(base, batch) -> dict:
    """(layer, example, head, key label) -> mean over valid queries of sum_{j in part} A(i, j) ||v_j W_O^h||, and
    (layer, example, head, "total")."""
    model = base.model
    with torch.no_grad():
        states = base.forward(batch, output_hidden_states=True).hidden_states
    maps = eager_attentions(base, batch)["decoder"]
    layers = model.model.layers
    cfg = model.config
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    out = {}
    for layer, probs in maps.items():
        block = layers[layer]
        with torch.no_grad():
            v = block.self_attn.v_proj(block.input_layernorm(states[layer]))  # [B, T, H_kv * D]
        v = v.view(*v.shape[:2], kv, d).double()
        w = block.self_attn.o_proj.weight.double()  # [d_model, H * D]
        for row, example in enumerate(batch.example_ids.tolist()):
            valid = batch.attention_mask[row].bool()
            roles = batch.roles[row][valid]
            for h in range(heads):
                f = v[row][valid][:, h // (heads // kv)] @ w[:, h * d : (h + 1) * d].T  # [n, d_model]: v_j W_O^h
                norms = f.norm(dim=-1)  # [n]
                a = probs[row, h][valid][:, valid].double()  # [n, n]
                contribution = a * norms  # ||A(i, j) v_j W_O^h||
                total = contribution.sum(1)
                out[layer, example, h, "total"] = float(total.mean())
                for r, name in enumerate(BUILTIN_ROLES.names):
                    mass = contribution[:, roles == r].sum(1)
                    out[layer, example, h, name] = (float(mass.mean()), float((mass / total).mean()))
                first = contribution[:, 0]
                out[layer, example, h, "first_token"] = (float(first.mean()), float((first / total).mean()))
    return out


@pytest.mark.parametrize(
    ("name", "padding_side"),
    [
        ("tiny-mistral", "left"),  # grouped heads, a sliding window, left padding: the quick check
        pytest.param("tiny-mistral", "right", marks=pytest.mark.slow),
        pytest.param("tiny-llama", "left", marks=pytest.mark.slow),
        pytest.param("tiny-llama", "right", marks=pytest.mark.slow),
    ],
)
def test_norm_mass_equals_the_hand_reference_in_query_chunks(tiny_base, name, padding_side):
    base = tiny_base(name)
    batch = _batch(base, padding_side)
    ref = _reference(base, batch)
    reducer = ValueMassReducer()
    reducers = [*default_reducers(), reducer]
    stream_statistics(base, [batch], reducers, options=CaptureOptions(mode="fast", memory_budget=40_000))
    frame = reducer.frame()
    rows = frame[frame["query_role"] == "all"].set_index(["layer", "example", "head", "metric", "key_role"])["value"]
    checked = 0
    for (layer, example, head, key), expected in ref.items():
        if key == "total":
            assert rows[layer, example, head, "norm_total", ""] == pytest.approx(expected, rel=1e-4)
            continue
        mass, share = expected
        if (layer, example, head, "norm_mass", key) not in rows.index:
            assert mass == 0.0  # a role the example has not got
            continue
        assert rows[layer, example, head, "norm_mass", key] == pytest.approx(mass, rel=1e-4, abs=1e-7)
        assert rows[layer, example, head, "norm_share", key] == pytest.approx(share, rel=1e-4, abs=1e-7)
        checked += 1
    assert checked > 0
    # the norm shares of the roles sum to 1 per query, so their means do too
    shares = frame[(frame["metric"] == "norm_share") & frame["key_role"].isin(BUILTIN_ROLES.names)]
    sums = shares.groupby(["layer", "example", "head", "query_role"])["value"].sum()
    assert np.allclose(sums.to_numpy(), 1.0, atol=1e-5)
    # next to the weight-based mass: the same queries, the same roles
    flow = [r for r in reducers if r.name == "role_flow"][0].frame()
    assert set(map(tuple, flow[["layer", "example", "head", "query_role"]].drop_duplicates().to_numpy())) >= set(
        map(tuple, shares[["layer", "example", "head", "query_role"]].drop_duplicates().to_numpy())
    )


def test_state_merges_like_every_reducer(tiny_base):
    base = tiny_base("tiny-llama")
    task = get_task("rte")
    rendered = [task.template.render(ex) for ex in bundled_examples("rte")[:4]]
    whole, one, two = ValueMassReducer(), ValueMassReducer(), ValueMassReducer()
    stream_statistics(base, [base.encode(rendered, example_ids=[0, 1, 2, 3])], [whole])
    stream_statistics(base, [base.encode(rendered[:2], example_ids=[0, 1])], [one])
    stream_statistics(base, [base.encode(rendered[2:], example_ids=[2, 3])], [two])
    one.merge(two)
    key = ["layer", "example", "head", "metric", "query_role", "key_role"]
    a = whole.frame().sort_values(key).reset_index(drop=True)
    b = one.frame().sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(a.drop(columns="value"), b.drop(columns="value"))
    assert np.allclose(a["value"], b["value"], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(
    "name",
    [
        "tiny-bert",  # BERT's output projection lives outside its self-attention module
        "tiny-qwen3-5-text",  # Qwen3.5 multiplies each head's output by a query-dependent gate before o_proj
    ],
)
def test_a_model_whose_output_is_not_per_head_is_refused_in_one_line(tiny_base, name):
    base = tiny_base(name)
    batch = _batch(base, "right", n=2)
    with pytest.raises(UsageError, match="cannot be decomposed per head") as info:
        stream_statistics(base, [batch], [ValueMassReducer()])
    assert "\n" not in str(info.value)
