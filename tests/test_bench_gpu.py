"""benchmarks/bench_gpu.py runs its CPU smoke mode: both model layouts, every mode, exact against eager."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu.py"


def _bench():
    sys.path.insert(0, str(BENCH.parent))
    try:
        spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH.parent))


def test_smoke_mode_runs_every_model_and_mode_and_matches_eager(tmp_path, capsys):
    bench = _bench()
    result = bench.main(["--smoke", "--json", str(tmp_path / "gpu.json")])
    assert result["smoke"] and (tmp_path / "gpu.json").is_file()
    assert {r["model"] for r in result["rows"]} == {"llama-3.2-1b", "qwen2.5-1.5b"}
    for row in result["rows"]:
        assert set(row["seconds"]) == {"sdpa", "capture", "eager"} and min(row["seconds"].values()) > 0
    for exact in result["exactness"].values():
        assert exact["max_abs_diff"] < 1e-5  # float32: anchorlens' first-token mass equals eager's maps
    printed = capsys.readouterr().out
    assert "capture/sdpa" in printed and printed.count("exactness") == 2


def test_real_shapes_are_the_published_configs_and_eager_is_skipped_when_too_large():
    bench = _bench()
    llama, qwen = bench.llama_3_2_1b(False), bench.qwen2_5_1_5b(False)
    assert (llama.num_hidden_layers, llama.hidden_size, llama.num_attention_heads, llama.num_key_value_heads) == (
        16, 2048, 32, 8,
    )  # fmt: skip
    assert (qwen.num_hidden_layers, qwen.hidden_size, qwen.num_attention_heads, qwen.num_key_value_heads) == (
        28, 1536, 12, 2,
    )  # fmt: skip

    class _Base:  # eager_bytes reads only the config and the weights' dtype
        def __init__(self, cfg):
            import torch

            self.model = type(
                "M", (), {"config": cfg, "parameters": lambda _: iter([torch.zeros(1, dtype=torch.bfloat16)])}
            )()

    # 16 layers x 32 heads x 8192^2 x 2 bytes = 64 GiB of maps for one 8k input: over the default 40 GiB cap
    assert bench.eager_bytes(_Base(llama), 1, 8192) == 16 * 32 * 8192 * 8192 * 2


def test_without_a_gpu_it_refuses_unless_smoke(monkeypatch):
    import torch

    bench = _bench()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device here"):
        bench.main([])
