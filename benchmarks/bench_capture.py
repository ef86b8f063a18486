"""Capture cost and streaming memory, measured side by side in one run.

Prints: capture time (fast and strict modes) / plain sdpa forward time (LM head skipped in both) and eager+output_attentions / sdpa (same batches,
interleaved repeats); peak RSS of streaming capture for N = 16, 64, 256 examples (each N in a fresh
subprocess); the embedded model's cached load time. Run: ``.venv/bin/python benchmarks/bench_capture.py``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

SEQ, BATCH = 256, 8


def bench_model():
    """A 12-layer random Llama with SmolLM2's width (d=576, 9 heads, 3 kv heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from anchorlens.models.adapters import adapter_for
    from anchorlens.models.base import Base

    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=12,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    return Base("bench-llama-12", model, None, adapter_for(model))


def batches(n: int, seed: int = 0):
    """Synthetic Encoded batches of SEQ tokens with a structural/content role pattern."""
    from anchorlens.roles.encoding import Encoded

    g = torch.Generator().manual_seed(seed)
    for start in range(0, n, BATCH):
        b = min(BATCH, n - start)
        ids = torch.randint(10, 49000, (b, SEQ), generator=g)
        mask = torch.ones(b, SEQ, dtype=torch.long)
        mask[b // 2 :, SEQ - 32 :] = 0  # half the batch is shorter (right padding)
        roles = torch.full((b, SEQ), 2, dtype=torch.long)
        roles[:, ::9] = 1
        roles[:, 0] = 0
        yield Encoded(ids, mask, roles, [[""] * SEQ] * b, [["t"] * SEQ] * b, torch.arange(start, start + b))


def reducers():
    """The default metric reducers."""
    from anchorlens.analyses import default_reducers

    return default_reducers()


def time_ratio(repeats: int = 3) -> dict:
    """Median seconds of sdpa forward, capture (streaming reducers) and eager+output_attentions."""
    from anchorlens.capture.collect import stream_statistics

    base = bench_model()
    data = list(batches(16))
    from anchorlens.capture.options import CaptureOptions

    modes: dict[str, list[float]] = {"sdpa": [], "capture": [], "capture_strict": [], "capture_full": [], "eager": []}

    def plain():
        base.model.set_attn_implementation("sdpa")
        with torch.no_grad():
            for b in data:
                base.forward(b, logits_to_keep=1)  # like-for-like: statistics runs skip the LM head too

    def captured():
        stream_statistics(base, data, reducers())  # default mode: fast (no logits needed)

    def captured_strict():
        stream_statistics(base, data, reducers(), options=CaptureOptions(mode="strict"))

    def captured_full_logits():
        from anchorlens.capture.run import capture_batch
        from anchorlens.capture.sinks import StreamSink

        sink = StreamSink(reducers())
        for b in data:
            capture_batch(base, b, sink, need_logits=True)

    def eager():
        base.model.set_attn_implementation("eager")
        with torch.no_grad():
            for b in data:
                base.forward(b, logits_to_keep=1, output_attentions=True)

    plain()  # warm-up
    for _ in range(repeats):
        for name, fn in (
            ("sdpa", plain),
            ("capture", captured),
            ("capture_strict", captured_strict),
            ("capture_full", captured_full_logits),
            ("eager", eager),
        ):
            t = time.perf_counter()
            fn()
            modes[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in modes.items()}
    return {
        "sdpa_s": med["sdpa"],
        "capture_ratio": med["capture"] / med["sdpa"],
        "capture_strict_ratio": med["capture_strict"] / med["sdpa"],
        "capture_full_ratio": med["capture_full"] / med["sdpa"],
        "eager_ratio": med["eager"] / med["sdpa"],
    }


def memory_child(n: int) -> dict:
    """Peak RSS (MiB) before and after streaming capture of n examples (run in a subprocess)."""
    from anchorlens.capture.collect import stream_statistics

    base = bench_model()
    with torch.no_grad():
        base.forward(next(batches(BATCH)))  # warm allocator with one plain batch
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t = time.perf_counter()
    stream_statistics(base, batches(n), reducers())
    seconds = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"n": n, "rss_before_mib": before, "peak_rss_mib": after, "seconds": seconds}


def cached_load_seconds() -> float | None:
    """Seconds for load_base('smollm2-135m') once the converted copy is cached (None if not installed)."""
    from anchorlens.models.embedded import ensure_converted
    from anchorlens.models.loading import load_base

    try:
        ensure_converted()
    except Exception as exc:  # noqa: BLE001 - benchmark reports and goes on
        print(f"embedded model unavailable: {exc}")
        return None
    load_base("tiny-llama")  # import everything first
    t = time.perf_counter()
    load_base("smollm2-135m")
    return time.perf_counter() - t


def main() -> None:
    """Run every measurement and print a table of ratios."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", type=int)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.child:
        print(json.dumps(memory_child(args.child)))
        return
    print(
        f"capture benchmark: 12-layer Llama d=576 9 heads (GQA 3), {SEQ} tokens, batch {BATCH}, {torch.get_num_threads()} threads"
    )
    r = time_ratio(args.repeats)
    print(f"plain sdpa forward, 16 examples:        {r['sdpa_s']:.2f} s")
    print(f"capture fast (streaming reducers) / sdpa:   {r['capture_ratio']:.2f}x   (both skip the LM head)")
    print(f"capture strict (sdpa output kept) / sdpa:   {r['capture_strict_ratio']:.2f}x")
    print(f"capture keeping all logits / sdpa:      {r['capture_full_ratio']:.2f}x")
    print(f"eager + output_attentions / sdpa:       {r['eager_ratio']:.2f}x")
    print("streaming memory (fresh process each):")
    rows = []
    for n in (16, 64, 256):
        out = subprocess.run([sys.executable, __file__, "--child", str(n)], capture_output=True, text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(
            f"  N={n:4d}: peak RSS {row['peak_rss_mib']:7.0f} MiB (after model+warm-up {row['rss_before_mib']:7.0f} MiB), "
            f"{row['n'] / row['seconds']:.1f} examples/s"
        )
    growth = rows[-1]["peak_rss_mib"] / rows[0]["peak_rss_mib"]
    print(f"  peak RSS ratio N=256 / N=16: {growth:.3f}x")
    load = cached_load_seconds()
    if load is not None:
        print(f"cached load_base('smollm2-135m'): {load:.2f} s (target < 3 s)")


if __name__ == "__main__":
    main()
