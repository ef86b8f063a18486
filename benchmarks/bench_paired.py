"""Paired in-process benchmark: plain forward, eager + ``output_attentions`` and anchorlens fast capture on the
same batches, alternating batch by batch in one process, so that the slow drift of a shared machine cancels.

``bench_peers.py`` runs every mode in its own process (and so also measures peak memory), but on a shared
machine the speed of identical runs drifts by ±10% between processes, as large as the differences it
measures. Here the modes take turns on every batch (the order rotating from batch to batch, so no
mode always runs first after another; fast capture is one stream per round, flushed at its end) over
``--repeats`` rounds of the first ``--n`` (64) real RTE training examples (batch 8, SmolLM2-135M); every mode computes
per-layer/head first-token mass and row entropy. Reported: the CPU time of each mode summed over all
batches and rounds, relative to plain, and the spread of the per-round ratios.

``--extra sink_battery,massive_activations`` adds a fast-capture mode per named reducer (the default reducers plus
that one, ``fast+NAME``) and one with all of them (``fast+extra``), in the same rotation: the cost of a reducer
is its mode's ratio beside ``fast``'s.

``--nnsight`` adds nnsight's ``trace`` over the eager model (every layer's attention weights saved, then eager's two
statistics) as a mode in the same rotation; nnsight is an optional extra, never installed by anchorlens.

``--rows`` charges the fast modes with what ``capture`` does after the forward, as it does it: every chunk of 32
examples (4 batches) the reducers' ``metrics_rows`` (derived metrics and mask flags included), saved as a progress
shard by capture's own writer, fresh reducers for the next chunk, and at the end of the round the shards
concatenated into one ``metrics.parquet`` (:func:`~anchorlens.runtime.shards.concat_shards`): the end-to-end
cost of streaming capture, still paired batch by batch with the plain forward.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_paired.py [--repeats 3] [--threads 1] [--extra NAMES] [--rows]
[--nnsight] [--n 64]``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_peers import (  # noqa: E402
    BATCH,
    CHUNK,
    eager_statistics,
    nnsight_statistics,
    plain_forward,
    rotated,
    rte_batches,
)

MODES = ("plain", "eager", "fast")


def main() -> None:
    """Alternate the modes batch by batch and print their CPU-time ratios to plain."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--extra", default="", help="reducer names to add to the defaults, each as its own mode")
    parser.add_argument("--rows", action="store_true", help="also build, save and concatenate each chunk's rows")
    parser.add_argument("--n", type=int, default=64, help="RTE training examples per round")
    parser.add_argument(
        "--nnsight", action="store_true", help="add nnsight's trace as a mode (nnsight must be importable)"
    )
    args, _ = parser.parse_known_args()
    torch.set_num_threads(args.threads)
    from anchorlens.analyses import default_reducers, metrics_rows
    from anchorlens.analyses.registry import make_reducer
    from anchorlens.capture.run import capture_batch
    from anchorlens.capture.sinks import StreamSink
    from anchorlens.models.loading import load_base
    from anchorlens.runtime.shards import Progress, concat_shards

    base = load_base("smollm2-135m")
    batches = rte_batches(base, args.n)
    # fast capture is one stream per round, as stream_statistics runs it: one sink and one set of buffers for
    # every batch, the reducers flushed once at the end of the round (timed, and charged to fast)
    extra = [n for n in args.extra.split(",") if n]
    variants = {"fast": []} | {f"fast+{n}": [n] for n in extra} | ({"fast+extra": extra} if len(extra) > 1 else {})
    reducers = {
        mode: lambda names=names: default_reducers() + [make_reducer(n) for n in names]
        for mode, names in variants.items()
    }
    sinks = {mode: StreamSink(make()) for mode, make in reducers.items()}
    scratches: dict[str, dict] = {mode: {} for mode in variants}
    per_chunk = CHUNK // BATCH
    folder = Path(tempfile.mkdtemp(prefix="bench-paired-"))

    def fast(mode):
        return lambda b: capture_batch(base, b, sinks[mode], need_logits=False, scratch=scratches[mode])

    def end_chunk(mode: str, chunk: int, r: int) -> None:
        """The chunk's rows saved as capture saves them; fresh reducers for the next chunk."""
        sink = sinks[mode]
        sink.close()
        if args.rows:
            progress = Progress(folder / f"{mode}-{r}", mode)
            progress.save(chunk, [chunk], metrics_rows(sink.reducers))
            sinks[mode] = StreamSink(reducers[mode]())

    def end_round(mode: str, r: int, chunks: int) -> None:
        """The round's shards concatenated into one metrics.parquet, as capture finishes."""
        if args.rows:
            progress = Progress(folder / f"{mode}-{r}", mode)
            concat_shards(progress, [(c, [c]) for c in range(chunks)], folder / f"{mode}-{r}.parquet")

    peers: tuple[str, ...] = ()
    run = {"plain": lambda b: plain_forward(base, b), "eager": lambda b: eager_statistics(base, b)}
    if args.nnsight:
        from nnsight import NNsight

        net, layers = NNsight(base.model), base.model.config.num_hidden_layers
        run["nnsight"] = lambda b: nnsight_statistics(net, base, b, layers)
        peers = ("nnsight",)
    modes = (*MODES, *peers, *[m for m in variants if m != "fast"])
    run |= {mode: fast(mode) for mode in variants}
    for mode in modes:  # warm-up: installs the attention function, sizes the allocator
        run[mode](batches[0])
    for mode in variants:
        sinks[mode].close()
        sinks[mode] = StreamSink(reducers[mode]())
    rounds = []
    for r in range(args.repeats):
        cpu = dict.fromkeys(modes, 0.0)
        for i, b in enumerate(batches):
            for mode in rotated(modes, r * len(batches) + i):
                t = time.process_time()
                run[mode](b)
                if mode in variants and (i % per_chunk == per_chunk - 1 or i == len(batches) - 1):
                    end_chunk(mode, i // per_chunk, r)
                cpu[mode] += time.process_time() - t
        for mode in variants:
            t = time.process_time()
            end_round(mode, r, -(-len(batches) // per_chunk))
            cpu[mode] += time.process_time() - t
        rounds.append(cpu)
        print({m: round(cpu[m] / cpu["plain"], 4) for m in modes}, flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    total = {m: sum(r[m] for r in rounds) for m in modes}
    print(
        f"\nSmolLM2-135M, {args.n} RTE examples, batch 8, {args.threads} thread(s), {args.repeats} rounds, "
        "modes alternating per batch in one process"
        + (", each chunk's rows built, saved and concatenated" if args.rows else "")
    )
    print("| mode | CPU time vs plain (all rounds) | vs fast | per round (vs plain) |")
    print("|---|---|---|---|")
    for m in modes:
        per_round = " / ".join(f"{r[m] / r['plain']:.3f}" for r in rounds)
        print(f"| {m} | {total[m] / total['plain']:.3f}x | {total[m] / total['fast']:.3f}x | {per_round} |")


if __name__ == "__main__":
    main()
