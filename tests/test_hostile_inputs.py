"""Hostile and bad input: one line naming the problem and the fix, exit 2, nothing written."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from anchorlens.cli import app

runner = CliRunner()
TINY = ["--base", "tiny-llama"]
GOOD = {"premise": "A cat sat on the mat.", "hypothesis": "A cat sat.", "label": "entailment", "idx": 0}


def _jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _refused(tmp_path, args, *needles):
    out = tmp_path / "out"
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert len(text.splitlines()) == 1 and "Traceback" not in text, text
    for needle in needles:
        assert needle in text, (needle, text)
    assert not out.exists()
    return text


@pytest.mark.parametrize("command", ["compare", "capture"])
def test_malformed_jsonl_names_file_and_line(tmp_path, command):
    data = _jsonl(tmp_path / "bad.jsonl", [GOOD, GOOD, '{"premise": "unterminated'])
    ckpts = ["--ckpt", "base", "--ckpt", "instance"] if command == "compare" else ["--ckpt", "base"]
    _refused(tmp_path, [command, *ckpts, *TINY, "--data", str(data)], f"{data}:3:", "not valid JSON")


def test_missing_field_for_the_task(tmp_path):
    data = _jsonl(tmp_path / "nohyp.jsonl", [GOOD, {"premise": "only a premise", "label": "entailment"}])
    _refused(tmp_path, ["capture", "--ckpt", "base", *TINY, "--data", str(data)], f"{data}:2:", "missing field 'hypothesis'")


def test_empty_data(tmp_path):
    data = _jsonl(tmp_path / "empty.jsonl", [])
    _refused(tmp_path, ["capture", "--ckpt", "base", *TINY, "--data", str(data)], "no examples")


def test_unknown_method_option(tmp_path):
    _refused(tmp_path, ["capture", "--ckpt", "instance:z=3", *TINY], "unknown option 'z=3'", "valid options")


def test_position_beyond_the_sequence(tmp_path):
    _refused(tmp_path, ["compare", "--ckpt", "base", "--ckpt", "capsule:pos=5000", *TINY, "--n", "2"], "beyond")


def _saved_capsule(tmp_path, tiny_base):
    from anchorlens.methods.checkpoints import save_checkpoint
    from anchorlens.methods.spec import load_guided

    ckpt = tmp_path / "ckpt"
    save_checkpoint(load_guided("capsule", base=tiny_base("tiny-llama")), ckpt)
    return ckpt


def test_truncated_safetensors(tmp_path, tiny_base):
    ckpt = _saved_capsule(tmp_path, tiny_base)
    weights = ckpt / "guidance.safetensors"
    weights.write_bytes(weights.read_bytes()[:-40])
    _refused(tmp_path, ["capture", "--ckpt", str(ckpt), *TINY], "guidance.safetensors", "truncated or corrupted")


def test_corrupted_safetensors_header(tmp_path, tiny_base):
    ckpt = _saved_capsule(tmp_path, tiny_base)
    (ckpt / "guidance.safetensors").write_bytes(b"\xff" * 64)
    _refused(tmp_path, ["capture", "--ckpt", str(ckpt), *TINY], "truncated or corrupted")


def test_checkpoint_from_another_base(tmp_path, tiny_base):
    ckpt = _saved_capsule(tmp_path, tiny_base)
    _refused(tmp_path, ["capture", "--ckpt", str(ckpt), "--base", "tiny-t5"], "trained on 'tiny-llama'", "own base")


def test_unknown_base_and_unknown_task(tmp_path):
    _refused(tmp_path, ["capture", "--ckpt", "base", "--base", "no-such-model"], "unknown base 'no-such-model'")
    _refused(tmp_path, ["capture", "--ckpt", "base", *TINY, "--task", "glue"], "unknown task 'glue'")


def test_inputs_longer_than_the_context_are_truncated_with_a_warning(tmp_path):
    long = dict(GOOD, premise=" ".join(["word"] * 700))  # > 512 positions of tiny-llama
    data = _jsonl(tmp_path / "long.jsonl", [GOOD, long])
    out = tmp_path / "run"
    result = runner.invoke(app, ["capture", "--ckpt", "base", *TINY, "--data", str(data), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "warning: truncated 1 of 2 examples to 512 tokens (the base's context length)" in result.output
    result = runner.invoke(app, ["capture", "--ckpt", "base", *TINY, "--data", str(data), "--out", str(tmp_path / "r2"),
                                 "--no-progress", "--max-length", "12"])
    assert result.exit_code == 0 and "truncated 2 of 2 examples to 12 tokens (--max-length)" in result.output
