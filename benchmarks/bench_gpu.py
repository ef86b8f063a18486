"""GPU benchmark: a plain sdpa forward vs anchorlens streaming capture vs eager + output_attentions, side by side.

Random-weight models with the shapes of Llama-3.2-1B and Qwen2.5-1.5B, built from their configs (nothing is
downloaded), in bfloat16, over a grid of batch size x input length (up to 8k tokens). Per model and grid point,
the three modes run interleaved (the order rotating every round) and the table gives the median time of each
relative to the plain forward (LM head skipped in all three) and the peak CUDA memory of each (above the loaded
model). Eager + output_attentions stores every layer's [B, H, T, T] map: it is skipped where that would exceed
``--eager-max-gib``. Exactness: on the smallest grid point, the model in float32, anchorlens' first-token mass per
example, layer and head against the same number taken from eager's maps (largest |difference|).

    python benchmarks/bench_gpu.py                      # on a CUDA machine: the full grid
    python benchmarks/bench_gpu.py --batches 1,4 --lengths 1024,8192 --models llama-3.2-1b
    python benchmarks/bench_gpu.py --smoke              # CPU: tiny shapes, one repeat (what the tests run)

On CPU without ``--smoke`` it refuses (the real shapes would take hours); ``--smoke`` runs anywhere. Timings
on a shared machine are only comparable as ratios measured side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_peers: the shared eager statistics

from bench_peers import first_token_from_maps, masses_from_frame, rotated  # noqa: E402

MODES = ("sdpa", "capture", "eager")


def llama_3_2_1b(smoke: bool) -> Any:
    """Llama-3.2-1B's config (16 layers, d=2048, 32 heads over 8 kv heads); tiny with the same layout for smoke."""
    from transformers import LlamaConfig

    if smoke:
        return LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
    return LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, max_position_embeddings=131072, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
        tie_word_embeddings=True, rms_norm_eps=1e-5,
    )  # fmt: skip


def qwen2_5_1_5b(smoke: bool) -> Any:
    """Qwen2.5-1.5B's config (28 layers, d=1536, 12 heads over 2 kv heads, qkv bias); tiny for smoke."""
    from transformers import Qwen2Config

    if smoke:
        return Qwen2Config(vocab_size=512, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
    return Qwen2Config(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    )  # fmt: skip


MODELS: dict[str, Callable[[bool], Any]] = {"llama-3.2-1b": llama_3_2_1b, "qwen2.5-1.5b": qwen2_5_1_5b}


def build_base(name: str, smoke: bool, dtype: torch.dtype, device: torch.device):
    """A random-weight anchorlens Base with ``name``'s shapes (seeded), in ``dtype`` on ``device``."""
    from transformers import AutoModelForCausalLM

    from anchorlens.models.adapters import adapter_for
    from anchorlens.models.base import Base

    cfg = MODELS[name](smoke)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).to(device).eval()
    return Base(f"bench-{name}", model, None, adapter_for(model))


def batch_of(base, batch: int, length: int):
    """One Encoded batch of random tokens: a structural frame (first and last 8 tokens) around content, row 0's
    last quarter right-padded when batch > 1 (padding is part of the real workload)."""
    from anchorlens.roles.encoding import Encoded

    g = torch.Generator().manual_seed(batch * 100003 + length)
    vocab = int(base.model.config.vocab_size)
    ids = torch.randint(min(100, vocab // 4), vocab - 1, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[0, length - length // 4 :] = 0
    roles = torch.full((batch, length), 2, dtype=torch.long)
    roles[:, : min(8, length)] = 1
    roles[:, -min(8, length) :] = 1
    roles[:, 0] = 0
    return Encoded(ids, mask, roles, [[""] * length] * batch, [["t"] * length] * batch, torch.arange(batch))


def eager_bytes(base, batch: int, length: int) -> int:
    """Bytes of the maps eager + output_attentions keeps: layers x [B, H, T, T] in the model's dtype."""
    cfg = base.model.config
    itemsize = torch.finfo(next(base.model.parameters()).dtype).bits // 8
    return cfg.num_hidden_layers * batch * cfg.num_attention_heads * length * length * itemsize


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_modes(base, enc, device: torch.device) -> dict[str, Callable[[], Any]]:
    """The three modes on one batch, each returning what its user gets (None, the reducers, the maps)."""
    from anchorlens.analyses import default_reducers
    from anchorlens.capture.collect import stream_statistics

    def sdpa():
        base.model.set_attn_implementation("sdpa")
        with torch.no_grad():
            base.forward(enc, logits_to_keep=1)

    def capture():
        reducers = default_reducers()
        stream_statistics(base, [enc], reducers)
        return reducers

    def eager():
        base.model.set_attn_implementation("eager")
        with torch.no_grad():
            out = base.forward(enc, logits_to_keep=1, output_attentions=True)
        base.model.set_attn_implementation("sdpa")
        return out.attentions

    return {"sdpa": sdpa, "capture": capture, "eager": eager}


def measure(base, batch: int, length: int, device: torch.device, repeats: int, eager_max: float) -> dict:
    """Median seconds and peak memory (bytes above the model; CUDA only) of each mode at one grid point."""
    enc = batch_of(base, batch, length)
    fns = run_modes(base, enc, device)
    modes = [m for m in MODES if m != "eager" or eager_bytes(base, batch, length) <= eager_max * 2**30]
    times: dict[str, list[float]] = {m: [] for m in modes}
    peak: dict[str, float] = {}
    for m in modes:  # warm-up: kernels, allocator, installed attention functions
        fns[m]()
    for turn in range(repeats):
        for m in rotated(modes, turn):
            _sync(device)
            if device.type == "cuda":
                torch.cuda.empty_cache()
                before = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
            t = time.perf_counter()
            result = fns[m]()
            _sync(device)
            times[m].append(time.perf_counter() - t)
            if device.type == "cuda":
                peak[m] = max(peak.get(m, 0.0), float(torch.cuda.max_memory_allocated(device) - before))
            del result
    return {
        "batch": batch,
        "length": length,
        "seconds": {m: statistics.median(v) for m, v in times.items()},
        "peak_bytes": peak,
        "eager_skipped_gib": None if "eager" in modes else eager_bytes(base, batch, length) / 2**30,
    }


def exactness(name: str, smoke: bool, batch: int, length: int, device: torch.device) -> float:
    """Largest |anchorlens - eager| first-token mass (per example, layer, head) of ``name`` in float32."""
    base = build_base(name, smoke, torch.float32, device)
    enc = batch_of(base, batch, length)
    fns = run_modes(base, enc, device)
    reducers = fns["capture"]()
    cfg = base.model.config
    mine = masses_from_frame(reducers[1].frame(), cfg.num_hidden_layers, cfg.num_attention_heads)
    maps = [a.float().cpu() for a in fns["eager"]()]
    eager = first_token_from_maps(maps, enc.attention_mask)
    del base
    return float(max(np.abs(mine[i] - eager[i]).max() for i in range(batch)))


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def table(rows: Sequence[dict], device: str) -> str:
    """The printed table: per model and grid point, ratios to sdpa and peak memory per mode."""
    lines = [
        f"device: {device}",
        f"{'model':<14} {'B':>3} {'T':>6}  {'sdpa ms':>9}  {'capture/sdpa':>12}  {'eager/sdpa':>10}  "
        f"{'peak MiB sdpa / capture / eager':>33}",
    ]
    for r in rows:
        s = r["seconds"]
        eager = f"{s['eager'] / s['sdpa']:>10.2f}" if "eager" in s else f"{'skipped':>10}"
        mib = [f"{r['peak_bytes'][m] / 2**20:,.0f}" if m in r["peak_bytes"] else "n/a" for m in MODES]
        if r["eager_skipped_gib"] is not None:
            mib[2] = f"(>{r['eager_skipped_gib']:,.0f} GiB)"
        lines.append(
            f"{r['model']:<14} {r['batch']:>3} {r['length']:>6}  {s['sdpa'] * 1e3:>9.1f}  "
            f"{s['capture'] / s['sdpa']:>12.2f}  {eager}  {' / '.join(mib):>33}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the grid, print the table and the exactness lines; returns everything measured."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated: {', '.join(MODELS)}")
    ap.add_argument("--batches", default="1,4,8", help="batch sizes")
    ap.add_argument("--lengths", default="512,1024,2048,4096,8192", help="input lengths (tokens)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved rounds per grid point")
    ap.add_argument("--eager-max-gib", type=float, default=40.0, help="skip eager where its maps exceed this")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, 1 repeat, runs on CPU (the tests' mode)")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    opts = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if opts.smoke:
        opts.batches, opts.lengths, opts.repeats = "1,2", "24", 1
    elif device.type != "cuda":
        raise SystemExit("bench_gpu: no CUDA device here; run it on a GPU machine, or pass --smoke (tiny shapes)")
    dtype = torch.bfloat16
    names = [m.strip() for m in opts.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        raise SystemExit(f"bench_gpu: unknown model(s) {unknown}; choose from {', '.join(MODELS)}")
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rows, exact = [], {}
    for name in names:
        base = build_base(name, opts.smoke, dtype, device)
        for b in _ints(opts.batches):
            for t in _ints(opts.lengths):
                rows.append({"model": name, **measure(base, b, t, device, opts.repeats, opts.eager_max_gib)})
        del base
        if device.type == "cuda":
            torch.cuda.empty_cache()
        b, t = min(_ints(opts.batches)), min(_ints(opts.lengths))
        exact[name] = {"batch": b, "length": t, "max_abs_diff": exactness(name, opts.smoke, b, t, device)}
    print(table(rows, label + (" (smoke: tiny shapes)" if opts.smoke else "") + f", {dtype}".replace("torch.", "")))
    for name, e in exact.items():
        print(f"exactness {name} (float32, B={e['batch']}, T={e['length']}): max |capture - eager| first-token "
              f"mass = {e['max_abs_diff']:.2e}")  # fmt: skip
    result = {"device": label, "smoke": opts.smoke, "rows": rows, "exactness": exact}
    if opts.json:
        opts.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
