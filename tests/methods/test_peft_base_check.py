"""A PEFT adapter is checked against the base it records, not by the last part of its name.

A tiny Qwen2 and a tiny Llama of one geometry (d=64, 4 layers, 4 heads, 4 key/value heads, one
vocabulary) are saved as ``qwen/final`` and ``llama/final``: only ``model_type`` tells them apart,
and the recorded ``base_model_name_or_path`` of an adapter made on one ends like the other's.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from anchorlens.errors import CheckpointError
from anchorlens.methods import load_guided
from anchorlens.models.loading import load_base

peft = pytest.importorskip("peft")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

FIX = "--allow-other-base"


def _save_base(folder, name: str, **overrides) -> str:
    from anchorlens.models.tiny import build_tiny

    model, tok = build_tiny(name, overrides=overrides or None)
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return str(folder)


def _adapter(base_dir: str, out, kind: str) -> None:
    """A PEFT adapter of ``kind`` (prompt|lora) made on the base saved at ``base_dir`` (PEFT records that path)."""
    from peft import LoraConfig, PromptTuningConfig, get_peft_model

    config = (
        PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3)
        if kind == "prompt"
        else LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    model = get_peft_model(load_base(base_dir).model, config)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    model.save_pretrained(str(out))


def _recorded(adapter) -> str | None:
    return json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]


def _edit(adapter, **changes) -> None:
    file = adapter / "adapter_config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Bases ``qwen/final``, ``llama/final`` (same geometry) and adapters made on the Qwen2 one."""
    root = tmp_path_factory.mktemp("peft-base")
    qwen = _save_base(root / "qwen" / "final", "tiny-qwen2", num_key_value_heads=4)
    llama = _save_base(root / "llama" / "final", "tiny-llama")
    adapters = {}
    for kind in ("prompt", "lora"):
        adapters[kind] = root / f"{kind}-qwen"
        _adapter(qwen, adapters[kind], kind)
    return {"root": root, "qwen": qwen, "llama": llama, **adapters}


def _copy(made, kind: str, tmp_path, **changes):
    path = tmp_path / kind
    shutil.copytree(made[kind], path)
    if changes:
        _edit(path, **changes)
    return path


def test_the_two_bases_differ_only_in_model_type(made):
    qwen, llama = load_base(made["qwen"]), load_base(made["llama"])
    assert (qwen.hidden_size, qwen.num_layers, qwen.num_heads) == (llama.hidden_size, llama.num_layers, llama.num_heads)
    assert (qwen.config.model_type, llama.config.model_type) == ("qwen2", "llama")
    assert _recorded(made["prompt"]) == made["qwen"] and _recorded(made["lora"]) == made["qwen"]


@pytest.mark.parametrize("kind", ["prompt", "lora"])
def test_an_adapter_of_another_architecture_with_the_same_basename_is_refused(made, kind):
    with pytest.raises(CheckpointError) as err:
        load_guided(str(made[kind]), base=load_base(made["llama"]))
    text = str(err.value)
    assert "model_type 'qwen2' vs 'llama'" in text and FIX in text and "\n" not in text, text
    assert f"names {made['qwen']!r}" in text


@pytest.mark.parametrize("kind", ["prompt", "lora"])
def test_the_adapter_loads_quietly_on_its_own_base(made, kind, recwarn):
    guided = load_guided(str(made[kind]), base=load_base(made["qwen"]))
    assert "other_base" not in guided.meta
    assert not [w for w in recwarn if "PEFT adapter" in str(w.message)]


@pytest.mark.parametrize("kind", ["prompt", "lora"])
def test_allow_other_base_loads_it_anyway_and_says_so(made, kind):
    with pytest.warns(UserWarning, match=r"made for .*qwen/final.*model_type 'qwen2' vs 'llama'"):
        guided = load_guided(str(made[kind]), base=load_base(made["llama"]), allow_other_base=True)
    other = guided.meta["other_base"][0]
    assert other["recorded"] == {"spec": made["qwen"], "model_type": "qwen2"}
    assert other["base"]["model_type"] == "llama"


def test_a_copy_of_the_recorded_base_elsewhere_is_accepted(made, tmp_path):
    copy = shutil.copytree(made["qwen"], tmp_path / "elsewhere" / "final")
    assert "other_base" not in load_guided(str(made["prompt"]), base=load_base(str(copy))).meta


def test_another_model_of_the_same_config_and_another_name_is_refused(made, tmp_path):
    twin = shutil.copytree(made["qwen"], tmp_path / "qwen-chat")
    with pytest.raises(CheckpointError, match=r"names .*qwen/final' but the base is .*qwen-chat'.*allow-other-base"):
        load_guided(str(made["prompt"]), base=load_base(str(twin)))


@pytest.mark.parametrize("kind", ["prompt", "lora"])
def test_a_missing_recorded_path_is_not_proved_by_its_basename(made, kind, tmp_path):
    gone = str(made["root"] / "gone" / "final")
    path = _copy(made, kind, tmp_path, base_model_name_or_path=gone)
    with pytest.raises(CheckpointError) as err:
        load_guided(str(path), base=load_base(made["llama"]))
    text = str(err.value)
    assert "neither a directory here nor in the HF cache" in text and FIX in text and "\n" not in text, text
    with pytest.warns(UserWarning, match="made for"):
        guided = load_guided(str(path), base=load_base(made["llama"]), allow_other_base=True)
    assert guided.meta["other_base"][0]["recorded"]["spec"] == gone


def test_a_recorded_relative_path_is_resolved(made, tmp_path, monkeypatch):
    path = _copy(made, "prompt", tmp_path, base_model_name_or_path="qwen/final")
    monkeypatch.chdir(made["root"])
    with pytest.raises(CheckpointError, match="model_type 'qwen2' vs 'llama'"):
        load_guided(str(path), base=load_base("llama/final"))
    assert "other_base" not in load_guided(str(path), base=load_base("qwen/final")).meta


def test_an_adapter_recording_no_base_is_still_checked_by_its_geometry(made, tmp_path):
    path = _copy(made, "prompt", tmp_path, base_model_name_or_path=None)
    assert "other_base" not in load_guided(str(path), base=load_base("tiny-gpt2")).meta  # shapes fit: all it records
    shallow = _save_base(tmp_path / "shallow", "tiny-llama", num_hidden_layers=2)
    with pytest.raises(CheckpointError) as err:
        load_guided(str(path), base=load_base(shallow))
    text = str(err.value)
    assert "records no base model" in text and "num_layers 4 vs 2" in text and FIX in text and "\n" not in text
    with pytest.warns(UserWarning, match="records no base model"):
        guided = load_guided(str(path), base=load_base(shallow), allow_other_base=True)
    assert guided.meta["other_base"][0]["recorded"] == {"spec": None, "num_layers": 4}
    wide = _save_base(tmp_path / "wide", "tiny-llama", hidden_size=96, head_dim=16)
    with pytest.raises(CheckpointError, match="token_dim is 64 .*records no base model"):
        load_guided(str(path), base=load_base(wide), allow_other_base=True)  # another width: never


def test_a_lora_adapter_recording_no_base_says_so_when_it_does_not_fit(made, tmp_path):
    path = _copy(made, "lora", tmp_path, base_model_name_or_path=None)
    shallow = _save_base(tmp_path / "shallow", "tiny-llama", num_hidden_layers=2)
    with pytest.raises(CheckpointError) as err:
        load_guided(str(path), base=load_base(shallow))
    assert "it records no base model" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("kind", ["prompt", "lora"])
def test_cli_refuses_the_other_architecture_in_one_line_with_exit_2(made, kind, tmp_path):
    from anchorlens.cli import app

    out = tmp_path / "out"
    args = ["capture", "--ckpt", str(made[kind]), "--base", made["llama"], "--n", "2", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error:") and "model_type 'qwen2' vs 'llama'" in last and FIX in last, last
    assert not out.exists()
