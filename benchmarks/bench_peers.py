"""Peer benchmark: anchorlens capture against a plain forward, HF eager attentions and (if installed) peers.

Every mode runs in its own fresh process on the embedded SmolLM2-135M and the first 64 (``--n``) real RTE
training examples (batch 8, length-sorted), interleaved over ``--repeats`` rounds (default 5; the order of the modes
rotates from round to round, so no mode always runs first or after the same one). Reported per mode: median
CPU-time and wall ratios to the plain forward (sdpa, LM head skipped), peak RSS, and the largest
|Δ| of per-example, per-layer, per-head first-token mass against HF eager ``output_attentions``.

Modes: ``plain`` (sdpa, ``logits_to_keep=1``), ``eager`` (eager + output_attentions, every layer's
first-token mass computed from the returned maps), ``fast`` / ``strict`` (anchorlens streaming with the
default reducers, as ``capture`` runs them: chunks of 32 examples whose metric rows go to an Arrow shard on
disk through capture's own shard writer, so nothing of a finished chunk stays in memory, and the shards are
concatenated into one ``metrics.parquet`` at the end), ``evidence`` (``fast`` plus ``value_mass`` and ``sink_battery``,
the issue's cost target) and ``evidence_all`` (also ``massive_activations``: what ``--evidence all`` costs),
``maps`` (anchorlens full maps of all 64 examples), and ``nnsight`` when importable (its ``trace`` over the
eager model saving every layer's attention weights, then the same statistics as ``eager``; an optional extra,
never installed by anchorlens: ``pip install --no-deps nnsight==0.8.1`` plus its small pure-Python deps).

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_peers.py [--repeats 5] [--threads 1] [--n 64]
[--modes plain,eager,fast,evidence]``.
The machine may be shared: compare the ratios measured side by side, not absolute times.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

RTE = Path(__file__).resolve().parents[2] / "shared" / "data" / "superglue" / "RTE" / "train.jsonl"  # ../shared
N_EXAMPLES, BATCH, CHUNK = 64, 8, 32


def rte_batches(base, n: int = N_EXAMPLES, batch_size: int = BATCH):
    """Encoded, length-sorted batches of the first ``n`` RTE training examples."""
    from anchorlens.capture.collect import encode_batches
    from anchorlens.tasks.examples import load_examples
    from anchorlens.tasks.registry import get_task

    examples = load_examples(RTE, "rte", limit=n)
    return list(encode_batches(base, examples, get_task("rte").template, batch_size=batch_size))


def first_token_from_maps(attentions, attention_mask: torch.Tensor) -> np.ndarray:
    """[B, L, H] mean mass on the first valid key over valid queries, from per-layer maps [B, H, Q, K]."""
    valid = attention_mask.bool()
    first = valid.long().argmax(1)  # [B]
    out = []
    for att in attentions:
        b, h, q, _ = att.shape
        mass = att.float().gather(-1, first.view(b, 1, 1, 1).expand(b, h, q, 1)).squeeze(-1)  # [B, H, Q]
        w = valid[:, None, :].float()
        out.append(((mass * w).sum(-1) / w.sum(-1)).numpy())
    return np.stack(out, axis=1)


def entropy_from_maps(attentions, attention_mask: torch.Tensor) -> np.ndarray:
    """[B, L, H] mean row entropy (nats) over valid queries, from per-layer maps [B, H, Q, K]: what a user of
    eager attention computes beside the first-token mass (a pass over every map, as anchorlens' entropy makes)."""
    w = attention_mask.bool()[:, None, :].float()
    out = []
    for att in attentions:
        h = -torch.special.xlogy(att.float(), att.float()).sum(-1)  # [B, H, Q]
        out.append(((h * w).sum(-1) / w.sum(-1)).numpy())
    return np.stack(out, axis=1)


def rotated(modes: Sequence[str], turn: int) -> list[str]:
    """``modes`` starting at ``turn`` (mod len): the order of one round or batch, so that no mode always leads."""
    shift = turn % len(modes)
    return list(modes[shift:]) + list(modes[:shift])


def plain_forward(base, batch) -> None:
    """The like-for-like baseline: one sdpa forward with the LM head skipped."""
    base.model.set_attn_implementation("sdpa")
    with torch.no_grad():
        base.forward(batch, logits_to_keep=1)


def eager_statistics(base, batch) -> np.ndarray:
    """Eager + ``output_attentions``, then the first-token mass ([B, L, H], returned) and row entropy from the maps,
    as a user of eager attention computes them (the reducers compute both)."""
    base.model.set_attn_implementation("eager")
    with torch.no_grad():
        out = base.forward(batch, logits_to_keep=1, output_attentions=True)
        entropy_from_maps(out.attentions, batch.attention_mask)
        return first_token_from_maps(out.attentions, batch.attention_mask)


def nnsight_statistics(net, base, batch, layers: int) -> np.ndarray:
    """nnsight's ``trace`` over the eager model (``net``: ``NNsight(base.model)``) saving every layer's attention
    weights, then the first-token mass ([B, L, H], returned) and row entropy from them, as :func:`eager_statistics`."""
    base.model.set_attn_implementation("eager")
    with torch.no_grad(), net.trace(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=1):
        saved = list().save()
        for i in range(layers):
            saved.append(net.model.layers[i].self_attn.output[1])
    entropy_from_maps(saved, batch.attention_mask)
    return first_token_from_maps(saved, batch.attention_mask)


def masses_from_frame(frame, n_layers: int, n_heads: int) -> dict[int, np.ndarray]:
    """example id -> [L, H] first-token mass (query role ``all``) from a first_token reducer frame."""
    rows = frame[(frame["metric"] == "first_token_mass") & (frame["query_role"] == "all")]
    out: dict[int, np.ndarray] = {}
    for ex, part in rows.groupby("example"):
        arr = np.zeros((n_layers, n_heads))
        arr[part["layer"].to_numpy(), part["head"].to_numpy()] = part["value"].to_numpy()
        out[int(ex)] = arr
    return out


def run_mode(mode: str, n: int = N_EXAMPLES) -> tuple[float, float, dict[int, np.ndarray]]:
    """Run one mode over all batches; (cpu seconds, wall seconds, example -> [L, H] first-token mass)."""
    from anchorlens.analyses import EVIDENCE_REDUCERS, default_reducers, metrics_rows
    from anchorlens.capture.collect import collect_maps, stream_statistics
    from anchorlens.capture.options import CaptureOptions
    from anchorlens.models.loading import load_base
    from anchorlens.runtime.shards import Progress, concat_shards, run_chunks

    base = load_base("smollm2-135m")
    batches = rte_batches(base, n)
    cfg: Any = base.model.config
    layers, heads = cfg.num_hidden_layers, cfg.num_attention_heads
    masses: dict[int, np.ndarray] = {}

    def plain(bs):
        for b in bs:
            plain_forward(base, b)

    def eager(bs):
        for b in bs:
            m = eager_statistics(base, b)
            masses.update({int(e): m[i] for i, e in enumerate(b.example_ids.tolist())})

    def streaming(bs, which, extra=()):
        per_chunk = CHUNK // BATCH
        chunks = [(c, list(range(c, min(c + per_chunk, len(bs))))) for c in range(0, len(bs), per_chunk)]

        def compute(ids):  # as capture's chunks: fresh reducers, the chunk's metric rows, saved as a shard
            reducers = default_reducers(extra=extra)
            stream_statistics(base, [bs[i] for i in ids], reducers, options=CaptureOptions(mode=which))
            rows = metrics_rows(reducers)  # as capture: the shard is written from the rows, no frame is built
            first = rows.where("metric", ["first_token_mass"]) & rows.where("query_role", ["all"])
            masses.update(masses_from_frame(rows.take(first).frame(), layers, heads))
            return rows

        with tempfile.TemporaryDirectory() as tmp:
            progress = Progress(tmp, f"bench-{which}")
            run_chunks(chunks, compute, progress)  # capture's own shard writer and commit markers
            concat_shards(progress, chunks, Path(tmp) / "metrics.parquet")  # and its final metrics.parquet

    def maps(bs):
        for amap in collect_maps(base, bs, max_examples=len(bs) * BATCH):
            sm = amap["decoder"]
            q = sm.probs.shape[2]
            masses[amap.example_id] = sm.probs[:, :, :, 0].sum(-1).numpy() / q

    def nnsight(bs):  # nnsight's own trace over the eager model: every layer's attention weights saved
        from nnsight import NNsight

        net = NNsight(base.model)
        for b in bs:
            m = nnsight_statistics(net, base, b, layers)
            masses.update({int(e): m[i] for i, e in enumerate(b.example_ids.tolist())})

    def peer(bs, name):
        raise SystemExit(f"{name}: not measured here (install it in a separate venv and add its loop)")

    fns = {
        "plain": plain,
        "eager": eager,
        "fast": lambda bs: streaming(bs, "fast"),
        "strict": lambda bs: streaming(bs, "strict"),
        "evidence": lambda bs: streaming(bs, "fast", ("value_mass", "sink_battery")),
        "evidence_all": lambda bs: streaming(bs, "fast", EVIDENCE_REDUCERS),
        "maps": maps,
        "nnsight": nnsight,
    }
    fn = fns[mode] if mode in fns else (lambda bs: peer(bs, mode))
    fn(batches[:1])  # warm-up: installs functions, allocator, threads
    masses.clear()
    cpu, wall = time.process_time(), time.perf_counter()
    fn(batches)
    return time.process_time() - cpu, time.perf_counter() - wall, masses


def child(mode: str, out: Path, n: int) -> None:
    """Measure one mode in this (fresh) process and write its numbers and masses."""
    cpu, wall, masses = run_mode(mode, n)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if masses:
        ids = sorted(masses)
        np.save(out.with_suffix(".npy"), np.stack([masses[i] for i in ids]))
    out.write_text(json.dumps({"mode": mode, "cpu": cpu, "wall": wall, "rss_mib": rss}))


def available_modes() -> list[str]:
    """The built-in modes plus peers that can be imported here."""
    modes = ["plain", "eager", "fast", "strict", "evidence", "evidence_all", "maps"]
    if importlib.util.find_spec("nnsight") is not None:
        modes.append("nnsight")
    if importlib.util.find_spec("transformer_lens") is not None:
        print("TransformerLens is importable but its loop is not implemented in this benchmark; skipped")
    return modes


def main() -> None:
    """Run every mode in its own process, interleaved, and print the table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--child")
    parser.add_argument("--out")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--modes", default=None, help="comma-separated subset of modes")
    parser.add_argument("--n", type=int, default=N_EXAMPLES, help="RTE training examples per run")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        child(args.child, Path(args.out), args.n)
        return
    modes = args.modes.split(",") if args.modes else available_modes()
    results: dict[str, list[dict]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for mode in rotated(modes, r):  # within a round the machine drifts too
                out = Path(tmp) / f"{mode}-{r}.json"
                subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        mode,
                        "--out",
                        str(out),
                        "--threads",
                        str(args.threads),
                        "--n",
                        str(args.n),
                    ],  # fmt: skip
                    check=True,
                )
                results[mode].append(json.loads(out.read_text()))
                print(f"round {r} {mode}: {results[mode][-1]}", flush=True)
        eager = np.load(Path(tmp) / "eager-0.npy") if "eager" in modes else None
        deltas = {}
        for mode in modes:
            path = Path(tmp) / f"{mode}-0.npy"
            deltas[mode] = float(np.abs(np.load(path) - eager).max()) if eager is not None and path.exists() else None
    med = {
        m: {k: statistics.median(x[k] for x in rows) for k in ("cpu", "wall", "rss_mib")} for m, rows in results.items()
    }
    base_cpu, base_wall = med["plain"]["cpu"], med["plain"]["wall"]
    print(
        f"\nSmolLM2-135M, {args.n} RTE examples, batch {BATCH}, {args.threads} thread(s), "
        f"median of {args.repeats} interleaved rounds, each mode in its own process"
    )
    # each round runs every mode back to back (in a rotating order), so a round's ratio pairs measurements
    # taken under the same machine load; their median is steadier than the ratio of medians on a shared machine
    paired = {
        m: [x["cpu"] / p["cpu"] for x, p in zip(rows, results["plain"], strict=True)] for m, rows in results.items()
    }
    print(
        "| mode | CPU time vs plain | paired per round (median; each round) | wall vs plain | peak RSS (MiB) "
        "| peak RSS vs plain per round | max abs Δ first-token mass vs eager |"
    )
    print("|---|---|---|---|---|---|---|")
    for mode in modes:
        d = deltas[mode]
        rounds = " / ".join(f"{r:.2f}" for r in paired[mode])
        rss = " / ".join(
            f"{x['rss_mib'] / p['rss_mib'] - 1:+.1%}" for x, p in zip(results[mode], results["plain"], strict=True)
        )
        print(
            f"| {mode} | {med[mode]['cpu'] / base_cpu:.3f}x | {statistics.median(paired[mode]):.3f}x ({rounds}) | "
            f"{med[mode]['wall'] / base_wall:.3f}x | {med[mode]['rss_mib']:.0f} | {rss} | "
            f"{'-' if d is None else f'{d:.1e}'} |"
        )


if __name__ == "__main__":
    main()
