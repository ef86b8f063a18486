"""What compare keeps of its per-example rows, at N examples, without the forward: streaming vs the whole frame.

A compare run's memory beyond the model and one chunk's forward is what it keeps of the per-example rows, so
this replays real rows: ``compare --ckpt base --ckpt instance`` runs once on 32 bundled RTE examples (tiny-llama
by default, or ``--base``), then, in a fresh process per (N, path), those rows are replayed chunk by chunk up to
N examples (example ids relabelled, values jittered by seeded noise of 1e-3 so no two examples are equal) into

- ``streaming``: :class:`anchorlens.workflows.compare_summaries.Summaries`, then its statistics (what
  ``compare`` does now: rows to metrics.parquet, paired statistics block by block from the spill);
- ``whole``: every chunk concatenated in memory, then ``headline_table`` and ``compare_frames`` on the long
  frames (what ``compare`` did before).

Printed per N and path: peak RSS (``wait4``'s ru_maxrss of the process), the seconds of feeding the rows and of
the statistics, and the RSS ratio to the smallest N of the same path. The machine may be shared: read ratios.

    python benchmarks/bench_compare_memory.py                       # N = 64, 512, 2490
    python benchmarks/bench_compare_memory.py --n 64,100000 --paths streaming
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
SEED_N, CHUNK, N_BOOT = 32, 32, 2000


def seed_rows(base: str, folder: Path) -> Path:
    """metrics.parquet of one small real compare run (base vs instance)."""
    from anchorlens.workflows.compare import compare

    result = compare(["base", "instance"], base=base, n=SEED_N, n_boot=100)
    path = folder / "seed.parquet"
    result.metrics.to_parquet(path, index=False)
    return path


def chunks(seed: pd.DataFrame, checkpoint: str, n: int):
    """The seed rows of ``checkpoint`` replayed as chunks of CHUNK examples up to ``n`` (ids relabelled, jittered)."""
    rows = seed[seed["checkpoint"] == checkpoint].drop(columns="checkpoint")
    rng = np.random.default_rng([n, len(checkpoint)])
    for start in range(0, n, CHUNK):
        size = min(CHUNK, n - start)
        part = rows[rows["example"] < size].copy()
        part["example"] = part["example"] + start
        noise = rng.normal(0.0, 1e-3, len(part))
        part["value"] = part["value"] + np.where(np.isfinite(part["value"]), noise, 0.0)
        yield part


def child(path: str, n: int, seed_file: Path) -> dict:
    """Replay ``n`` examples through one path in this fresh process; seconds of feeding and of statistics."""
    from anchorlens.analyses import average_heads, compare_frames, headline_table
    from anchorlens.analyses.frames import concat_frames
    from anchorlens.analyses.headline import HEADLINE, anchor_metrics
    from anchorlens.workflows.compare_summaries import PAIRED_METRICS, Summaries

    seed = pd.read_parquet(seed_file)
    names = ["base", "instance"]
    metrics = HEADLINE + anchor_metrics("instance")
    t0 = time.perf_counter()
    if path == "streaming":
        with Summaries(n, metrics) as summaries:
            for name in names:
                for part in chunks(seed, name, n):
                    summaries.add(name, part)
            t1 = time.perf_counter()
            result = summaries.result(names, N_BOOT)
        cells = len(result["paired"])
    else:
        frames = {name: concat_frames(chunks(seed, name, n)) for name in names}
        t1 = time.perf_counter()
        headline_table(frames, metrics, n_boot=N_BOOT)
        keep = {k: v[v["metric"].isin(PAIRED_METRICS)] for k, v in frames.items()}
        family = ["checkpoint", "metric"]
        cells = len(compare_frames(keep, "base", n_boot=N_BOOT, n_perm=2000, family=family))
        means = {k: average_heads(v) for k, v in keep.items()}
        cells += len(compare_frames(means, "base", n_boot=N_BOOT, n_perm=2000, family=family))
    return {"feed_s": t1 - t0, "stats_s": time.perf_counter() - t1, "paired_rows": cells}


def run_child(path: str, n: int, seed_file: Path, out: Path) -> tuple[float, dict]:
    """(peak RSS MiB, the child's report) of one fresh process."""
    cmd = [sys.executable, __file__, "--child", path, "--n", str(n), "--seed-file", str(seed_file), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{path} N={n} failed: {err.strip().splitlines()[-1] if err.strip() else status}")
    return usage.ru_maxrss / 1024, json.loads(out.read_text())


def main() -> int:
    """Seed once, then one process per (N, path); print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="64,512,2490", help="numbers of examples")
    ap.add_argument("--paths", default="streaming,whole", help="comma-separated: streaming, whole")
    ap.add_argument("--base", default="tiny-llama", help="base of the seed run")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--seed-file", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.child:
        opts.out.write_text(json.dumps(child(opts.child, int(opts.n), opts.seed_file)))
        return 0
    sizes = [int(v) for v in opts.n.split(",") if v.strip()]
    paths = [p.strip() for p in opts.paths.split(",") if p.strip()]
    with tempfile.TemporaryDirectory(prefix="anchorlens-bench-compare-") as tmp:
        folder = Path(tmp)
        seed_file = seed_rows(opts.base, folder)
        rows = len(pd.read_parquet(seed_file, columns=["example"])) // (2 * SEED_N)
        print(f"compare rows of {opts.base} (base vs instance, ~{rows:,} rows per example and checkpoint) replayed to")
        print(f"N examples in chunks of {CHUNK}; n_boot {N_BOOT}, n_perm 2000 (paired) / 10000 (headline)")
        print(f"{'path':>10} {'N':>8}  {'peak RSS MiB':>12}  {'x smallest':>10}  {'feed s':>8}  {'stats s':>8}")
        first: dict[str, float] = {}
        for n in sizes:
            for path in paths:
                rss, rep = run_child(path, n, seed_file, folder / f"{path}-{n}.json")
                first.setdefault(path, rss)
                print(
                    f"{path:>10} {n:>8,}  {rss:>12,.0f}  {rss / first[path]:>10.3f}  {rep['feed_s']:>8.1f}  "
                    f"{rep['stats_s']:>8.1f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
