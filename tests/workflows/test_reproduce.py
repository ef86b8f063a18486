"""`anchorlens reproduce`: the smoke plan runs, writes every table, and resumes from its cell cache."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from anchorlens.errors import UsageError
from anchorlens.workflows.reproduce import cell_digest, load_plan, reproduce

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "examples" / "reproduce-smoke.toml"


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, tiny_base):
    tiny_base("tiny-llama")
    out = tmp_path_factory.mktemp("repro") / "run"
    return reproduce(SMOKE, out), out


@pytest.mark.slow
def test_smoke_plan_writes_paper_tables(smoke_run):
    result, out = smoke_run
    for name in ("accuracy", "efficiency", "ablations", "instance_sweep", "positions"):
        assert (out / "tables" / f"{name}.csv").is_file() and (out / "tables" / f"{name}.md").is_file(), name
    acc = pd.read_csv(out / "tables" / "accuracy.csv")
    assert list(acc["method"]) == ["prompt:n=2", "capsule"] and (acc["n"] == 8).all()
    assert ((acc["ci_lo"] <= acc["accuracy"]) & (acc["accuracy"] <= acc["ci_hi"])).all()
    eff = pd.read_csv(out / "tables" / "efficiency.csv")
    assert (eff["num_trainable"] > 0).all() and (eff["time_per_step_s"] > 0).all()
    sweep = pd.read_csv(out / "tables" / "instance_sweep.csv", keep_default_na=False, na_values=[""])
    assert set(sweep["k"]) == {0, 1} and {"ci_lo", "ci_hi", "fixed"} <= set(sweep.columns)
    assert sweep["spec"].str.contains("runs").all()  # the sweep ran on the trained prompt checkpoint
    pos = pd.read_csv(out / "tables" / "positions.csv", keep_default_na=False, na_values=[""])
    first = pos[(pos.position == "first") & (pos.metric == "anchor_structural")]
    assert first["fixed"].str.startswith("fixed by the causal mask").all()
    assert "(paper Table 1's shape)" in (out / "summary.md").read_text()
    cells = list((out / "cells").glob("*.json"))
    assert len(cells) == len(result.ran) == 3 + 2  # 3 training cells + instance sweep + position sweep


@pytest.mark.slow
def test_rerun_reuses_every_cell(smoke_run):
    _, out = smoke_run
    before = {p.name: p.read_text() for p in (out / "cells").glob("*.json")}
    again = reproduce(SMOKE, out)
    assert again.ran == [] and len(again.reused) >= len(before)
    assert {p.name: p.read_text() for p in (out / "cells").glob("*.json")} == before


@pytest.mark.slow
def test_cli_command_on_a_tiny_app(smoke_run):
    from anchorlens.cli import app

    _, out = smoke_run
    result = CliRunner().invoke(app, ["reproduce", str(SMOKE), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "0 cells run" in result.output and "prompt:n=2" in result.output
    bad = CliRunner().invoke(app, ["reproduce", str(out / "missing.toml"), "--out", str(out)])
    assert bad.exit_code == 2 and "no such file" in bad.output


def test_plan_parsing_smoke_overrides_and_digests(tmp_path):
    plan = load_plan(REPO / "examples" / "reproduce-cpu.toml")
    assert (
        [t.name for t in plan.tasks] == ["rte", "cb", "copa", "boolq"]
        and plan.seeds == (0, 1)
        and plan.sweep_seeds == (0,)
    )
    assert plan.tasks[0].data.endswith("shared/data/fewglue/RTE/train.jsonl")
    small = load_plan(REPO / "examples" / "reproduce-cpu.toml", smoke=True)
    assert [t.name for t in small.tasks] == ["rte"] and small.seeds == (0,) and small.budget["steps"] == 2
    assert small.budget["epochs"] == 3 and small.methods == plan.methods  # untouched keys stay
    assert cell_digest({"a": 1, "b": [1, 2]}) == cell_digest({"b": [1, 2], "a": 1}) != cell_digest({"a": 2})
    bad = tmp_path / "bad.toml"
    bad.write_text("[budget]\nstepz = 3\n[[tasks]]\nname='rte'\n[run]\nmethods=['prompt']\n")
    with pytest.raises(UsageError, match="stepz"):
        load_plan(bad)
    assert json.loads(json.dumps(plan.budget))["epochs"] == 3


def test_ablation_and_sweep_seeds_limit_the_costly_cells(tmp_path, monkeypatch, tiny_base):
    import anchorlens.workflows.positions as positions
    import anchorlens.workflows.reproduce as rep
    import anchorlens.workflows.sweeps as sweeps

    tiny_base("tiny-llama")
    trained, swept = [], []

    def fake_trained(plan, task, method, seed, out, base, cache):
        trained.append((method, seed))
        return {
            **{"accuracy": 0.5, "n": 2, "idx": [0, 1], "correct": [True, False], "checkpoint": str(out)},
            **{"num_trainable": 1, "time_per_step_s": 0.1, "peak_rss_mb": 1.0},
        }

    monkeypatch.setattr(rep, "_trained", fake_trained)
    monkeypatch.setattr(sweeps, "sweep_instance", lambda c, *a, **k: swept.append("instance") or pd.DataFrame())

    class _Sweep:
        summary = pd.DataFrame()

    monkeypatch.setattr(positions, "sweep_positions", lambda c, *a, **k: swept.append("positions") or _Sweep())
    plan = tmp_path / "plan.toml"
    plan.write_text(
        "base='tiny-llama'\n[[tasks]]\nname='rte'\n[run]\nmethods=['prompt:n=2','capsule']\nseeds=[0,1]\n"
        "ablations=['capsule:n=2']\nablation_seeds=[1]\nsweep_seeds=[0]\ninstance_on='prompt:n=2'\n"
        "instance_k=[0,1]\npositions_on='capsule'\n"
    )
    parsed = load_plan(plan)
    assert parsed.ablation_seeds == (1,) and parsed.sweep_seeds == (0,)
    result = reproduce(parsed, tmp_path / "out")
    runs = [t for t in trained if t[0] in ("prompt:n=2", "capsule", "capsule:n=2")]
    assert ("capsule:n=2", 1) in runs and ("capsule:n=2", 0) not in runs
    assert swept == ["instance", "positions"]  # sweeps on seed 0 only
    abl = result.tables["ablations"]
    assert list(abl["method"]) == ["prompt:n=2", "capsule", "capsule:n=2"] and (abl["seeds"] == 1).all()
    assert "(ablations: 1) (sweeps: 0)" in (tmp_path / "out" / "summary.md").read_text()
