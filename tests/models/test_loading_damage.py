"""Damaged local model directories are refused with one line and exit 2; intact round trips load unchanged.

Missing, surplus or resized tensors would otherwise be randomly initialised by transformers; corrupt or
missing safetensors files, a missing tokenizer and a T5 config without a decoder start token would
otherwise end in an internal error.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from anchorlens.cli import app
from anchorlens.errors import DataError
from anchorlens.models.loading import load_base
from anchorlens.models.tiny import build_tiny

runner = CliRunner()
WEIGHTS = "model.safetensors"


def save_tiny(path: Path, name: str = "tiny-llama", tokenizer: bool = True, **save: Any) -> Path:
    """The tiny base ``name`` saved by ``save_pretrained`` into ``path`` (with its tokenizer unless told)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model: Any
    tok: Any
    model, tok = build_tiny(name)
    model.save_pretrained(path, **save)
    if tokenizer:
        tok.save_pretrained(path)
    return path


def edit_tensors(path: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    """Rewrite ``path/model.safetensors`` after ``edit`` changed its tensors in place."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(path / WEIGHTS))
    edit(state)
    save_file(state, str(path / WEIGHTS), metadata={"format": "pt"})


def edit_config(path: Path, **changes: Any) -> None:
    """Set keys of ``path/config.json``."""
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def refusal(base: Path, tmp_path: Path) -> str:
    """The one ``error:`` line of ``anchorlens capture --base BASE`` (exit 2, nothing else printed)."""
    out = tmp_path / "out"
    result = runner.invoke(app, ["capture", "--ckpt", "base", "--base", str(base), "--limit", "2", "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "internal error" not in result.output and not out.exists()
    return lines[0]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2", "tiny-bert", "tiny-t5"])
def test_save_pretrained_round_trip_loads_the_same_weights(tmp_path, name):
    """Tied embeddings, non-persistent buffers and heads of a normal round trip are never refused."""
    path = save_tiny(tmp_path / "m", name)
    base = load_base(str(path))
    ref, _ = build_tiny(name)
    ours = base.model.state_dict()
    for key, value in ref.state_dict().items():
        torch.testing.assert_close(ours[key], value, rtol=0, atol=0)


def test_missing_tensor_is_refused_naming_it(tmp_path):
    path = save_tiny(tmp_path / "m")
    edit_tensors(path, lambda state: state.pop("model.layers.2.self_attn.q_proj.weight"))
    line = refusal(path, tmp_path)
    assert str(path) in line and "model.layers.2.self_attn.q_proj.weight" in line and "save_pretrained" in line


def test_missing_tensor_refusal_is_one_line_on_stderr(tmp_path):
    """transformers' multi-line LOAD REPORT is not printed beside the refusal."""
    path = save_tiny(tmp_path / "m")
    edit_tensors(path, lambda state: state.pop("model.layers.0.mlp.up_proj.weight"))
    cmd = [sys.executable, "-m", "anchorlens", "capture", "--ckpt", "base", "--base", str(path), "--limit", "2"]
    cmd += ["--out", str(tmp_path / "out"), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "model.layers.0.mlp.up_proj.weight" in lines[0], done.stderr


def test_extra_parameter_in_a_module_is_refused_but_an_unused_head_is_not(tmp_path):
    path = save_tiny(tmp_path / "m")
    edit_tensors(path, lambda state: state.update({"score.weight": torch.ones(2, 64)}))  # a head the LM lacks
    assert load_base(str(path)).num_layers == 4
    edit_tensors(path, lambda state: state.update({"model.layers.1.self_attn.q_proj.bias": torch.ones(64)}))
    line = refusal(path, tmp_path)
    assert "model.layers.1.self_attn.q_proj.bias" in line and "config.json" in line


def test_config_with_fewer_layers_than_the_weights_is_refused(tmp_path):
    path = save_tiny(tmp_path / "m")
    edit_config(path, num_hidden_layers=3)
    line = refusal(path, tmp_path)
    assert "model.layers.3." in line and "config.json" in line


def test_config_sizes_that_disagree_with_the_weights_are_refused(tmp_path):
    path = save_tiny(tmp_path / "m")
    edit_config(path, intermediate_size=96)
    line = refusal(path, tmp_path)
    assert str(path) in line and "config.json disagrees with the weights" in line and "96) by config.json" in line
    assert "save_pretrained" in line and "ignore_mismatched_sizes" not in line


def _halve(path: Path) -> None:
    data = (path / WEIGHTS).read_bytes()
    (path / WEIGHTS).write_bytes(data[: len(data) // 2])


def _garble_header(path: Path) -> None:
    data = (path / WEIGHTS).read_bytes()
    (path / WEIGHTS).write_bytes(b"\xff" * 64 + data[64:])


def _cut_tail(path: Path) -> None:
    data = (path / WEIGHTS).read_bytes()
    (path / WEIGHTS).write_bytes(data[:-1000])


@pytest.mark.parametrize("damage", [_halve, _garble_header, _cut_tail], ids=["half", "header", "tail"])
def test_corrupt_safetensors_is_one_line_naming_the_file(tmp_path, damage):
    path = save_tiny(tmp_path / "m")
    damage(path)
    line = refusal(path, tmp_path)
    assert f"{path / WEIGHTS} is damaged" in line and "re-save the model" in line
    with pytest.raises(DataError, match=re.escape(str(path / WEIGHTS))):
        load_base(str(path))


def test_missing_shard_is_named_as_an_input(tmp_path):
    path = save_tiny(tmp_path / "m", max_shard_size="300KB")
    shards = sorted(path.glob("model-*-of-*.safetensors"))
    assert len(shards) > 2
    shards[1].unlink()
    line = refusal(path, tmp_path)
    assert str(shards[1]) in line and "output" not in line and "no such file" in line


def test_directory_without_a_tokenizer_is_one_line(tmp_path):
    path = save_tiny(tmp_path / "m", tokenizer=False)
    line = refusal(path, tmp_path)
    assert line == f"error: no tokenizer in {path}; save one with tokenizer.save_pretrained({str(path)!r})"


def test_t5_without_a_decoder_start_token_is_refused_at_load(tmp_path):
    path = save_tiny(tmp_path / "m", "tiny-t5")
    edit_config(path, decoder_start_token_id=None)
    line = refusal(path, tmp_path)
    assert "decoder_start_token_id" in line and "pad_token_id" in line and "TypeError" not in line


def test_a_config_without_model_type_says_so_not_remote_code():
    from anchorlens.errors import UsageError
    from anchorlens.models.loading import refuse_remote_code

    with pytest.raises(DataError, match=r"config.json of m has no model_type, so its architecture is unknown"):
        refuse_remote_code({"hidden_size": 8}, "m")
    with pytest.raises(UsageError, match=r"never runs remote code; m has model_type None \(its config.json points"):
        refuse_remote_code({"auto_map": {"AutoConfig": "x.C"}}, "m")
