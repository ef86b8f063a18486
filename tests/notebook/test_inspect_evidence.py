"""inspect(evidence=...): the evidence reducers' frames, and weight vs norm of the first token and the anchor."""

from __future__ import annotations

import pytest

from anchorlens.errors import UsageError
from anchorlens.models.loading import load_base
from anchorlens.notebook.inspect import inspect

EXAMPLE = {"premise": "A cat sat on the warm mat.", "hypothesis": "A cat is sitting."}
GUIDANCE = (3, 4, 5)  # soft_prompt, instance, capsule role ids


@pytest.fixture(scope="module")
def view():
    return inspect("instance", EXAMPLE, base=load_base("tiny-llama"), task="rte", evidence="all")


def test_the_evidence_frames_are_exposed(view):
    assert {"norm_share", "norm_mass", "norm_total"} <= set(view.value_mass.metric)
    assert {"sink_alpha_first", "sink_rate@0.3"} <= set(view.sink_battery.metric)
    assert "massive_count" in set(view.massive_activations.metric)
    assert view.value_mass["head"].notna().all()  # per head


def test_first_token_weight_equals_the_maps(view):
    sm = view.maps["decoder"]
    inputs = ~sum(sm.q_roles == g for g in GUIDANCE).bool()  # [Q] non-guidance queries
    direct = sm.probs.double()[:, :, inputs, 0].mean(dim=(1, 2))  # [L]: per layer, mean over heads and queries
    table = view.evidence_table()
    weight = table[(table.measure == "weight") & (table.key == "first_token")]
    assert weight[weight.layer.isna()]["value"].item() == pytest.approx(float(direct.mean()), abs=1e-6)
    per_layer = weight.dropna(subset=["layer"]).set_index("layer")["value"]
    for layer, value in enumerate(direct.tolist()):
        assert per_layer.loc[layer] == pytest.approx(value, abs=1e-6)


def test_summary_and_html_show_weight_and_norm_of_the_first_token_and_the_anchor(view):
    table = view.evidence_table()
    overall = table[table.layer.isna()].set_index(["measure", "key"])["value"]
    text = view.summary()
    for key in ("first_token", "instance"):
        line = f"input → {key}: {overall[('weight', key)]:.3f} by weight, {overall[('norm', key)]:.3f} by norm"
        assert line in text
    assert "sink_rate@0.3" in text
    html = view._repr_mimebundle_()["text/html"]
    assert 'class="anchorlens-evidence"' in html and "by norm" in html


def test_without_evidence_the_frames_name_the_fix_and_bad_specs_are_refused():
    plain = inspect("base", "A short text.", base=load_base("tiny-llama"))
    with pytest.raises(UsageError, match="evidence="):
        _ = plain.value_mass
    assert "by norm" not in plain.summary()
    with pytest.raises(UsageError, match="unknown reducer"):
        inspect("base", "A short text.", base=load_base("tiny-llama"), evidence="bogus")
