"""A resumed capture never mixes two few-shot draws: the shots, their seed and their pool are part of the run.

A capture with --shots 2 --shots-from POOL --chunk-size 4 stops after its first chunk; a rerun with other shots,
another seed, or a POOL file whose content changed (same path) is one line naming the few-shot demonstrations and
what changed, exit 2, with nothing in OUT changed. The original command resumes, and the manifest records the draw
(shots, seed, the pool's source, size and digest).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from anchorlens.capture.selection import Selection
from anchorlens.cli import app
from anchorlens.errors import UsageError
from anchorlens.rundir import examples_digest
from anchorlens.tasks import get_task, load_examples
from anchorlens.tasks.prompts import PromptOptions
from anchorlens.workflows.capture_run import run_capture
from tests.workflows.test_chat_resume import snapshot

N = 8
POOL = [
    {
        "premise": f"Pool premise number {i} about a river.",
        "hypothesis": f"River {i}.",
        "label": ["entailment", "not_entailment"][i % 2],
        "idx": 100 + i,
    }
    for i in range(6)
]


def write_pool(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def capture(out: Path, pool: Path, shots: int = 2, seed: int = 0, force: bool = False, **kw) -> Path:
    prompt = PromptOptions(shots=shots, shots_from=str(pool), seed=seed)
    return run_capture(
        "base", "tiny-llama", "rte", None, N, Selection(), 2, out, force, chunk_size=4, progress=False, prompt=prompt,
        **kw,
    )  # fmt: skip


def stopped_after_first_chunk(out: Path, pool: Path) -> None:
    def stop(chunk: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        capture(out, pool, on_chunk_saved=stop)
    assert (out / ".progress" / "shard-00000.json").is_file() and not (out / "manifest.json").exists()


def refused(out: Path, pool: Path, pattern: str, **kw) -> None:
    with pytest.raises(UsageError, match=pattern) as err:
        capture(out, pool, **kw)
    message = str(err.value)
    assert "\n" not in message and "unfinished run of a different command" in message
    assert "the few-shot demonstrations:" in message


def test_another_few_shot_draw_is_refused_on_resume(tmp_path):
    out = tmp_path / "out"
    pool = write_pool(tmp_path / "pool.jsonl", POOL)
    stopped_after_first_chunk(out, pool)
    before = snapshot(out)
    refused(out, pool, r"shots 2 -> 3", shots=3)
    refused(out, pool, r"seed 0 -> 7", seed=7)
    assert snapshot(out) == before
    old = examples_digest(load_examples(pool, get_task("rte"), require_labels=True))
    write_pool(pool, [{**r, "hypothesis": r["hypothesis"] + " Changed."} for r in POOL])  # same path, other rows
    new = examples_digest(load_examples(pool, get_task("rte"), require_labels=True))
    assert old != new
    refused(out, pool, rf"pool_digest '{old}' -> '{new}'")
    assert snapshot(out) == before
    args = ["capture", "--ckpt", "base", "--base", "tiny-llama", "--n", str(N), "--batch-size", "2",
            "--chunk-size", "4", "--shots", "2", "--shots-from", str(pool), "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "the few-shot demonstrations: pool_digest" in lines[0], result.output
    assert snapshot(out) == before
    write_pool(pool, POOL)  # the pool the run started with: the original command resumes
    capture(out, pool)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["demonstrations"] == {
        "shots": 2, "seed": 0, "source": str(pool), "pool_size": len(POOL), "pool_digest": old,
        "same_as_queries": False,
    }  # fmt: skip
    assert set(pd.read_parquet(out / "metrics.parquet")["example"]) == set(range(N))
