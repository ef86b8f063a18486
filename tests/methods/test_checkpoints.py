"""Checkpoints: exact round trip, base checks, no overwrite, json + safetensors only."""
from __future__ import annotations

import json

import pytest
import torch

from anchorlens.errors import UsageError
from anchorlens.methods import Capsule, DeepPrompt, GuidedModel, InstanceToken, SoftPrompt, load_guided
from anchorlens.methods.checkpoints import load_checkpoint, save_checkpoint
from tests.methods.helpers import rte_batch


def _trained(base) -> GuidedModel:
    """A guided model with nonzero (as if trained) parameters."""
    guided = GuidedModel(base, [SoftPrompt(3), Capsule(fusion="project", rank=2, position="last"), DeepPrompt(2)], seed=5)
    with torch.no_grad():
        for p in guided.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.1)
    return guided


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-t5"])
def test_round_trip_gives_identical_logits(tiny_base, tmp_path, name):
    base = tiny_base(name)
    guided = _trained(base)
    path = save_checkpoint(guided, tmp_path / "ckpt", task="rte", template="rte", training={"steps": 3, "lr": 0.1})
    assert sorted(p.name for p in path.iterdir()) == ["anchorlens.json", "guidance.safetensors"]
    meta = json.loads((path / "anchorlens.json").read_text())
    assert meta["format_version"] == 1 and meta["task"] == "rte" and meta["training"]["steps"] == 3
    assert meta["base"]["fingerprint"] == base.fingerprint()
    assert [m["kind"] for m in meta["methods"]] == ["soft_prompt", "capsule", "deep_prompt"]
    loaded = load_checkpoint(path, base)
    assert loaded.config()["methods"] == guided.config()["methods"]
    batch = rte_batch(base, "left")
    with torch.no_grad():
        a, b = guided.forward(batch).logits, loaded.forward(batch).logits
    assert torch.equal(a, b)
    for k, v in guided.guidance_state_dict().items():
        assert torch.equal(v, loaded.guidance_state_dict()[k])


def test_checkpoint_loads_its_own_base_and_composes_with_instance(tiny_base, tmp_path):
    base = tiny_base("tiny-llama")
    path = save_checkpoint(_trained(base), tmp_path / "ckpt")
    alone = load_checkpoint(path)  # base from the checkpoint's spec
    assert alone.base.spec == "tiny-llama"
    combo = load_guided(f"{path}+instance", base=base)
    assert [g.kind for g in combo.guidances] == ["soft_prompt", "capsule", "deep_prompt", "instance"]
    via_spec = load_guided(str(path))  # base_spec defaults to the checkpoint's own
    assert via_spec.base.spec == "tiny-llama"
    with torch.no_grad():
        out = combo.forward(rte_batch(base, "right"))
    assert not torch.isnan(out.logits).any()


def test_mismatched_base_is_refused(tiny_base, tmp_path):
    path = save_checkpoint(GuidedModel(tiny_base("tiny-llama"), [Capsule()]), tmp_path / "ckpt")
    with pytest.raises(UsageError) as err:
        load_checkpoint(path, tiny_base("tiny-t5"))
    msg = str(err.value)
    assert "\n" not in msg and "tiny-llama" in msg and "tiny-t5" in msg


def test_refuses_to_overwrite(tiny_base, tmp_path):
    guided = GuidedModel(tiny_base("tiny-llama"), [InstanceToken()])
    path = save_checkpoint(guided, tmp_path / "ckpt")
    with pytest.raises(UsageError, match="already exists"):
        save_checkpoint(guided, path)
    save_checkpoint(GuidedModel(tiny_base("tiny-llama"), [Capsule()]), path, overwrite=True)
    assert [g.kind for g in load_checkpoint(path, tiny_base("tiny-llama")).guidances] == ["capsule"]
    other = tmp_path / "notes"
    other.mkdir()
    (other / "x.txt").write_text("keep me")
    with pytest.raises(UsageError, match="not an anchorlens checkpoint"):
        save_checkpoint(guided, other, overwrite=True)


def test_no_pickle_in_checkpoint(tiny_base, tmp_path):
    path = save_checkpoint(_trained(tiny_base("tiny-llama")), tmp_path / "ckpt")
    data = (path / "guidance.safetensors").read_bytes()
    assert not data.startswith(b"\x80")  # a pickle stream starts with the PROTO opcode
    json.loads((path / "anchorlens.json").read_text())
