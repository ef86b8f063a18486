"""Time per training step and peak memory: capsule vs prompt tuning (100 tokens) vs deep prompt.

Every method trains on the SAME batches; steps are interleaved (method A, B, C, A, B, C, ...)
so drift in machine load hits all methods alike. Peak memory: on CUDA the peak allocated memory
of a step above what was allocated before it; on CPU a child process per method samples its
resident set size (every 0.5 ms) over two steps and reports the growth above the loaded model,
since one process-wide peak cannot be split between interleaved methods.

    python benchmarks/bench_training.py                       # smollm2-135m, 3 methods
    python benchmarks/bench_training.py --base tiny-llama --steps 3
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from anchorlens.evaluation import ScoringBatch, label_scores, scoring_batch, verbalizer_ids  # noqa: E402
from anchorlens.heap import release_free_memory  # noqa: E402
from anchorlens.methods import load_guided  # noqa: E402
from anchorlens.models.loading import load_base  # noqa: E402
from anchorlens.tasks import bundled_examples, get_task  # noqa: E402
from anchorlens.training.losses import classification_loss  # noqa: E402
from anchorlens.training.optim import make_optimizer  # noqa: E402

DEFAULT_METHODS = "capsule,prompt:n=100,deep-prompt:n=20"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default="smollm2-135m")
    p.add_argument(
        "--methods", default=DEFAULT_METHODS, help="comma-separated method specs; the first is the reference"
    )
    p.add_argument("--task", default="rte")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=5, help="timed steps per method (after one warm-up step)")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--dtype", default=None, help="float32 (default), bf16 ...")
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def make_batches(base, task_name: str, batch_size: int, count: int, max_length: int) -> list[ScoringBatch]:
    """``count`` fixed batches of bundled examples (cycled), shared by every method."""
    task = get_task(task_name)
    examples = bundled_examples(task)
    verb = verbalizer_ids(base.tokenizer, task)
    out = []
    for i in range(count):
        part = [examples[(i * batch_size + j) % len(examples)] for j in range(batch_size)]
        out.append(scoring_batch(base, task, part, verb, max_length=max_length).to(base.device))
    return out


def train_step(guided, optimizer, batch: ScoringBatch, verb) -> float:
    """One AdamW step on ``batch``; returns the loss."""
    optimizer.zero_grad(set_to_none=True)
    loss = classification_loss(label_scores(guided, batch, verb), batch.labels)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def sync(device: torch.device) -> None:
    """Wait for queued CUDA work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cuda_step_peak(guided, optimizer, batch, verb, device) -> float:
    """Peak CUDA memory (MiB) allocated by one step above what was allocated before it."""
    sync(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    train_step(guided, optimizer, batch, verb)
    sync(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


def rss_probe(args: argparse.Namespace, spec: str) -> float:
    """Peak RSS growth (MiB) of one step of ``spec``, measured in a fresh child process (CPU only)."""
    cmd = [
        sys.executable,
        __file__,
        "--base",
        args.base,
        "--methods",
        spec,
        "--task",
        args.task,
        "--batch-size",
        str(args.batch_size),
        "--max-length",
        str(args.max_length),
        "--device",
        "cpu",
        "--probe",
    ] + (["--dtype", args.dtype] if args.dtype else [])
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("PEAK_RSS_GROWTH_MB "):
            return float(line.split()[1])
    print(f"memory probe for {spec} failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    return float("nan")


def probe(args: argparse.Namespace) -> None:
    """Child side of ``rss_probe``: warm up, then report peak RSS growth over one more step."""
    base = load_base(args.base, dtype=args.dtype)
    verb = verbalizer_ids(base.tokenizer, get_task(args.task))
    batches = make_batches(base, args.task, args.batch_size, 2, args.max_length)
    guided = load_guided(args.methods, base=base)
    guided.train()
    opt = make_optimizer("adamw", guided.trainable_parameters(), 1e-3)
    with torch.no_grad():  # page in the (memory-mapped) weights so they do not count as step memory
        base.forward(batches[0].encoded)
    gc.collect()
    release_free_memory()  # freed heap back to the OS, so the baseline RSS is the live memory
    start = _rss_kb()
    peak = [start]
    running = threading.Event()
    running.set()

    def sample() -> None:
        """Track the highest RSS until told to stop."""
        while running.is_set():
            peak[0] = max(peak[0], _rss_kb())
            time.sleep(0.0005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    train_step(guided, opt, batches[0], verb)
    train_step(guided, opt, batches[1], verb)
    running.clear()
    sampler.join()
    peak[0] = max(peak[0], _rss_kb())
    print(f"PEAK_RSS_GROWTH_MB {(peak[0] - start) / 1024:.3f}")


def _rss_kb() -> int:
    """Current resident set size in kB (Linux /proc)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print one table with ratios to the first method."""
    args = parse_args(argv)
    if args.probe:
        probe(args)
        return
    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    base = load_base(args.base, dtype=args.dtype, device=str(device))
    specs = [s.strip() for s in args.methods.split(",") if s.strip()]
    verb = verbalizer_ids(base.tokenizer, get_task(args.task))
    batches = make_batches(base, args.task, args.batch_size, args.steps + 1, args.max_length)
    runs = {}
    for spec in specs:
        torch.manual_seed(0)
        guided = load_guided(spec, base=base)
        guided.train()
        runs[spec] = (guided, make_optimizer("adamw", guided.trainable_parameters(), 1e-3))
    times: dict[str, list[float]] = {s: [] for s in specs}
    for i, batch in enumerate(batches):  # interleaved; step 0 is a warm-up
        for spec in specs:
            guided, opt = runs[spec]
            sync(device)
            t0 = time.perf_counter()
            train_step(guided, opt, batch, verb)
            sync(device)
            if i > 0:
                times[spec].append(time.perf_counter() - t0)
    peaks = {}
    for spec in specs:
        guided, opt = runs[spec]
        peaks[spec] = (
            cuda_step_peak(guided, opt, batches[0], verb, device) if device.type == "cuda" else rss_probe(args, spec)
        )
    ref = specs[0]
    t_ref, m_ref = statistics.median(times[ref]), peaks[ref]
    tokens = int(batches[0].encoded.attention_mask.sum()) / args.batch_size
    print(
        f"base {args.base} on {device} ({args.dtype or 'float32'}), task {args.task}, batch {args.batch_size}, "
        f"~{tokens:.0f} input tokens/example, {args.steps} timed steps each (interleaved, same batches)"
    )
    mem_kind = "peak alloc MiB" if device.type == "cuda" else "peak RSS+ MiB"
    print(f"{'method':<24}{'trainable':>11}{'ms/step':>10}{'x time':>8}{mem_kind:>16}{'x mem':>8}")
    for spec in specs:
        guided, _ = runs[spec]
        t = statistics.median(times[spec])
        print(
            f"{spec:<24}{guided.num_trainable():>11,}{t * 1000:>10.1f}{t / t_ref:>8.2f}{peaks[spec]:>16.1f}"
            f"{peaks[spec] / m_ref if m_ref > 0 else float('nan'):>8.2f}"
        )


if __name__ == "__main__":
    main()
