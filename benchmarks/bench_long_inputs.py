"""Long inputs: capture time and peak memory vs a plain forward and vs eager, as the input grows.

``--model`` (default SmolLM2-135M, 30 layers; ``tiny-llama``, random, 4 layers, for 16k-32k tokens) on one
synthetic input of T tokens per mode, each in a fresh process, interleaved over ``--repeats`` rounds (the order of the modes rotating from round to round):
``plain`` (sdpa, LM head skipped), ``eager`` (eager + output_attentions, first-token mass and row entropy
taken from the maps; skipped above ``--eager-max`` tokens, where its 30 stored maps alone need 30·9·T²·4
bytes), ``fast`` (anchorlens streaming, default reducers, default 512 MiB recompute budget, the materialised plan:
what plan ``auto`` takes for the default reducers on a CPU), ``kernel`` (the same reducers under the kernel plan: the
flash kernel's log-sum-exp, no probabilities materialised, :mod:`anchorlens.engine.kernel`). ``--reducers light`` streams
role flow, first token and decomposition only (no entropy: the kernel plan needs no pass beyond the output's).
``evidence`` (asked for in ``--modes``) streams the reducers of ``kernel`` and the evidence reducers sink battery and
value mass under the kernel plan (the mass each key receives: one transposed pass; the value-weighted key sums: passes
of per-head columns); its cost over ``kernel``'s is paired per round; ``evidence-materialised`` the same reducers under
the materialised plan. A short input's
forward takes under a second, so each process repeats it until ``--min-seconds`` of CPU time have passed
and reports the time per forward. Reported: CPU time ratio to plain (median over rounds, and capture /
eager paired per round) and peak RSS above the loaded model (MiB), per T.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_long_inputs.py [--lengths 256,512,1024,2048,4096]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_peers: the shared modes

from bench_peers import rotated  # noqa: E402

MODES = ("plain", "eager", "fast", "kernel", "evidence", "evidence-materialised")
EVIDENCE = ("sink_battery", "value_mass")
LIGHT = ("role_flow", "first_token", "decomposition")


def synthetic_batch(base, length: int):
    """One Encoded input of ``length`` tokens: a structural frame around random content tokens."""
    from anchorlens.roles.encoding import Encoded

    g = torch.Generator().manual_seed(length)
    vocab = int(base.model.config.vocab_size)
    ids = torch.randint(min(100, vocab // 2), min(40000, vocab), (1, length), generator=g)
    roles = torch.full((1, length), 2, dtype=torch.long)
    roles[:, :8] = 1
    roles[:, -8:] = 1
    roles[:, 0] = 0
    return Encoded(
        ids, torch.ones(1, length, dtype=torch.long), roles, [[""] * length], [["t"] * length], torch.arange(1)
    )


def child(
    mode: str, length: int, out: Path, min_seconds: float, reducers: str = "default", model: str = "smollm2-135m"
) -> None:
    """Measure one mode at one length in this fresh process."""
    from bench_peers import eager_statistics, plain_forward

    from anchorlens.analyses import default_reducers
    from anchorlens.analyses.registry import make_reducer
    from anchorlens.capture.collect import stream_statistics
    from anchorlens.capture.options import CaptureOptions
    from anchorlens.models.loading import load_base

    base = load_base(model)
    batch = synthetic_batch(base, length)
    warm = synthetic_batch(base, 16)
    with torch.no_grad():
        base.forward(warm, logits_to_keep=1)
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def run(b):
        if mode == "plain":
            plain_forward(base, b)
        elif mode == "eager":
            eager_statistics(base, b)
        else:
            if reducers == "light":
                made = [make_reducer(n) for n in LIGHT]
            else:
                made = default_reducers(extra=EVIDENCE if mode.startswith("evidence") else ())
            plan = "materialised" if mode in ("fast", "evidence-materialised") else "kernel"
            stream_statistics(base, [b], made, options=CaptureOptions(plan=plan))

    run(warm)
    cpu, wall, runs = time.process_time(), time.perf_counter(), 0
    while runs == 0 or time.process_time() - cpu < min_seconds:
        run(batch)
        runs += 1
    cpu, wall = (time.process_time() - cpu) / runs, (time.perf_counter() - wall) / runs
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out.write_text(
        json.dumps({"cpu": cpu, "wall": wall, "runs": runs, "peak_mib": peak, "above_model_mib": peak - loaded})
    )


def main() -> None:
    """Run the grid and print one table row per length."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--child")
    parser.add_argument("--length", type=int)
    parser.add_argument("--out")
    parser.add_argument("--lengths", default="256,512,1024,2048,4096")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eager-max", type=int, default=2048)
    parser.add_argument("--min-seconds", type=float, default=4.0, help="CPU seconds each process spends forwarding")
    parser.add_argument("--reducers", choices=("default", "light"), default="default")
    parser.add_argument("--modes", default=",".join(MODES[:4]), help="a subset of " + ",".join(MODES))
    parser.add_argument(
        "--model", default="smollm2-135m", help="a base spec: tiny-llama (random, 4 layers) for 16k-32k tokens"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        child(args.child, args.length, Path(args.out), args.min_seconds, args.reducers, args.model)
        return
    lengths = [int(x) for x in args.lengths.split(",")]
    modes = tuple(m for m in MODES if m in args.modes.split(","))
    rows: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for length in lengths:
                for mode in rotated(modes, r):
                    if mode == "eager" and length > args.eager_max:
                        continue
                    out = Path(tmp) / f"{mode}-{length}-{r}.json"
                    subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            "--child",
                            mode,
                            "--length",
                            str(length),
                            "--out",
                            str(out),
                            "--threads",
                            str(args.threads),
                            "--min-seconds",
                            str(args.min_seconds),
                            "--reducers",
                            args.reducers,
                            "--model",
                            args.model,
                        ],
                        check=True,
                    )
                    rows.setdefault((mode, length), []).append(json.loads(out.read_text()))
                    print(f"round {r} T={length} {mode}: {rows[(mode, length)][-1]}", flush=True)

    def med(mode: str, length: int, key: str) -> float | None:
        got = rows.get((mode, length))
        return statistics.median(x[key] for x in got) if got else None

    print(
        f"\n{args.model}, batch 1, {args.threads} thread(s), median of {args.repeats} rounds, {args.reducers} reducers"
    )
    print(
        "| T | materialised plan CPU / plain | kernel plan CPU / plain | eager CPU / plain | capture / eager, paired "
        "(rounds) | evidence CPU / plain: materialised / kernel | evidence / kernel, paired (rounds) | peak RSS above "
        "model: plain / materialised / kernel / eager / evidence materialised / evidence kernel (MiB) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    named = ("plain", "fast", "kernel", "eager", "evidence-materialised", "evidence")
    for length in lengths:
        p, c, kern, e, evm, ev = (med(m, length, "cpu") for m in named)
        mp, mc, mk, me, mvm, mv = (med(m, length, "above_model_mib") for m in named)
        assert p is not None and mp is not None, "every length measures the plain forward"

        def ratio(x: float | None, plain: float = p) -> str:
            return "-" if x is None else f"{x / plain:.2f}x"

        def mib(x: float | None) -> str:
            return "-" if x is None else f"{x:.0f}"

        # capture / eager paired within each round (the two ran back to back), median and every round
        def paired(a: str, b: str, length: int = length) -> str:
            each = [f["cpu"] / g["cpu"] for f, g in zip(rows.get((a, length), []), rows.get((b, length), []))]
            rounds = " / ".join(f"{x:.2f}" for x in each)
            return "-" if not each else f"{statistics.median(each):.2f}x ({rounds})"

        print(
            f"| {length} | {ratio(c)} | {ratio(kern)} | {ratio(e)} | {paired('fast', 'eager')} | {ratio(evm)} / "
            f"{ratio(ev)} | {paired('evidence', 'kernel')} | {mib(mp)} / {mib(mc)} / {mib(mk)} / {mib(me)} / "
            f"{mib(mvm)} / {mib(mv)} |"
        )


if __name__ == "__main__":
    main()
