"""torchrun on 2 "nodes" x 2 processes (c10d rendezvous on 127.0.0.1) equals one process; a rank killed with
kill -9 leaves its finished shards, and the rerun computes only the chunks no rank committed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest

from anchorlens.capture.selection import Selection
from anchorlens.runtime.shards import chunk_indices
from anchorlens.workflows.capture_run import run_capture
from tests.runtime.helpers import REPO, child_env, free_port, read_metrics, spawn_world, wait_all

N, CHUNK, BATCH = 12, 3, 4


def _capture_args(out: Path, n: int = N, chunk: int = CHUNK, batch: int = BATCH) -> list[str]:
    return ["capture", "--ckpt", "base", "--base", "tiny-llama", "--limit", str(n), "--chunk-size", str(chunk),
            "--batch-size", str(batch), "--out", str(out), "--no-progress"]  # fmt: skip


def _two_nodes(args: list[str]) -> list[subprocess.Popen]:
    """Two torchrun agents ("nodes") of 2 processes each, meeting through c10d rendezvous on 127.0.0.1."""
    port = free_port()
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                f"al-{port}",
                "--max-restarts",
                "0",
                "--local-addr",
                "127.0.0.1",
                "-m",
                "anchorlens",
                *args,
            ],  # fmt: skip
            cwd=REPO,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]


def _reference(tmp: Path, n: int = N, chunk: int = CHUNK, batch: int = BATCH) -> Path:
    return run_capture("base", "tiny-llama", "rte", None, n, Selection(), batch, tmp / "one", False,
                       chunk_size=chunk, progress=False)  # fmt: skip


def _assert_same(got_dir: Path, want_dir: Path) -> None:
    got, want = read_metrics(got_dir), read_metrics(want_dir)
    assert len(got) == len(want) > 0
    pd.testing.assert_frame_equal(got.drop(columns="value"), want.drop(columns="value"))
    np.testing.assert_allclose(got["value"], want["value"], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_two_nodes_of_two_processes_equal_one_process(tmp_path):
    out = tmp_path / "multi"
    wait_all(_two_nodes(_capture_args(out)), timeout=600)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["world_size"] == 4 and manifest["launcher"] == "torchrun"
    single = _reference(tmp_path)
    _assert_same(out, single)
    assert json.loads((single / "manifest.json").read_text())["run_key"] == manifest["run_key"]


def _workers(agents: list[subprocess.Popen]) -> list[psutil.Process]:
    """The rank processes the agents started: their direct children running anchorlens itself.

    An agent forks short-lived helpers whose command line is still the agent's own (``torch.distributed.run ...
    -m anchorlens``), and a helper that has exited is a zombie with no command line: neither is a rank."""
    return [c for a in agents for c in psutil.Process(a.pid).children() if _is_rank(_cmdline(c))]


def _is_rank(cmdline: str) -> bool:
    """Whether a command line is a rank's (``python -u -m anchorlens ...``), not the agent's or a helper's."""
    return "-m anchorlens" in cmdline and "torch.distributed.run" not in cmdline


def _cmdline(process: psutil.Process) -> str:
    """The process's command line, or "" once it has exited (gone, or a zombie not yet reaped)."""
    try:
        return " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):  # ZombieProcess is a NoSuchProcess
        return ""


@pytest.mark.slow
def test_kill_9_of_one_rank_then_rerun_resumes_at_shard_granularity(tmp_path):
    n, chunk, batch = 24, 1, 1  # every bundled example, one chunk each: some are committed before the kill, some not
    out = tmp_path / "multi"
    agents = _two_nodes(_capture_args(out, n, chunk, batch))
    progress = out / ".progress"
    deadline = time.monotonic() + 500
    while len(list(progress.glob("shard-*.json"))) < 2:
        assert time.monotonic() < deadline and all(a.poll() is None for a in agents), "the run never got going"
        time.sleep(0.02)
    workers = _workers(agents)
    assert len(workers) == 4
    for w in workers:  # freeze the ranks first: a tiny model's chunks take milliseconds, and the kill must land mid-run
        w.suspend()
    os.kill(workers[-1].pid, signal.SIGKILL)
    for w in workers[:-1]:
        w.resume()
    for a in agents:
        a.communicate(timeout=300)
    _, alive = psutil.wait_procs(workers, timeout=120)  # the agents stop the other ranks; wait until they are gone
    assert not alive, f"ranks still running after their agents exited: {[p.pid for p in alive]}"
    assert any(a.returncode != 0 for a in agents) and not (out / "manifest.json").exists()
    committed = {int(json.loads(p.read_text())["chunk"]) for p in progress.glob("shard-*.json")}
    total = len(chunk_indices(n, chunk))
    assert 0 < len(committed) < total
    computed: list[int] = []  # the rerun (one process here: progress resumes with any world size)
    run_capture("base", "tiny-llama", "rte", None, n, Selection(), batch, out, False, chunk_size=chunk,
                progress=False, on_chunk_saved=computed.append)  # fmt: skip
    assert sorted(computed) == sorted(set(range(total)) - committed)  # only the chunks no rank committed
    _assert_same(out, _reference(tmp_path, n, chunk, batch))


def test_ranks_launched_with_different_arguments_give_one_line(tmp_path):
    code = (
        "import os, sys\n"
        "from anchorlens.cli import main\n"
        f"sys.argv = ['anchorlens', 'capture', '--ckpt', 'base', '--base', 'tiny-llama', '--out', {str(tmp_path / 'o')!r},"
        " '--limit', str(3 + int(os.environ['RANK'])), '--no-progress']\n"
        "main()\n"
    )
    procs = spawn_world(code, 2)
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, text in zip(procs, outs):
        assert p.returncode == 2, text
        lines = [line for line in text.splitlines() if line.strip()]
        assert len(lines) == 1 and "ranks differ in their run" in lines[0], text
        assert "rank 0: run key" in lines[0] and "rank 1: run key" in lines[0]
        assert "launch every rank with the same command" in lines[0] and "Traceback" not in text


def test_a_missing_ranks_shards_at_merge_give_one_line(tmp_path):
    from anchorlens.errors import DataError
    from anchorlens.runtime.shards import Progress, concat_shards

    store = Progress(tmp_path, "k")
    store.start()
    chunks = list(enumerate(chunk_indices(6, 2)))
    store.save(0, chunks[0][1], pd.DataFrame({"example": [0, 1], "value": [0.5, 0.25]}))
    with pytest.raises(DataError) as err:
        concat_shards(store, chunks, tmp_path / "metrics.parquet")
    line = str(err.value)
    assert "\n" not in line and "chunk(s) 1, 2" in line and "rerun the same command" in line


def test_only_a_rank_command_line_counts_as_a_rank():
    agent = f"{sys.executable} -m torch.distributed.run --nnodes 2 -m anchorlens capture --out x"
    assert _is_rank(f"{sys.executable} -u -m anchorlens capture --out x")
    assert not _is_rank(agent)  # a helper the agent forks keeps the agent's command line
    assert not _is_rank("")  # an exited helper (zombie)
