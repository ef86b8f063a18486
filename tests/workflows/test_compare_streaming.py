"""compare streams each chunk's rows to disk: its statistics equal the in-memory functions over the whole frame."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from anchorlens.analyses import average_heads, compare_frames, headline_table
from anchorlens.analyses.headline import HEADLINE, anchor_metrics, field_metrics
from anchorlens.workflows.compare import compare
from anchorlens.workflows.compare_summaries import PAIRED_METRICS, figure_summaries

KEYS = ["checkpoint", "example", "stack", "layer", "head", "metric", "query_role", "key_role"]


@pytest.fixture(scope="module")
def streamed():
    return compare(["base", "instance"], base="tiny-llama", n=7, n_boot=200, chunk_size=3)


def _frames(result) -> dict[str, pd.DataFrame]:
    m = result.metrics
    return {name: m[m.checkpoint == name].drop(columns="checkpoint") for name in result.checkpoints}


def _close(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_exact=False, rtol=1e-12)


def test_headline_and_paired_equal_the_whole_frame_functions(streamed):
    frames = _frames(streamed)
    rows = HEADLINE + field_metrics(("premise", "hypothesis")) + anchor_metrics("instance")  # rte's two fields
    old_headline = headline_table(frames, rows, n_boot=200)
    _close(streamed.headline, old_headline)
    keep = {name: df[df["metric"].isin(PAIRED_METRICS)] for name, df in frames.items()}
    family = ["checkpoint", "metric"]
    old_paired = pd.concat(
        [
            compare_frames(keep, "base", n_boot=200, n_perm=2000, family=family),
            compare_frames(
                {k: average_heads(v) for k, v in keep.items()}, "base", n_boot=200, n_perm=2000, family=family
            ),
        ],
        ignore_index=True,
    )
    _close(streamed.paired, old_paired)


@pytest.mark.slow
def test_chunk_size_changes_nothing(streamed):
    whole = compare(["base", "instance"], base="tiny-llama", n=7, n_boot=200, chunk_size=64)
    sort = lambda df: df.sort_values(KEYS, na_position="last").reset_index(drop=True)  # noqa: E731
    pd.testing.assert_frame_equal(sort(whole.metrics), sort(streamed.metrics), check_exact=True)
    _close(whole.headline, streamed.headline)
    _close(whole.paired, streamed.paired)
    _close(whole.curves, streamed.curves)


def _by_cell(df: pd.DataFrame) -> pd.Series:
    """value by (checkpoint, stack, layer, head (-1 for <NA>), metric, roles), sorted."""
    cells = ["checkpoint", "stack", "layer", "head", "metric", "query_role", "key_role"]
    return df.assign(head=df["head"].fillna(-1).astype(int)).set_index(cells)["value"].sort_index()


def test_means_are_every_cells_mean_over_examples(streamed):
    m = streamed.metrics.assign(head=lambda d: d["head"].fillna(-1).astype(int))
    cells = ["checkpoint", "stack", "layer", "head", "metric", "query_role", "key_role"]
    want = m.groupby(cells)["value"].mean()
    flow_rows = (streamed.means.metric == "role_flow") & streamed.means["head"].isna()
    got = _by_cell(streamed.means[~flow_rows])
    assert got.index.equals(want.index)
    np.testing.assert_allclose(got.to_numpy(), want.to_numpy(), rtol=1e-12)
    m = streamed.metrics
    flow = average_heads(m[m.metric == "role_flow"])
    want_flow = flow.assign(head=-1).groupby(cells)["value"].mean()
    got_flow = _by_cell(streamed.means[flow_rows])
    assert got_flow.index.equals(want_flow.index)
    np.testing.assert_allclose(got_flow.to_numpy(), want_flow.to_numpy(), rtol=1e-12)


def test_written_metrics_file_is_the_frame_and_reads_back_into_the_same_summaries(streamed, tmp_path):
    from anchorlens.reports.comparison import load_comparison, write_comparison

    out = write_comparison(streamed, tmp_path / "run", figures=False)
    written = pd.read_parquet(out / "metrics.parquet")
    assert list(written.columns) == list(streamed.metrics.columns) and str(written["head"].dtype) == "Int64"
    pd.testing.assert_frame_equal(written, streamed.metrics, check_exact=True)
    back = load_comparison(out)
    _close(back.means, streamed.means)
    _close(back.curves, streamed.curves)
    means, curves = figure_summaries(out / "metrics.parquet")
    _close(means, streamed.means)


def test_a_run_written_whole_reads_back_too(streamed, tmp_path):
    path = tmp_path / "metrics.parquet"
    streamed.metrics.to_parquet(path, index=False)  # as compare wrote it before rows streamed to disk
    means, curves = figure_summaries(path)
    _close(means, streamed.means)
    _close(curves, streamed.curves)


def test_manifest_facts_time_each_phase(streamed):
    seconds = streamed.facts["seconds"]
    assert list(seconds) == ["capture", "task_effects", "mean_maps", "statistics"]
    assert all(isinstance(v, float) and v >= 0 for v in seconds.values())
    assert seconds["capture"] > 0  # two checkpoints' forwards were timed


def test_the_spill_goes_where_it_is_told_and_leaves_nothing(tmp_path):
    from anchorlens.workflows.compare_summaries import Summaries

    summaries = Summaries(3, HEADLINE, scratch_dir=tmp_path / "beside-out")
    folder = Path(summaries.scratch.name)
    assert folder.parent == tmp_path / "beside-out" and folder.name.startswith(".anchorlens-compare-scratch-")
    summaries.scratch.cleanup()
    assert not folder.exists()
