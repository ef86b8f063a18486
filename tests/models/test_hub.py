"""Hub ids resolved offline from an HF cache layout built in a temp dir (no network anywhere)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from huggingface_hub import constants
from huggingface_hub.utils import filter_repo_objects

from anchorlens.errors import UnknownNameError, UsageError
from anchorlens.models.hub import ALLOW_PATTERNS, IGNORE_PATTERNS, parse_hub_id, resolve_hub_dir
from anchorlens.models.loading import load_base
from anchorlens.models.tiny import build_tiny

REPO = Path(__file__).resolve().parents[2]
MAIN = "a" * 40
TAGGED = "0123456789abcdef0123456789abcdef01234567"
IDS = torch.tensor([[5, 6, 7, 8, 9]])


def _save_tiny(folder: Path, seed: int) -> None:
    model: Any
    tok: Any
    model, tok = build_tiny("tiny-llama", seed=seed)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    """``models--acme--tiny-llama``: main -> seed-0 weights; tag v0.1 -> seed-1 weights (another commit)."""
    cache = tmp_path_factory.mktemp("hf-hub")
    repo = cache / "models--acme--tiny-llama"
    _save_tiny(repo / "snapshots" / MAIN, seed=0)
    _save_tiny(repo / "snapshots" / TAGGED, seed=1)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN)
    (repo / "refs" / "v0.1").write_text(TAGGED)
    return cache


@pytest.fixture
def offline(monkeypatch, hub_cache) -> Path:
    """HF_HUB_OFFLINE=1 and HF_HUB_CACHE=the temp cache, as huggingface_hub sees them (its constants)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    return hub_cache


def test_hub_id_loads_the_main_snapshot_offline(offline):
    base = load_base("acme/tiny-llama")
    ref, _ = build_tiny("tiny-llama", seed=0)
    torch.testing.assert_close(_logits(base.model), _logits(ref), rtol=0, atol=0)
    assert base.provenance() == {
        "kind": "hub",
        "spec": "acme/tiny-llama",
        "repo_id": "acme/tiny-llama",
        "revision": "main",
        "commit": MAIN,
        "path": str(offline / "models--acme--tiny-llama" / "snapshots" / MAIN),
    }


@pytest.mark.parametrize("revision", ["v0.1", TAGGED, TAGGED[:10]])
def test_revision_pins_the_commit(offline, revision):
    base = load_base(f"acme/tiny-llama@{revision}")
    ref, _ = build_tiny("tiny-llama", seed=1)
    torch.testing.assert_close(_logits(base.model), _logits(ref), rtol=0, atol=0)
    facts = base.provenance()
    assert facts["commit"] == TAGGED and facts["revision"] == revision and facts["repo_id"] == "acme/tiny-llama"
    assert base.pinned_spec() == f"acme/tiny-llama@{TAGGED}"
    assert base.fingerprint()["hash"] != load_base("acme/tiny-llama").fingerprint()["hash"]  # other weights


def test_missing_id_offline_is_one_line(offline):
    with pytest.raises(UsageError) as err:
        load_base("acme/absent-model")
    assert str(err.value) == (
        f"acme/absent-model is not in the HuggingFace cache at {offline} and HF_HUB_OFFLINE=1; "
        "fetch it with `hf download acme/absent-model` (or unset HF_HUB_OFFLINE)"
    )
    with pytest.raises(UsageError, match=r"acme/tiny-llama@v9 is not in the HuggingFace cache .* --revision v9"):
        load_base("acme/tiny-llama@v9")


def _config_only_snapshot(cache: Path, name: str, commit: str) -> Path:
    snap = cache / f"models--acme--{name}" / "snapshots" / commit
    snap.mkdir(parents=True)
    (cache / f"models--acme--{name}" / "refs").mkdir()
    (cache / f"models--acme--{name}" / "refs" / "main").write_text(commit)
    model: Any = build_tiny("tiny-llama")[0]
    (snap / "config.json").write_text(model.config.to_json_string())
    return snap


def test_bin_only_snapshot_is_refused(offline, tmp_path):
    snap = _config_only_snapshot(offline, "pickled", "b" * 40)
    (snap / "pytorch_model.bin").write_bytes(b"never unpickled")
    with pytest.raises(UsageError, match=r"acme/pickled has no \.safetensors weights \(it holds pytorch_model\.bin\)"):
        load_base("acme/pickled")


def _custom_snapshot(cache: Path, name: str, config: dict) -> Path:
    snap = cache / f"models--acme--{name}" / "snapshots" / ("c" * 40)
    _save_tiny(snap, seed=0)
    (snap / "config.json").write_text(json.dumps(config))
    (cache / f"models--acme--{name}" / "refs").mkdir()
    (cache / f"models--acme--{name}" / "refs" / "main").write_text("c" * 40)
    return snap


def test_remote_code_is_refused_in_one_line(offline):
    snap = _custom_snapshot(offline, "custom", {"model_type": "acme-net", "auto_map": {"AutoConfig": "x.AcmeConfig"}})
    with pytest.raises(
        UsageError, match=r"^anchorlens never runs remote code; acme/custom has model_type 'acme-net' \(its"
    ):
        load_base("acme/custom")
    with pytest.raises(UsageError, match="^anchorlens never runs remote code"):
        load_base(str(snap))  # the same refusal for a local directory


def test_known_model_type_with_auto_map_loads_natively(offline):
    """A repo that ships code but whose architecture transformers implements (Phi-3 style) loads without it."""
    model, _ = build_tiny("tiny-llama", seed=0)
    config = {**model.config.to_dict(), "auto_map": {"AutoModelForCausalLM": "modeling_x.X"}}
    _custom_snapshot(offline, "shipped-code", config)
    base = load_base("acme/shipped-code")
    torch.testing.assert_close(_logits(base.model), _logits(model), rtol=0, atol=0)


def test_existing_local_directory_wins_over_hub_id(offline, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _save_tiny(tmp_path / "acme" / "tiny-llama", seed=1)
    base = load_base("acme/tiny-llama")
    assert base.provenance()["kind"] == "local" and base.provenance()["commit"] is None
    ref, _ = build_tiny("tiny-llama", seed=1)
    torch.testing.assert_close(_logits(base.model), _logits(ref), rtol=0, atol=0)


def test_snapshot_directory_given_as_path_names_its_commit(offline):
    base = load_base(str(offline / "models--acme--tiny-llama" / "snapshots" / TAGGED))
    facts = base.provenance()
    assert (facts["kind"], facts["repo_id"], facts["commit"]) == ("local", "acme/tiny-llama", TAGGED)


def test_adapter_hub_id_resolves(offline):
    from safetensors.torch import save_file

    snap = offline / "models--acme--adapter" / "snapshots" / ("d" * 40)
    snap.mkdir(parents=True)
    (snap / "adapter_config.json").write_text(json.dumps({"peft_type": "PROMPT_TUNING"}))
    save_file({"prompt_embeddings": torch.zeros(2, 64)}, str(snap / "adapter_model.safetensors"))
    (offline / "models--acme--adapter" / "refs").mkdir()
    (offline / "models--acme--adapter" / "refs" / "main").write_text("d" * 40)
    path, facts = resolve_hub_dir("acme/adapter", kind="adapter")
    assert path == snap and facts["commit"] == "d" * 40 and facts["kind"] == "hub"
    with pytest.raises(UsageError, match="acme/tiny-llama is not a PEFT adapter repository"):
        resolve_hub_dir("acme/tiny-llama", kind="adapter")


def test_spec_shapes():
    assert parse_hub_id("Qwen/Qwen2.5-1.5B@refs/pr/3").revision == "refs/pr/3"
    assert parse_hub_id("./acme/x") is None and parse_hub_id("a/b/c") is None and parse_hub_id("smollm2-135m") is None
    with pytest.raises(UsageError, match="names no revision"):
        parse_hub_id("acme/x@")
    with pytest.raises(UnknownNameError, match="unknown base"):
        load_base("./no/such/dir")


def test_download_filter_takes_only_safetensors_configs_and_tokenizers():
    files = [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
        "spiece.model",
        "vocab.txt",
        "merges.txt",
        "vocab.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "generation_config.json",
        "pytorch_model.bin",
        "model.pt",
        "modeling_acme.py",
        "tokenization_acme.py",
        "onnx/model.onnx",
        "onnx/config.json",
        "original/consolidated.00.pth",
        "model.gguf",
        "flax_model.msgpack",
    ]
    kept = set(filter_repo_objects(files, allow_patterns=ALLOW_PATTERNS, ignore_patterns=IGNORE_PATTERNS))
    assert kept == set(files[:13])


@pytest.mark.slow  # a fresh interpreter imports torch and transformers (seconds; more on a loaded machine)
def test_offline_environment_is_honoured_in_a_fresh_process(hub_cache, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache), "PYTHONPATH": str(REPO)}
    code = (
        "from anchorlens.models.loading import load_base; import json; "
        "print(json.dumps(load_base('acme/tiny-llama@v0.1').provenance()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["commit"] == TAGGED


def test_too_large_hub_base_is_refused_from_its_config_alone(offline, monkeypatch):
    _config_only_snapshot(offline, "config-only", "e" * 40)  # weights not (yet) downloaded
    monkeypatch.setattr("anchorlens.models.loading.check_device", lambda d: d)  # a GPU this machine may lack
    asked = []

    def no_room(device):
        asked.append(device)
        return 1000

    with pytest.raises(
        UsageError, match=r"^acme/config-only needs about .* MiB in float32, cuda:1 has 0.0 MiB available; use"
    ):
        load_base("acme/config-only", device="cuda:1", available_memory=no_room)
    assert asked == ["cuda:1"]


def test_every_command_takes_a_hub_id_and_its_manifest_names_the_commit(offline, tmp_path):
    """capture, compare, train, evaluate and inspect with ``--base acme/tiny-llama@v0.1`` from the offline cache."""
    from typer.testing import CliRunner

    import anchorlens as al
    from anchorlens.cli import app

    base = "acme/tiny-llama@v0.1"
    runner = CliRunner()
    runs = {
        "capture": ["capture", "--ckpt", "instance", "--n", "2", "--no-progress"],
        "compare": ["compare", "--ckpt", "base", "--ckpt", "instance", "--n", "2", "--no-figures"],
        "train": ["train", "--method", "capsule", "--steps", "1", "--n", "12", "--eval-every", "1"],
        "evaluate": ["evaluate", "--ckpt", "capsule", "--n", "2"],
    }
    for name, args in runs.items():
        out = tmp_path / name
        result = runner.invoke(app, [*args, "--base", base, "--out", str(out)])
        assert result.exit_code == 0, (name, result.output)
        manifest = json.loads((out / "manifest.json").read_text())
        assert json.dumps(manifest).count(TAGGED) >= 1, (name, manifest)  # the resolved commit is recorded
    saved = json.loads((tmp_path / "train" / "final" / "anchorlens.json").read_text())
    assert saved["base"]["spec"] == f"acme/tiny-llama@{TAGGED}"  # the checkpoint pins the exact weights
    view = al.inspect("instance", "A cat sat on the mat.", base=base)
    assert view.maps[view.maps.default_stack].probs.shape[0] == 4
