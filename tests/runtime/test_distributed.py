"""2-process gloo runs equal a single process: reducer all-reduce and run_capture."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from anchorlens.analyses import default_reducers
from anchorlens.capture.selection import Selection
from anchorlens.runtime import distributed as rt
from anchorlens.workflows.capture_run import run_capture
from tests.runtime.dist_worker import N_SYNTH, synthetic_plan
from tests.runtime.helpers import read_metrics, sorted_frame, spawn_world, wait_all
from tests.runtime.synth import feed, make_items


def test_shard_is_a_strided_partition():
    items = list(range(11))
    parts = [rt.shard(items, r, 3) for r in range(3)]
    assert parts[1] == [1, 4, 7, 10]
    assert sorted(sum(parts, [])) == items
    with pytest.raises(ValueError):
        rt.shard(items, 3, 3)


def test_single_process_helpers_are_no_ops(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert rt.init_if_needed() is False
    assert rt.is_main() and rt.dist_info().world_size == 1
    rt.barrier()
    reducers = default_reducers()
    assert rt.all_reduce_reducers(reducers) is reducers
    assert rt.agree(lambda: 7) == 7


def test_env_detection(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    info = rt.dist_info()
    assert (info.rank, info.world_size, info.local_rank, info.launcher) == (3, 4, 1, "torchrun")
    assert not rt.is_main()


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory) -> tuple[Path, Path]:
    """Run dist_worker on 2 gloo ranks once; returns (OUT, scratch)."""
    root = tmp_path_factory.mktemp("dist")
    out, scratch = root / "out", root / "scratch"
    scratch.mkdir()
    code = f"from tests.runtime.dist_worker import main; main({str(out)!r}, {str(scratch)!r})"
    wait_all(spawn_world(code, 2), timeout=180)
    return out, scratch


def test_all_reduce_reducers_equals_one_process(two_rank_run):
    _, scratch = two_rank_run
    reference = default_reducers()
    data = make_items(N_SYNTH, seed=3)
    for rank in (0, 1):
        for ids, sites in synthetic_plan(rank):
            feed(reference, data, [ids[i : i + 3] for i in range(0, len(ids), 3)], sites)
    for r in reference:
        want = sorted_frame(r.frame())
        assert not want.empty or r.name == "learned_sink"  # synthetic sites have no learned sink
        for rank in (0, 1):
            got = sorted_frame(pd.read_parquet(scratch / f"{r.name}-rank{rank}.parquet"))
            pd.testing.assert_frame_equal(got.drop(columns="value"), want.drop(columns="value"))
            np.testing.assert_allclose(got["value"], want["value"], rtol=0, atol=1e-6)


def test_agree_raises_on_every_rank(two_rank_run):
    _, scratch = two_rank_run
    reports = [json.loads((scratch / f"agree-rank{r}.json").read_text()) for r in (0, 1)]
    assert reports[1]["raised"] == "rank 1 says no"
    assert reports[0]["raised"] and "another rank failed" in reports[0]["raised"]
    assert [r["info"]["world_size"] for r in reports] == [2, 2]


def test_two_process_capture_equals_one_process(two_rank_run, tmp_path):
    out, _ = two_rank_run
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and not (out / ".progress").exists()
    single = run_capture(
        "base", "tiny-llama", "rte", None, 12, Selection(), 4, tmp_path / "one", False, chunk_size=3, progress=False
    )
    got, want = read_metrics(out), read_metrics(single)
    assert len(got) == len(want) > 0 and set(got["example"]) == set(range(12))
    pd.testing.assert_frame_equal(got.drop(columns="value"), want.drop(columns="value"))
    np.testing.assert_allclose(got["value"], want["value"], rtol=0, atol=1e-6)
    assert json.loads((single / "manifest.json").read_text())["run_key"] == manifest["run_key"]
