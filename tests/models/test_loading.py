"""load_base: local HF directories (safetensors only), device_map, refusals, the embedded model's cache."""

from __future__ import annotations

import pytest
import torch

from anchorlens.errors import UsageError
from anchorlens.models.loading import load_base


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, tiny_base):
    base = tiny_base("tiny-qwen2")
    path = tmp_path_factory.mktemp("hf") / "tiny-qwen2"
    base.model.save_pretrained(path, safe_serialization=True)
    base.tokenizer.save_pretrained(path)
    return path, base


@pytest.mark.parametrize("device", [None, "auto"])
def test_local_directory_loads_the_same_weights(hf_dir, device):
    path, ref = hf_dir
    loaded = load_base(str(path), device=device)
    assert loaded.adapter.family == "qwen2" and loaded.fingerprint() == ref.fingerprint()
    assert loaded.model.config._attn_implementation == "sdpa"  # capture installs its function lazily
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(input_ids=ids).logits, ref.model(input_ids=ids).logits)
    assert not any(p.requires_grad for p in loaded.model.parameters())


def test_pickle_only_directory_is_refused(tmp_path, hf_dir):
    path, _ = hf_dir
    pickled = tmp_path / "bin-only"
    pickled.mkdir()
    (pickled / "config.json").write_text((path / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(UsageError, match="never unpickles"):
        load_base(str(pickled))


def test_not_a_model_directory(tmp_path):
    with pytest.raises(UsageError, match="no config.json"):
        load_base(str(tmp_path))
    with pytest.raises(UsageError, match="unknown base"):
        load_base("definitely-not-a-base")


def test_embedded_model_loads_from_its_cache(smollm2):
    from anchorlens.models.embedded import cached_dir

    assert (cached_dir() / "anchorlens-cache.json").is_file()
    assert smollm2.fingerprint()["num_layers"] == 30 and smollm2.hidden_size == 576 and smollm2.num_heads == 9
    assert smollm2.num_parameters() == 134_515_008


# ---------------------------------------------------------------- fingerprint and provenance
def _base_from(model, tok, spec="tiny-llama"):
    from anchorlens.models.adapters import adapter_for
    from anchorlens.models.base import Base

    return Base(spec=spec, model=model, tokenizer=tok, adapter=adapter_for(model))


def test_fingerprint_keeps_its_keys_and_adds_a_weights_digest(tiny_base):
    import hashlib

    base = tiny_base("tiny-llama")
    fp = base.fingerprint()
    assert set(fp) == {"model_type", "num_layers", "hidden_size", "num_heads", "vocab_size", "weights", "hash"}
    inner = base.model.model
    h = hashlib.sha256()  # by hand: embedding, first and last block's first parameter, 4,096 values each
    for t in (
        inner.embed_tokens.weight,
        inner.layers[0].self_attn.q_proj.weight,
        inner.layers[-1].self_attn.q_proj.weight,
    ):
        h.update(t.detach().flatten()[:4096].to(torch.bfloat16).float().numpy().tobytes())
    assert fp["weights"] == h.hexdigest()[:16]
    fp["hash"] = "mutated"
    assert base.fingerprint()["hash"] != "mutated"  # a copy of the cached facts


def test_same_shapes_other_weights_or_type_give_another_hash(tiny_base):
    from anchorlens.models.tiny import build_tiny

    ref = tiny_base("tiny-llama").fingerprint()
    assert tiny_base("tiny-llama", "bfloat16").fingerprint() == ref  # dtype does not change the identity
    other = _base_from(*build_tiny("tiny-llama", seed=1)).fingerprint()
    assert {k: v for k, v in other.items() if k not in ("weights", "hash")} == {
        k: v for k, v in ref.items() if k not in ("weights", "hash")
    }
    assert other["hash"] != ref["hash"]
    model, tok = build_tiny("tiny-llama")
    with torch.no_grad():
        model.model.embed_tokens.weight[3, 5] += 0.25
    assert _base_from(model, tok).fingerprint()["hash"] != ref["hash"]
    for name in ("tiny-qwen2", "tiny-gpt2"):  # equal width (64), other model_type
        assert tiny_base(name).fingerprint()["hash"] != ref["hash"]


def test_provenance_of_tiny_and_local_bases(hf_dir, tiny_base):
    path, _ = hf_dir
    assert tiny_base("tiny-llama").provenance() == {
        "kind": "tiny",
        "spec": "tiny-llama",
        "repo_id": None,
        "revision": None,
        "commit": None,
        "path": None,
    }
    local = load_base(str(path)).provenance()
    assert local["kind"] == "local" and local["path"] == str(path.resolve()) and local["commit"] is None


def test_embedded_provenance_names_its_cache(smollm2):
    from anchorlens.models.embedded import cached_dir

    assert smollm2.provenance()["kind"] == "embedded" and smollm2.provenance()["path"] == str(cached_dir())


# ---------------------------------------------------------------- memory estimate
def test_estimate_counts_every_parameter_and_buffer_once(hf_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    from anchorlens.models.memory import estimate_bytes

    path, ref = hf_dir
    config = AutoConfig.from_pretrained(path)
    tensors = {id(t): t for t in [*ref.model.parameters(), *ref.model.buffers()]}.values()
    floats = sum(t.numel() for t in tensors if t.is_floating_point())
    others = sum(t.numel() * t.element_size() for t in tensors if not t.is_floating_point())
    assert estimate_bytes(config, torch.float32, AutoModelForCausalLM) == 4 * floats + others
    assert estimate_bytes(config, torch.bfloat16, AutoModelForCausalLM) == 2 * floats + others


def test_base_too_large_for_the_device_is_refused_before_loading(hf_dir):
    from anchorlens.models.memory import GIB, HEADROOM, human_size

    path, ref = hf_dir
    asked: list = []

    def tiny_ram(device):
        asked.append(device)
        return 1000

    need = human_size(int(sum(p.numel() for p in ref.model.parameters()) * 4 * HEADROOM))
    with pytest.raises(UsageError) as err:
        load_base(str(path), available_memory=tiny_ram)
    assert asked == [None] and "\n" not in str(err.value)
    assert str(err.value).startswith(f"{path} needs about {need} in float32, the CPU has 0.0 MiB available; ")
    assert str(err.value).endswith("use --dtype bfloat16, --device auto or a smaller base")
    with pytest.raises(
        UsageError, match="in bfloat16, the GPUs and CPU together have 0.0 MiB available; use a smaller base$"
    ):
        load_base(str(path), dtype="bf16", device="auto", available_memory=tiny_ram)
    assert load_base(str(path), available_memory=lambda device: 64 * GIB).num_layers == ref.num_layers


def test_cpu_availability_is_plausible():
    from pathlib import Path

    from anchorlens.models.memory import available_bytes

    total = int(
        next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")).split()[1]
    )
    assert 0 < available_bytes(None) <= total * 1024


# ---------------------------------------------------------------- error classes
def test_attention_outside_the_interface_is_refused_before_loading_and_bad_dtype_is_unknown(tmp_path):
    import json

    from anchorlens.errors import UnknownNameError, UsageError

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bloom"}))
    (tmp_path / "model.safetensors").write_bytes(b"")  # never read: the refusal comes from the config alone
    with pytest.raises(UsageError, match=r"bloom: its attention bypasses transformers' AttentionInterface") as err:
        load_base(str(tmp_path))
    assert "\n" not in str(err.value)
    with pytest.raises(UnknownNameError, match="unknown dtype 'float8'"):
        load_base("tiny-llama", dtype="float8")


def test_damaged_config_is_a_data_error(tmp_path):
    from anchorlens.errors import DataError

    (tmp_path / "config.json").write_text("{ damaged")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(DataError, match=r"config.json of .* is not valid JSON"):
        load_base(str(tmp_path))


def test_sizes_read_as_people_write_them():
    from anchorlens.models.memory import GIB, human_size

    assert (
        human_size(28 * GIB) == "28.0 GiB" and human_size(GIB // 10) == "0.1 GiB" and human_size(3 * 2**20) == "3.0 MiB"
    )


def test_fingerprint_hash_over_an_old_fingerprint_keys_reproduces_its_hash(tiny_base):
    import hashlib
    import json

    from anchorlens.models.base import fingerprint_hash

    fp = tiny_base("tiny-llama").fingerprint()
    old_facts = {k: fp[k] for k in ("model_type", "num_layers", "hidden_size", "num_heads", "vocab_size")}
    old_hash = hashlib.sha1(json.dumps(old_facts, sort_keys=True).encode()).hexdigest()[:12]  # before weights
    assert fingerprint_hash(old_facts) == old_hash and fingerprint_hash(fp) == fp["hash"] != old_hash
