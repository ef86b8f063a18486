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
    "bench_compare_memory.py",
]


def main() -> int:
    """Run each benchmark script with this interpreter; stop at the first failure."""
    for name in BENCHMARKS:
        print(f"\n=== {name} ===", flush=True)
        done = subprocess.run([sys.executable, str(HERE / name), *sys.argv[1:]])
        if done.returncode != 0:
            return done.returncode
    gpu = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    smoke = [] if subprocess.run([sys.executable, "-c", gpu]).returncode == 0 else ["--smoke"]
    print(f"\n=== bench_gpu.py {' '.join(smoke)} ===".rstrip(), flush=True)  # no GPU: the tiny-shape smoke run
    return subprocess.run([sys.executable, str(HERE / "bench_gpu.py"), *smoke]).returncode


if __name__ == "__main__":
    sys.exit(main())
