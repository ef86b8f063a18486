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
    assert loaded.adapter.family == "llama" and loaded.fingerprint() == ref.fingerprint()
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
