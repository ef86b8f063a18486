"""``--figure-size`` on every command that draws figures, and ``--ckpt NAME=SPEC`` naming a checkpoint everywhere."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from anchorlens.cli import app
from anchorlens.cli.options import FIGURE_SIZE_NAMES

runner = CliRunner()
TINY = ["--base", "tiny-llama"]
FIGURE_COMMANDS = ["compare", "figures", "demo", "positions", "sweep instance", "sweep knockout", "sweep length"]


def run(*args: str):
    return runner.invoke(app, list(args))


def _command(path: str):
    command = typer.main.get_command(app)
    for name in path.split():
        command = command.commands[name]  # type: ignore[attr-defined]
    return command


def _error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_the_cli_names_the_presets_the_figures_define():
    from anchorlens.figures import FIGURE_SIZES

    assert FIGURE_SIZE_NAMES == tuple(FIGURE_SIZES)


@pytest.mark.parametrize("path", FIGURE_COMMANDS)
def test_every_command_that_draws_figures_takes_figure_size(path):
    flags = {opt for param in _command(path).params for opt in param.opts}
    assert "--figure-size" in flags


@pytest.mark.parametrize("path", ["compare", "figures", "demo", "sweep knockout"])
def test_an_unknown_figure_size_is_one_line_naming_the_choices(path, tmp_path):
    args = {"compare": ["--ckpt", "base", "--ckpt", "instance"], "figures": [str(tmp_path)]}.get(path, [])
    line = _error_line(run(*path.split(), *args, "--figure-size", "poster"))
    assert "--figure-size" in line and "'poster' is not a figure size" in line and "column" in line


def test_figures_redraws_at_column_size_and_records_it(compare_run, tmp_path):
    out = tmp_path / "col"
    result = run("figures", str(compare_run), "--figure-size", "COLUMN", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert json.loads((out / "manifest.json").read_text())["figure_size"] == "column"
    pdfs = sorted(out.glob("*.pdf"))
    assert pdfs and {p.stem for p in pdfs} == {p.stem for p in (compare_run / "figures").glob("*.pdf")}
    width = {p.stem: _width(p) for p in pdfs}
    screen = {p.stem: _width(p) for p in (compare_run / "figures").glob("*.pdf")}
    # the preset reaches every figure builder: no figure is wider than on screen, and together they are narrower
    # (each figure's own 5.5 in limit is checked by the figure tests)
    assert all(width[s] <= screen[s] + 1 for s in width) and sum(width.values()) < sum(screen.values()), (width, screen)
    assert json.loads((compare_run / "manifest.json").read_text())["figure_size"] == "screen"


def _width(pdf: Path) -> float:
    """The width of a saved PDF's page box, in points."""
    found = re.search(rb"/MediaBox\s*\[\s*([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s*\]", pdf.read_bytes())
    assert found, pdf
    return float(found.group(3)) - float(found.group(1))


@pytest.fixture(scope="module")
def named_run(tmp_path_factory) -> Path:
    """The compare_run fixture's comparison (base vs instance, 2 examples) with the instance named ``inst``."""
    out = tmp_path_factory.mktemp("named") / "run"
    result = run("compare", "--ckpt", "base", "--ckpt", "inst=instance", *TINY, "--n", "2", "--out", str(out))
    assert result.exit_code == 0, result.output
    return out


def test_a_named_checkpoint_is_that_name_in_every_table_with_the_same_numbers(named_run, compare_run):
    for table in ("headline.csv", "paired.csv", "task_effects.csv"):
        named = pd.read_csv(named_run / table, keep_default_na=False, na_values=[""])
        plain = pd.read_csv(compare_run / table, keep_default_na=False, na_values=[""])
        assert set(named["checkpoint"]) == {"base", "inst"} or set(named["checkpoint"]) == {"inst"}, table
        renamed = plain.assign(checkpoint=plain["checkpoint"].replace({"instance": "inst"}))
        pd.testing.assert_frame_equal(named, renamed, check_exact=False, rtol=1e-9, atol=1e-12)
    metrics = pd.read_parquet(named_run / "metrics.parquet", columns=["checkpoint"])
    assert set(metrics["checkpoint"]) == {"base", "inst"}


def test_a_named_checkpoint_names_files_legends_and_the_manifest(named_run):
    from anchorlens.reports.comparison import comparison_figures, load_comparison

    assert (named_run / "figures" / "heads_diff_inst.png").is_file()
    assert not list((named_run / "figures").glob("*instance*"))  # no file is named by the spec
    manifest = json.loads((named_run / "manifest.json").read_text())
    assert manifest["checkpoint_specs"] == {"base": "base", "inst": "instance"}
    assert "Checkpoints: base (the paired baseline); inst = instance." in (named_run / "report.html").read_text()
    assert "| metric | base | inst |" in (named_run / "summary.md").read_text()
    figures = {stem: fig for stem, _, fig in comparison_figures(load_comparison(named_run))}
    legends = [lg for fig in [figures["layer_curves"]] for lg in [*fig.legends, *(a.get_legend() for a in fig.axes)]]
    entries = [t.get_text() for lg in legends if lg is not None for t in lg.get_texts()]
    assert any(e.startswith("inst") for e in entries) and not any(e.startswith("instance") for e in entries), entries


@pytest.mark.parametrize(
    ("ckpts", "message"),
    [
        (["a=base", "a=instance"], "two checkpoints are named 'a'"),
        (["instance", "instance=base"], "is also the checkpoint 'instance'"),
        (["base", "ko="], "names 'ko' but gives no spec"),
    ],
)
def test_clashing_names_are_one_line(ckpts, message, tmp_path):
    args = [a for c in ckpts for a in ("--ckpt", c)]
    line = _error_line(run("compare", *args, *TINY, "--n", "1", "--out", str(tmp_path / "o")))
    assert message in line
    assert not (tmp_path / "o").exists()


def test_an_out_inside_a_named_checkpoint_directory_is_refused(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "anchorlens.json").write_text("{}")
    line = _error_line(run("compare", "--ckpt", "base", "--ckpt", f"k={folder}", "--out", str(folder)))
    assert "is the input" in line and (folder / "anchorlens.json").is_file()


def test_params_shows_a_named_checkpoint_by_its_name_with_the_specs_count():
    named = run("params", "--ckpt", "p=prompt:n=4", "--ckpt", "prompt:n=4", *TINY)
    assert named.exit_code == 0, named.output
    rows = {line.split()[0]: line.split()[1] for line in named.output.splitlines() if line.startswith("  ")}
    assert rows["p"] == rows["prompt:n=4"] and int(rows["p"].replace(",", "")) > 0


def test_demo_draws_at_the_chosen_size_and_records_it(tmp_path):
    result = run("demo", *TINY, "--n", "2", "--figure-size", "page", "--out", str(tmp_path / "demo"))
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "demo" / "manifest.json").read_text())
    assert manifest["figure_size"] == "page" and manifest["checkpoint_specs"] == {
        "base": "base",
        "instance": "instance",
    }
