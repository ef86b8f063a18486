"""Run every benchmark in one go (``make bench``); each prints its ratios side by side."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = [
    "bench_peers.py",
    "bench_paired.py",
    "bench_capture.py",
    "bench_long_inputs.py",
    "bench_statistics.py",
    "bench_training.py",
    "bench_distributed.py",
    "bench_compare.py",
    "bench_memory.py",
]


def main() -> int:
    """Run each benchmark script with this interpreter; stop at the first failure."""
    for name in BENCHMARKS:
        print(f"\n=== {name} ===", flush=True)
        done = subprocess.run([sys.executable, str(HERE / name), *sys.argv[1:]])
        if done.returncode != 0:
            return done.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
