"""Faults around distributed capture: a rank killed mid-run, more ranks than examples, SIGINT then rerun."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pandas as pd
import pytest

from anchorlens.atomic import TEMP_MARK
from anchorlens.capture.selection import Selection
from anchorlens.errors import UsageError
from anchorlens.workflows.capture_run import run_capture
from tests.runtime.helpers import read_metrics, spawn, spawn_world

N, CHUNK = 8, 2


def capture(out: Path, n: int = N, **kw) -> Path:
    """run_capture on tiny-llama with the test's options."""
    return run_capture(
        "base",
        "tiny-llama",
        "rte",
        None,
        n,
        Selection(layers=(0,)),
        2,
        out,
        False,
        chunk_size=CHUNK,
        progress=False,
        **kw,
    )


def main(out: str, n: int = N, kill_rank: int | None = None, sig: int = signal.SIGKILL) -> None:
    """(Subprocess, any rank) capture; ``kill_rank`` sends itself ``sig`` after saving its first chunk.

    Errors are printed as the CLI prints them: ``error: MESSAGE``, exit 2.
    """
    from anchorlens.runtime import distributed as rt

    def die(_chunk: int) -> None:
        if rt.dist_info().rank == kill_rank:
            signal.raise_signal(sig)

    try:
        capture(Path(out), n, on_chunk_saved=die)
    except UsageError as err:
        print(f"error: {err}", flush=True)
        sys.exit(2)


def leftovers(root: Path) -> list[str]:
    """Temp folders/files and lock files anywhere under ``root``."""
    return [str(p) for p in root.rglob("*") if TEMP_MARK in p.name or p.name.endswith(".anchorlens-lock")]


def communicate(procs, timeout: float = 180) -> list[tuple[int, str]]:
    """(exit code, output) of every process."""
    try:
        return [(p.communicate(timeout=timeout)[0], p.returncode)[::-1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


@pytest.mark.slow
def test_killed_rank_is_named_in_one_line_and_the_rerun_resumes(tmp_path):
    out = tmp_path / "out"
    code = f"from tests.runtime.test_faults import main; main({str(out)!r}, kill_rank=1)"
    (rc0, out0), (rc1, _) = communicate(spawn_world(code, 2))
    assert rc1 == -signal.SIGKILL
    lines = out0.strip().splitlines()
    assert rc0 == 2 and "Traceback" not in out0, out0
    assert len(lines) == 1 and lines[0].startswith("error: rank 0: rank 1 died during"), out0
    assert "rerun the same command" in lines[0]
    assert not (out / "manifest.json").exists() and list((out / ".progress").glob("shard-*.json"))
    capture(out)  # a single process resumes the run (chunking is global)
    whole = capture(tmp_path / "whole")
    pd.testing.assert_frame_equal(read_metrics(out), read_metrics(whole), check_exact=True)
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_more_ranks_than_examples(tmp_path):
    out = tmp_path / "out"
    code = f"from tests.runtime.test_faults import main; main({str(out)!r}, n=1)"
    results = communicate(spawn_world(code, 2))
    assert [rc for rc, _ in results] == [0, 0], results
    got = read_metrics(out)
    assert set(got["example"]) == {0}
    pd.testing.assert_frame_equal(got, read_metrics(capture(tmp_path / "single", n=1)), check_exact=True)


@pytest.mark.slow
def test_sigint_during_capture_then_rerun_leaves_no_partial_out_or_temp_dirs(tmp_path):
    out = tmp_path / "out"
    proc = spawn(
        f"from tests.runtime.test_faults import main; main({str(out)!r}, kill_rank=0, sig={int(signal.SIGINT)})"
    )
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode != 0 and "KeyboardInterrupt" in output
    assert not (out / "manifest.json").exists() and not (out / "metrics.parquet").exists()
    assert leftovers(tmp_path) == []
    capture(out)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "metrics.parquet"]
    assert leftovers(tmp_path) == []


def test_sigint_before_the_first_chunk_leaves_no_out(tmp_path, monkeypatch):
    from anchorlens.workflows import capture_run

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(capture_run, "stream_statistics", interrupted)
    with pytest.raises(KeyboardInterrupt):
        capture(tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
    assert os.listdir(tmp_path) == []
