"""run_capture throughput, 1 process vs 2 gloo processes, side by side.

Each setting runs ``run_capture`` in fresh subprocesses on the same CPU budget (1 rank with all
threads, 1 rank with half of them, 2 ranks with half each) over the bundled RTE examples repeated
to ``--n``; the ratio compares 2 ranks with the faster 1-rank setting. On a loaded machine, intra-op
threads oversubscribe badly, so the half-thread 1-rank row is the honest baseline.
Times exclude Python imports; "capture" subtracts the base load time measured in each rank.
Run: ``.venv/bin/python benchmarks/bench_distributed.py [--base llama12|tiny-llama] [--n 96]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

WORKER = """
import json, sys, time
from pathlib import Path
import torch
from anchorlens.capture.selection import Selection
from anchorlens.models.loading import load_base
from anchorlens.runtime import distributed as rt
from anchorlens.workflows.capture_run import run_capture
base, data, n, out, report = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
started = rt.init_if_needed()
t0 = time.perf_counter(); load_base(base); load_s = time.perf_counter() - t0
rt.barrier()
t0 = time.perf_counter()
run_capture("base", base, "rte", Path(data), n, Selection(), 8, Path(out), True, chunk_size=16, progress=False)
wall = time.perf_counter() - t0
Path(report).write_text(json.dumps({"wall": wall, "load": load_s, "threads": torch.get_num_threads()}))
rt.shutdown(started)
"""


def build_llama12(root: Path) -> str:
    """A 12-layer random Llama (d=256, 8 heads) with the tiny llama tokenizer, saved as an HF dir."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from anchorlens.models.tiny_tokenizers import tiny_tokenizer

    tok = tiny_tokenizer("llama")
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=12,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    path = root / "llama12"
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return str(path)


def build_data(root: Path, n: int) -> Path:
    """The bundled RTE rows repeated to ``n`` lines."""
    rows = (REPO / "anchorlens/tasks/examples/rte.jsonl").read_text().splitlines()
    rows = [r for r in rows if r.strip()]
    path = root / "rte.jsonl"
    lines = []
    for i in range(n):
        row = json.loads(rows[i % len(rows)])
        row["idx"] = i
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def free_port() -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world: int, base: str, data: Path, n: int, root: Path, threads: int) -> dict:
    """Run the worker on ``world`` ranks; rank 0's report."""
    port, procs, reports = str(free_port()), [], []
    out = root / f"out-{world}"
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
        if world > 1:
            env.update(
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(world),
                LOCAL_WORLD_SIZE=str(world),
            )
        report = root / f"report-{world}-{rank}.json"
        reports.append(report)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER, base, str(data), str(n), str(out), str(report)], cwd=REPO, env=env
            )
        )
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"world {world}: exit codes {codes}")
    return json.loads(reports[0].read_text())


def main() -> None:
    """Print examples/second for 1 and 2 processes and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="llama12", help="llama12 (12-layer random Llama) or a base spec")
    parser.add_argument("--n", type=int, default=96, help="examples")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2, help="CPU threads shared by the ranks")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = build_llama12(root) if args.base == "llama12" else args.base
        data = build_data(root, args.n)
        half = max(1, args.cores // 2)
        runs = [("1 process", run_world(1, base, data, args.n, root, args.cores))]
        if half != args.cores:
            runs.append(("1 process", run_world(1, base, data, args.n, root, half)))
        two = run_world(2, base, data, args.n, root, half)
    rows = [(name, r["threads"], args.n / r["wall"], args.n / max(r["wall"] - r["load"], 1e-9)) for name, r in runs]
    best = max(rows, key=lambda row: row[3])
    rows.append(("2 processes", two["threads"], args.n / two["wall"], args.n / max(two["wall"] - two["load"], 1e-9)))
    print(f"run_capture on {args.base}, {args.n} RTE examples, batch 8, chunk 16, {args.cores} cores")
    print(f"{'setting':<12} {'threads/rank':>12} {'ex/s (wall)':>12} {'ex/s (capture)':>15}")
    for name, threads, wall, capture in rows:
        print(f"{name:<12} {threads:>12} {wall:>12.1f} {capture:>15.1f}")
    print(f"{'2p / best 1p':<12} {'':>12} {rows[-1][2] / best[2]:>11.2f}x {rows[-1][3] / best[3]:>14.2f}x")


if __name__ == "__main__":
    main()
