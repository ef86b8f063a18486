"""The statistics stage of `compare` at scale: paired bootstrap CIs, sign-flip tests and BH FDR
over synthetic long metric frames (examples x 30 layers x 9 heads x headline cells, two checkpoints).

    python benchmarks/bench_statistics.py                 # 1,024 and 10,000 examples
    python benchmarks/bench_statistics.py --n 1024 --old  # also time the join + groupby path it replaces

Prints wall seconds and peak RSS per size. The statistics are those of ``compare`` (n_boot 2000,
n_perm 2000, BH per checkpoint and metric) on per-head rows and on head-averaged rows.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from anchorlens.analyses import average_heads, compare_frames, paired_differences, paired_summary  # noqa: E402

CELLS = [("decomposition", "input", k) for k in ("sink", "guidance", "structural", "content", "special")] + [
    ("guidance_absorption", "input", "guidance"),
    ("entropy", "input", ""),
    ("island_score", "guidance", "guidance"),
]


def synthetic(n: int, shift: float, seed: int, layers: int = 30, heads: int = 9) -> pd.DataFrame:
    """Long tidy rows: n examples x layers x heads x CELLS (categorical strings, as a parquet read gives)."""
    rng = np.random.default_rng(seed)
    c = len(CELLS)
    shape = (n, layers, heads, c)
    idx = np.indices(shape).reshape(4, -1)
    df = pd.DataFrame(
        {
            "example": idx[0].astype(np.int64),
            "stack": pd.Categorical.from_codes(np.zeros(idx.shape[1], dtype=np.int8), ["decoder"]),
            "layer": idx[1].astype(np.int64),
            "head": idx[2].astype(np.int64),
            "metric": pd.Categorical([CELLS[i][0] for i in range(c)])[idx[3]],
            "query_role": pd.Categorical([CELLS[i][1] for i in range(c)])[idx[3]],
            "key_role": pd.Categorical([CELLS[i][2] for i in range(c)])[idx[3]],
            "value": rng.random(idx.shape[1]) * 0.5 + shift,
            "count": 40.0,
        }
    )
    return df


def old_compare(frames: dict, baseline: str, n_boot: int, n_perm: int) -> pd.DataFrame:
    """The join + groupby path compare_frames used before (paired_differences + paired_summary)."""
    cell = ["metric", "stack", "layer", "head", "query_role", "key_role"]
    parts = []
    for name, df in frames.items():
        if name != baseline:
            d = paired_differences(df, frames[baseline], on=["example", *cell])
            parts.append(paired_summary(d, cell, n_boot=n_boot, n_perm=n_perm))
    return pd.concat(parts)


def peak_mib() -> float:
    """Peak resident set size of this process so far, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    """Time the statistics stage at each size."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[1024, 10000])
    p.add_argument("--old", action="store_true", help="also time the previous join + groupby path")
    p.add_argument(
        "--strings", action="store_true", help="str key columns (as conform() gives) instead of categoricals"
    )
    args = p.parse_args()
    for n in args.n:
        frames = {"base": synthetic(n, 0.0, 0), "instance": synthetic(n, 0.05, 1)}
        if args.strings:
            frames = {
                k: v.astype({c: "str" for c in ("stack", "metric", "query_role", "key_role")})
                for k, v in frames.items()
            }
        rows = sum(len(f) for f in frames.values())
        t = time.perf_counter()
        per_head = compare_frames(frames, "base", n_boot=2000, n_perm=2000, family=["checkpoint", "metric"])
        t_head = time.perf_counter() - t
        t = time.perf_counter()
        means = {k: average_heads(v) for k, v in frames.items()}
        layer_mean = compare_frames(means, "base", n_boot=2000, n_perm=2000, family=["checkpoint", "metric"])
        t_mean = time.perf_counter() - t
        print(
            f"{n:>6} examples, {rows / 1e6:.1f} M rows: per-head cells {len(per_head)} in {t_head:.1f} s, "
            f"head-averaged cells {len(layer_mean)} in {t_mean:.1f} s, total {t_head + t_mean:.1f} s, "
            f"peak RSS {peak_mib():.0f} MiB",
            flush=True,
        )
        if args.old:
            t = time.perf_counter()
            old_compare(frames, "base", 2000, 2000)
            print(
                f"{n:>6} examples: previous join + groupby path (per-head cells only) {time.perf_counter() - t:.1f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
