"""Subprocess helpers for the runtime tests: free ports, scripts, sorted metric frames."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd

from anchorlens.analyses.frames import ROW_KEYS

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a child python: the repo importable, one thread, quiet progress."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **extra)
    return env


def spawn(code: str, **env: str) -> subprocess.Popen:
    """Start ``python -c code`` in the repo root."""
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=child_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def spawn_world(code: str, world: int, **env: str) -> list[subprocess.Popen]:
    """Start ``world`` ranks of ``code`` as a gloo world on 127.0.0.1."""
    port = str(free_port())
    return [
        spawn(
            code,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            RANK=str(r),
            LOCAL_RANK=str(r),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            **env,
        )
        for r in range(world)
    ]


def wait_all(procs: list[subprocess.Popen], timeout: float = 120) -> None:
    """Wait for every process; fail with their output if any exits non-zero."""
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outputs.append((p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    bad = [(rc, out) for rc, out in outputs if rc != 0]
    assert not bad, "\n\n".join(f"exit {rc}:\n{out[-4000:]}" for rc, out in bad)


def sorted_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted by the row keys, fresh index."""
    return df.sort_values(list(ROW_KEYS), kind="stable").reset_index(drop=True)


def read_metrics(out: Path) -> pd.DataFrame:
    """OUT/metrics.parquet, sorted."""
    return sorted_frame(pd.read_parquet(out / "metrics.parquet"))
