"""Review fixes: `anchorlens figures` on a damaged compare run is one line, exit 2, naming the file and the fix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from anchorlens.cli import app

TINY = ["--base", "tiny-llama"]


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _damaged(compare_run: Path, tmp_path: Path, name: str, mode: str) -> Path:
    run = tmp_path / "run"
    shutil.copytree(compare_run, run)
    if mode == "delete":
        (run / name).unlink()
    else:
        data = (run / name).read_bytes()
        (run / name).write_bytes(data[:37])
    return run


@pytest.mark.parametrize(
    "name,mode",
    [
        ("metrics.parquet", "truncate"),
        ("metrics.parquet", "delete"),
        ("maps.safetensors", "truncate"),
        ("maps.safetensors", "delete"),
        ("maps.json", "truncate"),
        ("facts.json", "truncate"),
        ("headline.csv", "truncate"),
        ("headline.csv", "delete"),
        ("paired.csv", "truncate"),
        ("effects.parquet", "truncate"),
    ],
)
def test_figures_on_a_damaged_run_is_one_line_exit_2_naming_the_file(compare_run, tmp_path, name, mode):
    run = _damaged(compare_run, tmp_path, name, mode)
    result = cli("figures", str(run), "--out", str(tmp_path / "figs"))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "internal error" not in result.output and "Traceback" not in result.output
    assert name in lines[0]
    assert "compare" in lines[0]  # says how to fix it
    assert not (tmp_path / "figs").exists() or not any((tmp_path / "figs").glob("*.png"))


def test_load_comparison_raises_data_error_for_truncated_maps(compare_run, tmp_path):
    from anchorlens.errors import DataError
    from anchorlens.reports.comparison import load_comparison

    run = _damaged(compare_run, tmp_path, "maps.safetensors", "truncate")
    with pytest.raises(DataError, match=r"maps\.safetensors: cannot read"):
        load_comparison(run)


def test_layer_curves_legend_names_the_plotted_sink_not_the_instance_token(compare_run):
    """The curves plot input → sink (the first input token); the legend named position 0 (<instance>) instead."""
    from anchorlens.reports.comparison import comparison_figures, load_comparison

    result = load_comparison(compare_run)
    figs = {stem: fig for stem, _, fig in comparison_figures(result)}
    legend_texts = [t.get_text() for lg in figs["layer_curves"].legends for t in lg.get_texts()]
    instance = [t for t in legend_texts if t.startswith("instance")]
    assert instance and "<instance>" not in instance[0], legend_texts
    assert "<s>" in instance[0]


def test_sink_tokens_skip_guidance_keys(compare_run):
    from anchorlens.capture.maps_io import load_maps
    from anchorlens.figures.maps import anchor_tokens, sink_tokens

    maps = load_maps(compare_run / "maps")
    assert anchor_tokens(maps)["instance"] == "<instance>"  # position 0
    assert sink_tokens(maps) == {"base": "<s>", "instance": "<s>"}


def test_flow_on_a_damaged_manifest_is_one_line(compare_run, tmp_path):
    run = _damaged(compare_run, tmp_path, "manifest.json", "truncate")
    result = cli("flow", str(run), "--queries", "content")
    assert result.exit_code == 2 and "internal error" not in result.output, result.output
    assert "manifest.json is damaged (not JSON); re-run the command that wrote" in result.output
