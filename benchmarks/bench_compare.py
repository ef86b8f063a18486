"""End-to-end `compare` throughput on the embedded model: examples per second, capture vs plain forward.

python benchmarks/bench_compare.py            # smollm2-135m, base vs instance, 24 bundled RTE examples
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from anchorlens.capture.collect import encode_batches  # noqa: E402
from anchorlens.models.loading import load_base  # noqa: E402
from anchorlens.workflows.compare import compare  # noqa: E402
from anchorlens.workflows.inputs import resolve_inputs  # noqa: E402


def main() -> None:
    """Time compare() end to end and plain forwards of the same examples, and print the ratio."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default="smollm2-135m")
    p.add_argument("--n", type=int, default=24)
    args, _ = p.parse_known_args()
    base = load_base(args.base)
    inputs = resolve_inputs("rte", None, args.n)
    t = time.perf_counter()
    with torch.no_grad():
        for _ in range(2):  # two checkpoints' worth of plain forwards
            for batch in encode_batches(base, inputs.examples, inputs.task.template):
                base.forward(batch)
    plain = time.perf_counter() - t
    t = time.perf_counter()
    compare(["base", "instance"], base=args.base, n=args.n, n_boot=2000)
    full = time.perf_counter() - t
    print(
        f"compare base vs instance, {args.n} examples on {args.base}: {full:.1f} s, "
        f"{2 * args.n / full:.2f} checkpoint-examples/s"
    )
    print(f"compare / two plain sdpa passes: {full / plain:.2f}x (capture, statistics, maps, bootstrap included)")


if __name__ == "__main__":
    main()
