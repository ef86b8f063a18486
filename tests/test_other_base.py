"""A checkpoint meets a base it was not trained on (issue 9): refused, or let through and said so."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from anchorlens.cli import app
from anchorlens.methods.checkpoints import save_checkpoint
from anchorlens.methods.spec import load_guided

runner = CliRunner()


@pytest.fixture(scope="module")
def llama_capsule(tiny_base, tmp_path_factory):
    """A capsule checkpoint saved on tiny-llama (4 layers, d=64: the same shapes as tiny-gpt2)."""
    path = tmp_path_factory.mktemp("ckpt") / "capsule"
    save_checkpoint(load_guided("capsule", tiny_base("tiny-llama")), path)
    return path


def test_llama_checkpoint_on_a_gpt2_base_of_equal_width_is_refused(llama_capsule, tmp_path):
    out = tmp_path / "cmp"
    args = ["compare", "--base", "tiny-gpt2", "--ckpt", "base", "--ckpt", str(llama_capsule), "--n", "2"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("error:") and "model_type 'llama' vs 'gpt2'" in line and "--allow-other-base" in line
    assert not out.exists()


def test_allow_other_base_loads_it_and_the_summary_says_so(llama_capsule, tmp_path):
    out = tmp_path / "cmp"
    args = ["compare", "--base", "tiny-gpt2", "--ckpt", "base", "--ckpt", str(llama_capsule), "--n", "2"]
    result = runner.invoke(app, [*args, "--allow-other-base", "--no-figures", "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = (out / "summary.md").read_text()
    assert "Warning: capsule" in summary and "trained on 'tiny-llama'" in summary and "'tiny-gpt2'" in summary
    facts = json.loads((out / "facts.json").read_text())
    recorded = facts["other_base"]["capsule"][0]
    assert recorded["recorded"]["model_type"] == "llama" and recorded["base"]["model_type"] == "gpt2"
