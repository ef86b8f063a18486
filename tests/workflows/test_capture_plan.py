"""The plan each attention site took is in the manifest (capture and compare), and ``--plan`` chooses it: chunk
markers record each chunk's plans, so resumed chunks count; a forced kernel plan the model rules out is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from anchorlens.capture.options import PLANS, CaptureOptions
from anchorlens.capture.selection import Selection
from anchorlens.capture.sinks import merge_plans
from anchorlens.cli import app
from anchorlens.cli.options import PLAN_NAMES
from anchorlens.runtime.shards import Progress, run_chunks
from anchorlens.workflows.capture_run import run_capture
from anchorlens.workflows.metrics_file import read_metrics

SITES = [f"decoder.{layer}" for layer in range(4)]  # tiny-llama's attention sites
runner = CliRunner()


def one_error_line(result) -> str:
    """The output is one ``error:`` line and the exit code 2."""
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def cli_capture(out: Path, *args: str, base: str = "tiny-llama"):
    return runner.invoke(
        app,
        ["capture", "--ckpt", "base", "--base", base, "--n", "4", "--batch-size", "2", "--chunk-size", "2",
         "--out", str(out), "--no-progress", *args],
    )  # fmt: skip


def test_the_cli_names_the_same_plans_as_the_options():
    assert PLAN_NAMES == PLANS


def test_plans_merge_to_mixed_where_they_differ_and_markers_keep_them(tmp_path):
    plans = merge_plans({}, {"decoder.0": "kernel", "decoder.1": "kernel"})
    assert merge_plans(plans, {"decoder.0": "kernel", "decoder.1": "materialised", "decoder.2": "materialised"}) == {
        "decoder.0": "kernel",
        "decoder.1": "mixed",
        "decoder.2": "materialised",
    }
    store = Progress(tmp_path, "key")
    store.start()
    rows = pd.DataFrame({"example": [0], "value": [0.5]})
    run_chunks([(0, [0])], lambda ids: rows, store, marker_facts=lambda: {"plans": {"decoder.0": "kernel"}})
    marker = store.marker(0)
    assert marker is not None and marker["plans"] == {"decoder.0": "kernel"} and marker["run_key"] == "key"
    assert store.done(0, [0]) and Progress(tmp_path, "other").marker(0) is None


def test_capture_records_the_plan_of_every_site_and_plan_flag_forces_it(tmp_path):
    """``--plan kernel`` and ``--plan materialised`` take that plan at every site (the manifest says so), and both give
    the same statistics to float rounding; ``auto`` records what it chose per site."""
    frames = {}
    for plan in ("kernel", "materialised"):
        result = cli_capture(tmp_path / plan, "--plan", plan)
        assert result.exit_code == 0, result.output
        manifest = json.loads((tmp_path / plan / "manifest.json").read_text())
        assert manifest["capture_plan"] == {"asked": plan, "sites": dict.fromkeys(SITES, plan)}
        checked = manifest["exactness"]["plans"]["kernel"]
        if plan == "kernel":
            assert checked["max_abs_diff"] <= 1e-5 and len(checked["per_layer"]) == len(SITES)
        else:  # a run that never takes the kernel plan does not check it
            assert checked["max_abs_diff"] is None and "materialised plan" in checked["not_applicable"]
        frames[plan] = read_metrics(tmp_path / plan / "metrics.parquet")
    keys = [c for c in frames["kernel"].columns if c != "value"]
    both = frames["kernel"].merge(frames["materialised"], on=keys, suffixes=("_k", "_m"))
    assert len(both) == len(frames["kernel"]) == len(frames["materialised"]) > 0
    assert (both["value_k"] - both["value_m"]).abs().max() <= 1e-5
    auto = cli_capture(tmp_path / "auto")
    assert auto.exit_code == 0, auto.output
    recorded = json.loads((tmp_path / "auto" / "manifest.json").read_text())["capture_plan"]
    assert recorded["asked"] == "auto" and sorted(recorded["sites"]) == SITES
    assert set(recorded["sites"].values()) <= {"kernel", "materialised"}


def test_a_forced_kernel_plan_the_model_rules_out_is_one_line_and_exit_2(tmp_path):
    line = one_error_line(cli_capture(tmp_path / "gemma", "--plan", "kernel", base="tiny-gemma2"))
    assert "the kernel plan cannot compute decoder.0 exactly: the module soft-caps its scores" in line
    assert not (tmp_path / "gemma").exists()
    assert "'bogus' is not a capture plan" in one_error_line(cli_capture(tmp_path / "bogus", "--plan", "bogus"))
    assert not (tmp_path / "bogus").exists()


def _capture(out: Path, plan: str, **kw) -> Path:
    return run_capture(
        "base", "tiny-llama", "rte", None, 6, Selection(), 2, out, False, chunk_size=2, progress=False,
        capture=CaptureOptions(plan=plan), **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_resumed_run_counts_the_plans_of_the_chunks_saved_before(tmp_path):
    """Chunk 0 saved under the kernel plan, the rest computed on resume under the materialised one (the plan is not
    part of the run key): every site is ``mixed``, and the asked plan is the finishing run's."""
    out = tmp_path / "out"

    def stop(chunk: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _capture(out, "kernel", on_chunk_saved=stop)
    marker = json.loads((out / ".progress" / "shard-00000.json").read_text())
    assert marker["plans"] == dict.fromkeys(SITES, "kernel") and not (out / "manifest.json").exists()
    computed: list[int] = []
    _capture(out, "materialised", on_chunk_saved=computed.append)
    assert computed == [1, 2]  # chunk 0 was resumed, not recomputed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["capture_plan"] == {"asked": "materialised", "sites": dict.fromkeys(SITES, "mixed")}


@pytest.mark.parametrize("saved", [False, True], ids=["in memory", "shards in --out"])
def test_compare_records_each_checkpoints_plans(tmp_path, saved):
    from anchorlens.workflows.compare import compare

    result = compare(
        ["base", "instance"], base="tiny-llama", n=4, batch_size=2, n_boot=20, chunk_size=2, map_examples=0,
        capture=CaptureOptions(plan="kernel"), shard_dir=tmp_path / "cmp" if saved else None,
    )  # fmt: skip
    assert result.facts["capture_plan"] == {
        "asked": "kernel",
        "checkpoints": {"base": dict.fromkeys(SITES, "kernel"), "instance": dict.fromkeys(SITES, "kernel")},
    }
    assert all(r["plans"]["kernel"]["max_abs_diff"] <= 1e-5 for r in result.facts["exactness"].values())
