"""Checkpoints: exact round trip, base checks, no overwrite, json + safetensors only."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from anchorlens.errors import CheckpointError, UsageError
from anchorlens.methods import Capsule, DeepPrompt, GuidedModel, InstanceToken, SoftPrompt, load_guided
from anchorlens.methods.checkpoints import load_checkpoint, save_checkpoint
from tests.methods.helpers import rte_batch


def _assert_same_model(guided, loaded, batch) -> None:
    """Identical logits on ``batch`` and identical guidance tensors."""
    with torch.no_grad():
        a, b = guided.forward(batch).logits, loaded.forward(batch).logits
    assert torch.equal(a, b)
    for k, v in guided.guidance_state_dict().items():
        assert torch.equal(v, loaded.guidance_state_dict()[k])


def _trained(base) -> GuidedModel:
    """A guided model with nonzero (as if trained) parameters."""
    return _perturbed(
        GuidedModel(base, [SoftPrompt(3), Capsule(fusion="project", rank=2, position="last"), DeepPrompt(2)], seed=5)
    )


def _perturbed(guided: GuidedModel) -> GuidedModel:
    """``guided`` with every guidance parameter moved off its init (as if trained)."""
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
    _assert_same_model(guided, loaded, rte_batch(base, "left"))


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


# ---------------------------------------------------------------------- schema of anchorlens.json
def _edit(path, change) -> None:
    """Apply ``change(meta)`` to the checkpoint's anchorlens.json."""
    file = path / "anchorlens.json"
    meta = json.loads(file.read_text())
    change(meta)
    file.write_text(json.dumps(meta))


def _set(*keys_and_value):
    *keys, value = keys_and_value

    def change(meta):
        target = meta
        for k in keys[:-1]:
            target = target[k]
        target[keys[-1]] = value

    return change


HOSTILE_META = [  # (edit of anchorlens.json, words the one-line error must contain)
    (_set("format_version", True), "format_version must be an integer"),
    (_set("format_version", -7), "format_version must be a positive integer"),
    (_set("format_version", 0), "positive integer"),
    (_set("format_version", "1"), "format_version must be an integer"),
    (_set("format_version", 2), "newer than this anchorlens reads"),
    (_set("methods", {"kind": "capsule"}), "field methods must be a list"),
    (_set("methods", [["capsule"]]), "methods[0]: a method must be an object"),
    (_set("methods", 0, "kind", 5), "kind must be a string"),
    (_set("methods", 0, "kind", "lora"), "unknown method kind 'lora' (this anchorlens knows soft_prompt"),
    (_set("methods", 0, "options", None), "options of capsule must be an object"),
    (_set("methods", 0, "options", "rank", "eight"), "option rank of method capsule must be an integer"),
    (_set("methods", 0, "options", "rank", True), "option rank of method capsule must be an integer"),
    (_set("methods", 0, "options", "fusion", 3), "option fusion of method capsule must be one of"),
    (_set("methods", 0, "options", "fusion", "mix"), "unknown capsule fusion 'mix'"),
    (
        _set("methods", 0, "options", "glow", 1),
        "unknown option 'glow' for method capsule (this anchorlens knows fusion, rank",
    ),
    (_set("methods", 0, "extra", 1), "unknown key 'extra'"),
    (_set("base", ["tiny-llama"]), "field base must be an object"),
    (_set("base", "fingerprint", "hash", 12), "base.fingerprint.hash must be a string"),
    (_set("base", "color", "red"), "unknown field base.color"),
    (_set("seed", "x"), "field seed must be an integer"),
    (_set("seed", True), "field seed must be an integer"),
    (_set("lr", 0.1), "unknown field 'lr' (this anchorlens knows format_version"),
    (lambda meta: meta.pop("methods"), "field methods is missing"),
    (_set("methods", 0, "options", "position", [1]), "option position of method capsule must be a position"),
]


@pytest.mark.parametrize("change,needle", HOSTILE_META, ids=[n for _, n in HOSTILE_META])
def test_hostile_meta_is_refused_naming_file_and_field(tiny_base, tmp_path, change, needle):
    base = tiny_base("tiny-llama")
    path = save_checkpoint(GuidedModel(base, [Capsule()]), tmp_path / "ckpt")
    _edit(path, change)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path, base)
    msg = str(err.value)
    assert needle in msg and "anchorlens.json" in msg and "\n" not in msg, msg


def test_a_checkpoint_asking_for_1e8_prompt_vectors_is_refused_before_allocating(tiny_base, tmp_path):
    base = tiny_base("tiny-llama")
    path = save_checkpoint(GuidedModel(base, [SoftPrompt(3)]), tmp_path / "ckpt")
    _edit(path, _set("methods", 0, "options", "n", 10**8))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path, base)
    assert (
        "methods[0]" in str(err.value) and "would allocate 23.8 GiB" in str(err.value) and "n <= 512" in str(err.value)
    )


def test_tensor_sizes_are_checked_against_the_options_before_allocating(tiny_base, tmp_path):
    base = tiny_base("tiny-llama")
    path = save_checkpoint(GuidedModel(base, [SoftPrompt(3)]), tmp_path / "ckpt")
    _edit(path, _set("methods", 0, "options", "n", 500))  # within bounds, but the file holds 3 rows
    with pytest.raises(CheckpointError, match=r"methods\[0\] \(prompt:n=500\) hold 192 values; its options need 32000"):
        load_checkpoint(path, base)


@pytest.mark.parametrize(
    "bad,needle",
    [
        (lambda t: t.fill_(float("nan")), "NaN/Inf"),
        (lambda t: t.index_fill_(0, torch.tensor([1]), float("inf")), "NaN/Inf"),
        (lambda t: t.to(torch.int64), "dtype int64"),
        (lambda t: t > 0, "dtype bool"),
    ],
)
def test_guidance_tensors_must_be_finite_floats(tiny_base, tmp_path, bad, needle):
    base = tiny_base("tiny-llama")
    path = save_checkpoint(_trained(base), tmp_path / "ckpt")
    file = path / "guidance.safetensors"
    tensors = load_file(str(file))
    tensors["0.prompt"] = bad(tensors["0.prompt"].clone())
    save_file(tensors, str(file))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path, base)
    assert "'0.prompt'" in str(err.value) and needle in str(err.value)


def test_old_checkpoints_without_newer_options_still_load(tiny_base, tmp_path):
    base = tiny_base("tiny-llama")
    guided = GuidedModel(base, [SoftPrompt(3, position="last"), Capsule(fusion="prepend"), InstanceToken(k=2)])
    path = save_checkpoint(guided, tmp_path / "ckpt")
    _edit(path, lambda meta: meta["methods"][1]["options"].pop("mean"))  # written before the mean option existed
    loaded = load_checkpoint(path, base)
    assert [g.kind for g in loaded.guidances] == ["soft_prompt", "capsule", "instance"]
    assert loaded.guidances[1].mean == "capsule+input" and str(loaded.guidances[0].position) == "last"


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-t5"])
def test_capsule_count_round_trips_with_identical_logits(tiny_base, tmp_path, name):
    base = tiny_base(name)
    L, d = base.adapter.num_layers(base.model, "decoder"), base.hidden_size
    guided = _perturbed(
        GuidedModel(base, [Capsule(n=2, position="last"), Capsule(n=3, fusion="prepend", init="random")], seed=4)
    )
    path = save_checkpoint(guided, tmp_path / "ckpt")
    meta = json.loads((path / "anchorlens.json").read_text())
    assert [m["options"]["n"] for m in meta["methods"]] == [2, 3]
    assert load_file(str(path / "guidance.safetensors"))["0.p.decoder"].shape == (L, 2, d)
    loaded = load_checkpoint(path, base)
    assert [g.describe() for g in loaded.guidances] == [
        "capsule:pos=last,n=2",
        "capsule:fusion=prepend,init=random,n=3",
    ]
    _assert_same_model(guided, loaded, rte_batch(base, "right"))


def test_one_capsule_keeps_the_layout_of_checkpoints_saved_before_n(tiny_base, tmp_path):
    base = tiny_base("tiny-llama")
    guided = _perturbed(GuidedModel(base, [Capsule(fusion="project", rank=2)], seed=4))
    path = save_checkpoint(guided, tmp_path / "ckpt")
    assert load_file(str(path / "guidance.safetensors"))["0.p.decoder"].shape == (base.num_layers, base.hidden_size)
    _edit(path, lambda meta: meta["methods"][0]["options"].pop("n"))  # written before the n option existed
    loaded = load_checkpoint(path, base)
    assert loaded.guidances[0].n == 1
    batch = rte_batch(base, "left")
    with torch.no_grad():
        assert torch.equal(guided.forward(batch).logits, loaded.forward(batch).logits)


def test_a_capsule_count_that_does_not_match_the_tensors_is_refused(tiny_base, tmp_path):
    base = tiny_base("tiny-llama")
    path = save_checkpoint(GuidedModel(base, [Capsule()]), tmp_path / "ckpt")
    _edit(path, _set("methods", 0, "options", "n", 2))  # the file holds one vector per layer
    with pytest.raises(CheckpointError, match=r"methods\[0\] \(capsule:n=2\) hold 256 values; its options need 512"):
        load_checkpoint(path, base)


# ---------------------------------------------------------------------- another base (issue 9)
def test_a_checkpoint_of_another_model_type_is_refused_even_at_equal_width(tiny_base, tmp_path):
    llama, gpt2 = tiny_base("tiny-llama"), tiny_base("tiny-gpt2")
    assert (llama.hidden_size, llama.num_layers) == (gpt2.hidden_size, gpt2.num_layers)
    path = save_checkpoint(_trained(llama), tmp_path / "ckpt")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path, gpt2)
    msg = str(err.value)
    assert "\n" not in msg and "'llama' vs 'gpt2'" in msg and "allow_other_base" in msg
    with pytest.raises(CheckpointError):
        load_guided(f"{path}+instance", base=gpt2)
    with pytest.warns(UserWarning, match="trained on 'tiny-llama', loaded on 'tiny-gpt2'"):
        loaded = load_guided(str(path), base=gpt2, allow_other_base=True)
    [facts] = loaded.meta["other_base"]
    assert facts["recorded"]["model_type"] == "llama" and facts["base"]["model_type"] == "gpt2"
    with torch.no_grad():
        assert torch.isfinite(loaded.forward(rte_batch(gpt2, "right")).logits).all()
