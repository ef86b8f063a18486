"""``compare`` under torchrun (2 processes; 2 "nodes" x 2 processes) writes per-rank chunk shards and equals one
process exactly (metrics.parquet row for row, paired/headline/task_effects csv byte for byte); kill -9 of one rank,
or of the one process, then the same command again, computes only the shards not committed; the one-process CLI run
(through shards) equals the Python API's in-memory chunks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from anchorlens.workflows.compare import compare
from anchorlens.workflows.compare_ranks import effect_span
from anchorlens.workflows.metrics_file import read_metrics
from tests.runtime.helpers import REPO, child_env, free_port, spawn, spawn_world, wait_all
from tests.runtime.test_multinode import _two_nodes, _workers

N, CHUNK, BATCH = 10, 3, 2  # uneven: 4 chunks of 3, 3, 3, 1 examples; effect ranges of 4 (whole batches)
TABLES = ("paired.csv", "headline.csv", "task_effects.csv")


def _compare_args(out: Path, n: int = N, chunk: int = CHUNK, batch: int = BATCH) -> list[str]:
    return ["compare", "--ckpt", "base", "--ckpt", "instance", "--base", "tiny-llama", "--limit", str(n),
            "--chunk-size", str(chunk), "--batch-size", str(batch), "--out", str(out), "--no-figures"]  # fmt: skip


def _torchrun(args: list[str], procs: int = 2) -> subprocess.Popen:
    """One torchrun agent of ``procs`` processes on 127.0.0.1."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs), "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), "--max-restarts", "0", "-m", "anchorlens", *args]  # fmt: skip
    return subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _one_process(out: Path, **kw: int) -> Path:
    """The same command in one process (same environment: one thread), the reference."""
    cmd = [sys.executable, "-m", "anchorlens", *_compare_args(out, **kw)]
    done = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _assert_same(got: Path, want: Path) -> None:
    a, b = pd.read_parquet(got / "metrics.parquet"), pd.read_parquet(want / "metrics.parquet")
    assert len(a) == len(b) > 0 and set(a["example"]) == set(range(int(b["example"].max()) + 1))
    pd.testing.assert_frame_equal(a, b)  # the same rows in the same order, bit for bit
    pd.testing.assert_frame_equal(pd.read_parquet(got / "effects.parquet"), pd.read_parquet(want / "effects.parquet"))
    for name in TABLES:
        assert (got / name).read_text() == (want / name).read_text(), name
    assert not (got / ".progress").exists()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    return _one_process(tmp_path_factory.mktemp("cmp1") / "one")


def test_effect_spans_are_whole_batches():
    assert effect_span(2, 3) == 4 and effect_span(8, 32) == 32 and effect_span(3, 1) == 6 and effect_span(1, 1) == 1


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path, reference):
    out = tmp_path / "two"
    agent = _torchrun(_compare_args(out))
    wait_all([agent], timeout=600)
    _assert_same(out, reference)


@pytest.mark.slow
def test_two_nodes_of_two_processes_equal_one_process(tmp_path, reference):
    out = tmp_path / "four"
    wait_all(_two_nodes(_compare_args(out)), timeout=600)
    _assert_same(out, reference)


LOGGED = """
import os, sys
from anchorlens.runtime import shards
save = shards.Progress.save
def logged(self, chunk, ids, frame, **recorded):
    with open(os.path.join({log!r}, "rank" + os.environ.get("RANK", "0")), "a") as fh:
        fh.write(f"{{chunk}}\\n")
    return save(self, chunk, ids, frame, **recorded)
shards.Progress.save = logged
from anchorlens.cli import main
sys.argv = ["anchorlens", *{args!r}]
main()
"""


@pytest.mark.slow
def test_kill_9_of_one_rank_then_rerun_resumes_at_chunk_granularity(tmp_path):
    n, chunk, batch = 16, 1, 1
    out = tmp_path / "killed"
    agent = _torchrun(_compare_args(out, n, chunk, batch))
    progress = out / ".progress"
    deadline = time.monotonic() + 500
    while len(list(progress.glob("shard-*.json"))) < 4:
        assert time.monotonic() < deadline and agent.poll() is None, "the run never got going"
        time.sleep(0.2)
    workers = _workers([agent])
    assert len(workers) == 2
    os.kill(workers[-1].pid, signal.SIGKILL)
    text = agent.communicate(timeout=300)[0]
    psutil.wait_procs(workers, timeout=120)
    assert agent.returncode != 0 and not (out / "manifest.json").exists()
    assert "Traceback" not in "".join(line for line in text.splitlines() if "rank 0" in line)
    committed = {int(json.loads(p.read_text())["chunk"]) for p in progress.glob("shard-*.json")}
    total = 2 * n + n  # every checkpoint's chunks, then the task-effect ranges (one batch of one example each)
    assert 0 < len(committed) < total
    log = tmp_path / "log"
    log.mkdir()
    wait_all(spawn_world(LOGGED.format(log=str(log), args=_compare_args(out, n, chunk, batch)), 2), timeout=600)
    computed = [int(x) for p in log.iterdir() for x in p.read_text().split()]
    assert sorted(computed) == sorted(set(range(total)) - committed)  # only the shards no rank committed
    _assert_same(out, _one_process(tmp_path / "one", n=n, chunk=chunk, batch=batch))


KILLED_AFTER = """
import os, signal, sys
from anchorlens.runtime import shards
save = shards.Progress.save
def save_then_die(self, chunk, ids, frame, **recorded):
    saved = save(self, chunk, ids, frame, **recorded)
    if chunk == {last}:
        os.kill(os.getpid(), signal.SIGKILL)
    return saved
shards.Progress.save = save_then_die
from anchorlens.cli import main
sys.argv = ["anchorlens", *{args!r}]
main()
"""


def _committed(out: Path) -> set[int]:
    return {int(json.loads(p.read_text())["chunk"]) for p in (out / ".progress").glob("shard-*.json")}


@pytest.mark.slow
def test_kill_9_of_one_process_then_rerun_computes_only_the_unsaved_chunks(tmp_path, reference):
    out = tmp_path / "killed"
    killed = spawn(KILLED_AFTER.format(last=2, args=_compare_args(out)))
    killed.communicate(timeout=600)
    assert killed.returncode == -signal.SIGKILL
    assert _committed(out) == {0, 1, 2} and not (out / "manifest.json").exists()
    log = tmp_path / "log"
    log.mkdir()
    rerun = spawn(LOGGED.format(log=str(log), args=_compare_args(out)))
    text = rerun.communicate(timeout=600)[0]
    assert rerun.returncode == 0, text[-3000:]
    total = 2 * 4 + 3  # 4 chunks per checkpoint, then 3 task-effect ranges (4, 4 and 2 examples)
    assert [int(x) for x in (log / "rank0").read_text().split()] == list(range(3, total))
    _assert_same(out, reference)


@pytest.mark.slow
def test_one_process_through_shards_equals_the_in_memory_chunks(reference):
    direct = compare(["base", "instance"], base="tiny-llama", n=N, chunk_size=CHUNK, batch_size=BATCH, n_boot=20)
    pd.testing.assert_frame_equal(direct.metrics, read_metrics(reference / "metrics.parquet"))
    effects = pd.read_parquet(reference / "effects.parquet")
    pd.testing.assert_frame_equal(direct.effect_rows.reset_index(drop=True), effects[list(direct.effect_rows.columns)])
