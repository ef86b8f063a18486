"""``--evidence`` end to end on a tiny base: the evidence rows in metrics.parquet, evidence.csv recomputed
independently from them, paired.csv untouched, the sinks figures, and one-line refusals."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from anchorlens.cli import app

runner = CliRunner()
TINY = ["--base", "tiny-llama", "--n", "5"]
GUIDANCE = {"soft_prompt", "instance", "capsule"}
POOLED = {"all", "input", "guidance", ""}
SPEC = "all,sink_battery:eps=0.1/0.3"


def run(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("evidence")
    args = ["compare", "--ckpt", "base", "--ckpt", "instance", *TINY]
    on = run(*args, "--evidence", SPEC, "--out", str(root / "on"))
    assert on.exit_code == 0, on.output
    off = run(*args, "--no-figures", "--out", str(root / "off"))
    assert off.exit_code == 0, off.output
    return root / "on", root / "off", on.output


@pytest.mark.slow  # two tiny compares (about a minute on two shared cores)
def test_evidence_rows_go_to_metrics_and_the_manifest_records_them(runs):
    on, off, output = runs
    metrics = pd.read_parquet(on / "metrics.parquet")
    names = set(metrics.metric)
    assert {"norm_share", "norm_mass", "sink_alpha_first", "sink_rate@0.1", "sink_rate@0.3", "massive_count"} <= names
    assert not any(
        m.startswith(("norm_", "sink_", "massive_")) for m in pd.read_parquet(off / "metrics.parquet").metric
    )
    manifest = json.loads((on / "manifest.json").read_text())
    assert manifest["evidence"]["sink_battery"] == {"eps": [0.1, 0.3], "top": 3}
    assert set(manifest["evidence"]) == {"sink_battery", "massive_activations", "value_mass"}
    assert "evidence" not in json.loads((off / "manifest.json").read_text())
    assert "input → first_token, by norm" in output  # the all-layers grid is printed


@pytest.mark.slow  # two tiny compares (about a minute on two shared cores)
def test_paired_csv_is_byte_identical_with_and_without_evidence(runs):
    on, off, _ = runs
    assert (on / "paired.csv").read_bytes() == (off / "paired.csv").read_bytes()
    assert (on / "headline.csv").read_bytes() == (off / "headline.csv").read_bytes()
    assert not (off / "evidence.csv").exists()


def _direct(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per checkpoint, example, layer, measure, key: the value, straight from the metric rows (pandas only)."""
    heads = metrics[metrics["head"].notna()]
    # field groups (content:premise ...) split content's queries again: pooling them too would count those twice
    inputs = heads[~heads.query_role.isin(GUIDANCE | POOLED) & ~heads.query_role.str.startswith("content:")]
    out = []

    def pooled(rows, measure, key):
        rows = rows.assign(mass=rows.value * rows["count"])
        per_head = rows.groupby(["checkpoint", "example", "layer", "head"])[["mass", "count"]].sum()
        value = (per_head["mass"] / per_head["count"]).groupby(["checkpoint", "example", "layer"]).mean()
        out.append(value.reset_index(name="value").assign(measure=measure, key=key))

    pooled(inputs[inputs.metric == "first_token_mass"], "weight", "first_token")
    for key in ("first_token", "sink"):
        pooled(inputs[(inputs.metric == "norm_share") & (inputs.key_role == key)], "norm", key)
    instance = inputs[(inputs.key_role == "instance") & (inputs.checkpoint == "instance")]  # the base has none
    pooled(instance[instance.metric == "norm_share"], "norm", "instance")
    pooled(instance[instance.metric == "role_flow"], "weight", "instance")
    sink = heads[(heads.metric == "decomposition") & (heads.query_role == "input") & (heads.key_role == "sink")]
    value = sink.groupby(["checkpoint", "example", "layer"])["value"].mean()
    out.append(value.reset_index(name="value").assign(measure="weight", key="sink"))
    for name in ("sink_rate@0.1", "sink_rate@0.3", "sink_rate_any@0.1", "sink_rate_any@0.3", "massive_count"):
        rows = metrics[metrics.metric == name]
        out.append(rows[["checkpoint", "example", "layer", "value"]].assign(measure=name, key=""))
    return pd.concat(out, ignore_index=True)


@pytest.mark.slow  # two tiny compares (about a minute on two shared cores)
def test_evidence_csv_equals_a_direct_computation_from_the_metric_rows(runs):
    on, _, _ = runs
    table = pd.read_csv(on / "evidence.csv", keep_default_na=False, na_values={"layer": [""]})
    assert list(table.columns) == [
        "checkpoint", "stack", "layer", "measure", "key", "mean", "ci_lo", "ci_hi", "n", "includes"
    ]  # fmt: skip
    direct = _direct(pd.read_parquet(on / "metrics.parquet"))
    per_layer = direct.groupby(["checkpoint", "layer", "measure", "key"])["value"].mean()
    by_example = direct.groupby(["checkpoint", "example", "measure", "key"])["value"]
    overall = by_example.mean().where(
        by_example.mean().index.get_level_values("measure") != "massive_count", by_example.sum()
    )
    overall = overall.groupby(["checkpoint", "measure", "key"]).mean()
    checked = 0
    for row in table.itertuples():
        if pd.isna(row.layer):
            expect = overall.get((row.checkpoint, row.measure, row.key))
        else:
            expect = per_layer.get((row.checkpoint, int(row.layer), row.measure, row.key))
        assert expect is not None, row
        assert row.mean == pytest.approx(expect, rel=1e-9, abs=1e-12), row
        assert row.ci_lo <= row.mean + 1e-12 and row.mean <= row.ci_hi + 1e-12 and row.n == 5
        checked += 1
    assert checked == len(overall) + len(per_layer)  # the table has every direct value, and no other
    assert len(table[table.key == "instance"].checkpoint.unique()) == 1  # the base has no instance token
    assert {"sink_rate@0.1", "sink_rate@0.3", "sink_rate_any@0.3", "massive_count"} <= set(table.measure)


@pytest.mark.slow  # two tiny compares (about a minute on two shared cores)
def test_summary_report_and_figures_show_the_evidence(runs, tmp_path):
    on, _, _ = runs
    summary = (on / "summary.md").read_text()
    assert "## Evidence beyond attention weights" in summary and "input → instance, by norm" in summary
    assert "Evidence beyond attention weights" in (on / "report.html").read_text()
    pngs = {p.stem for p in (on / "figures").glob("*.png")}
    wanted = {f"{m}_{c}" for m in ("sink_alpha", "sink_top_roles", "massive") for c in ("base", "instance")}
    assert wanted | {"sink_rate", "value_mass_first_token", "value_mass_sink", "value_mass_instance"} <= pngs
    redraw = run("figures", str(on), "--out", str(tmp_path / "again"))
    assert redraw.exit_code == 0, redraw.output
    assert {p.stem for p in (tmp_path / "again").glob("*.png")} == pngs


@pytest.mark.slow  # a tiny capture
def test_capture_writes_evidence_rows_and_records_them(tmp_path):
    out = tmp_path / "cap"
    result = run(
        "capture", "--ckpt", "instance", *TINY, "--evidence", "value_mass,sink_battery:eps=0.2", "--out", str(out)
    )
    assert result.exit_code == 0, result.output
    metrics = pd.read_parquet(out / "metrics.parquet")
    assert {"norm_share", "sink_rate@0.2"} <= set(metrics.metric) and "massive_count" not in set(metrics.metric)
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["evidence"]) == {"sink_battery", "value_mass"}
    assert manifest["evidence"]["sink_battery"]["eps"] == [0.2]


@pytest.mark.slow  # two tiny captures
def test_positions_write_the_evidence_table_per_position(tmp_path):
    from anchorlens.analyses.evidence_table import evidence_table

    out = tmp_path / "pos"
    result = run(
        "positions", "--ckpt", "instance", *TINY, "--positions", "first,last", "--evidence", "value_mass,sink_battery",
        "--no-figures", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "evidence.csv", keep_default_na=False, na_values={"layer": [""]})
    assert set(table["position"]) == {"first", "last"}
    assert {("weight", "instance"), ("norm", "instance"), ("norm", "first_token")} <= set(zip(table.measure, table.key))
    metrics = pd.read_parquet(out / "metrics.parquet")
    for position, rows in metrics.groupby("position"):  # the table equals one recomputed from the metric rows
        want = evidence_table(rows.assign(checkpoint="instance"), {"instance": ["instance"]})
        got = table[table["position"] == position].drop(columns="position").reset_index(drop=True)
        assert got["measure"].tolist() == want["measure"].astype(str).tolist()
        assert got["key"].tolist() == want["key"].astype(str).tolist()
        assert got["mean"].to_numpy() == pytest.approx(want["mean"].to_numpy(), rel=1e-9, nan_ok=True)
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["evidence"]) == {"sink_battery", "value_mass"}
    assert "evidence.csv" in (out / "summary.md").read_text()


@pytest.mark.parametrize(
    ("command", "spec"),
    [
        ("compare", "bogus"),
        ("compare", "sink_battery:eps=1.5"),
        ("capture", "sink_battery:eps=0"),
        ("capture", "value_mass:top=2"),
        ("positions", "value_mass:eps=0.3"),
    ],
)
def test_bad_evidence_is_one_line_and_exit_2(tmp_path, command, spec):
    out = tmp_path / "out"
    ckpts = {"compare": ["--ckpt", "base", "--ckpt", "instance"], "positions": ["--ckpt", "instance"]}.get(
        command, ["--ckpt", "base"]
    )
    result = run(command, *ckpts, *TINY, "--evidence", spec, "--out", str(out))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--evidence" in lines[0]
    assert not out.exists() or not any(out.iterdir())
