"""Workflows read the headline from analyses.headline: decomposition, mask-fixed values, no duplicates."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from anchorlens.analyses.frames import ROW_KEYS
from anchorlens.analyses.headline import HEADLINE, SINK_MASS

pytestmark = pytest.mark.slow  # tiny-llama captures (compare, positions, sweeps): seconds each


@pytest.fixture(scope="module")
def comparison(tiny_base):
    from anchorlens.workflows.compare import compare

    tiny_base("tiny-llama")  # converted once per session
    return compare(["base", "instance"], base="tiny-llama", n=3, n_boot=100)


def test_positions_writes_each_row_once(tiny_base):
    from anchorlens.workflows.positions import sweep_positions

    tiny_base("tiny-llama")
    sweep = sweep_positions("instance", ["first", "last"], base="tiny-llama", n=2, batch_size=2)
    keys = [*ROW_KEYS, "position"]
    assert not sweep.metrics.duplicated(keys).any()  # anchor_mass/anchor_structural were written twice
    s = sweep.summary.set_index(["position", "metric"])
    # instance at first: its own attention can only see itself; at last the input cannot see it
    assert s.loc[("first", "anchor_structural"), "fixed"].startswith("fixed by the causal mask")
    assert np.isnan(s.loc[("first", "anchor_structural"), "mean"])
    assert s.loc[("last", "anchor_mass"), "fixed"].startswith("fixed by the causal mask")
    assert s.loc[("last", "anchor_structural"), "fixed"] == "" and np.isfinite(
        s.loc[("last", "anchor_structural"), "mean"]
    )
    assert s.loc[("first", "anchor_mass"), "fixed"] == "" and 0 < s.loc[("first", "anchor_mass"), "mean"] < 1


def test_instance_token_takes_mass_from_the_sink_at_layer_0(comparison):
    # layer 0: input tokens' keys are unchanged by a token inserted before them (RoPE is relative), so
    # an extra key can only lower every input query's mass on the sink.
    m = comparison.metrics
    sink = SINK_MASS.rows(m)
    sink = sink[(sink.layer == 0)].pivot_table(index=["example", "head"], columns="checkpoint", values="value")
    assert (sink["instance"] < sink["base"] - 1e-6).all()


def test_compare_headline_is_the_decomposition_with_fixed_values_flagged(comparison, tmp_path):
    from anchorlens.reports.comparison import write_comparison

    h = comparison.headline
    names = set(h.name)
    assert {m.name for m in HEADLINE if m.name not in ("island", "guidance_entropy")} <= names
    base = h[h.checkpoint == "base"].set_index("name")
    parts = ["sink", "guidance", "structural", "content", "special"]
    assert base.loc[parts, "mean"].sum() == pytest.approx(1.0, abs=1e-6)  # the parts of input attention add up
    inst = h[h.checkpoint == "instance"].set_index("name")
    assert inst.loc[parts, "mean"].sum() == pytest.approx(1.0, abs=1e-6)
    assert inst.loc["island", "fixed"].startswith("fixed by the causal mask") and np.isnan(inst.loc["island", "mean"])
    assert inst.loc["anchor_structural:instance", "fixed"] != ""
    assert inst.loc["absorption", "fixed"] == "" and inst.loc["absorption", "mean"] > 0
    assert inst.loc["sink", "diff"] < 0
    out = write_comparison(comparison, tmp_path / "run")
    summary = (out / "summary.md").read_text()
    assert "n/a (fixed by the causal mask)" in summary and "input → sink" in summary
    assert "island score (guidance → guidance) of instance: n/a" in summary
    head = pd.read_csv(out / "headline.csv", keep_default_na=False, na_values=[""])
    assert {"ci_lo", "ci_hi", "diff_lo", "diff_hi", "fixed"} <= set(head.columns)


def test_input_entropy_leaves_out_single_key_queries(comparison):
    # base: the BOS query at position 0 sees one key (entropy 0 by definition); an inserted instance
    # token gives it two. Pooling it would report an entropy change that is only the mask's doing.
    m = comparison.metrics
    m = m[(m.metric == "entropy") & (m.checkpoint == "base") & m["head"].notna()]
    per = m[m.query_role.isin(["structural", "content"])].assign(w=lambda d: d.value * d["count"])
    per = per.groupby(["example", "layer", "head"]).agg(w=("w", "sum"), c=("count", "sum"))
    pooled = m[m.query_role == "input"].set_index(["example", "layer", "head"])["value"]
    np.testing.assert_allclose(pooled.sort_index(), (per.w / per.c).sort_index(), rtol=1e-12)
    assert m[m.query_role == "special"]["fixed"].str.contains("single key").all()


def test_sweep_instance_needs_a_spec_and_uses_the_stats_module_ci(tiny_base):
    import inspect

    from anchorlens.analyses.stats import bootstrap_ci
    from anchorlens.evaluation import predict
    from anchorlens.methods.spec import load_guided
    from anchorlens.workflows.inputs import resolve_inputs
    from anchorlens.workflows.sweeps import sweep_instance

    sig = inspect.signature(sweep_instance)
    assert sig.parameters["spec"].default is inspect.Parameter.empty
    assert "prompt-tuned" in sweep_instance.__doc__
    base = tiny_base("tiny-llama")
    table = sweep_instance("prompt:n=2", "rte", None, [0], ["first"], base=base, n=4, batch_size=4)
    assert {"ci_lo", "ci_hi"} <= set(table.columns) and "ci_low" not in table.columns
    preds = predict(load_guided("prompt:n=2", base), resolve_inputs("rte", None, 4).examples, "rte", batch_size=4)
    _, lo, hi = bootstrap_ci(preds["correct"].astype(float).to_numpy())
    assert (table["ci_lo"].iloc[0], table["ci_hi"].iloc[0]) == pytest.approx((lo, hi))
