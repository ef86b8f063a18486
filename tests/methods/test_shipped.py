"""Trained checkpoints shipped in the package: addressed as NAME@TASK, recorded, loadable, reproducible."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from anchorlens.cli import app
from anchorlens.errors import UsageError
from anchorlens.methods.checkpoints import read_meta
from anchorlens.methods.shipped import list_checkpoints, shipped_checkpoint, shipped_root
from anchorlens.methods.spec import Directory, parse_spec
from anchorlens.workflows.reproduce import load_plan
from tests.conftest import REPO

SHIPPED = ("capsule@sst2", "deep-prompt@sst2", "prompt@sst2")
METHODS = {"capsule@sst2": "capsule", "deep-prompt@sst2": "deep-prompt:n=10", "prompt@sst2": "prompt:n=20"}


def test_the_sst2_checkpoints_ship_with_their_record():
    shipped = {c.address: c for c in list_checkpoints()}
    assert tuple(sorted(shipped)) == SHIPPED
    for address, ckpt in shipped.items():
        meta, t = ckpt.meta, ckpt.training
        assert meta["task"] == "sst2" and meta["template"] == "Review: {sentence}\nSentiment:"
        assert meta["base"]["spec"] == "smollm2-135m" and meta["base"]["provenance"]["path"] is None
        assert t["method_spec"] == METHODS[address]
        assert t["command"].startswith(f"anchorlens train --method {METHODS[address]} --task sst2 --data ")
        assert len(t["data_sha256"]) == 64 and len(t["data_digest"]) == 16 and t["data_file"].endswith("train.jsonl")
        assert t["num_train"] + t["num_eval"] == 5000 and 0 < t["steps"] <= t["config"]["steps"]
        assert meta["seed"] == t["config"]["seed"] == 0 and t["time_per_step_s"] > 0
        val = t["validation"]
        assert val["n"] == 872 and val["data_file"] == "glue/SST-2/validation.jsonl"
        assert val["accuracy"] == pytest.approx(val["correct"] / val["n"])
        low, high = val["interval"]
        assert low < val["accuracy"] < high and math.isfinite(val["label_nll"])
        size = (ckpt.path / "guidance.safetensors").stat().st_size  # float32 values and a small header, nothing more
        assert (
            ckpt.path.parent.parent == shipped_root()
            and 4 * meta["num_trainable"] < size < 4 * meta["num_trainable"] + 4096
        )
        assert (
            meta["num_trainable"] == {"capsule": 30 * 576, "deep-prompt": 30 * 10 * 576, "prompt": 20 * 576}[ckpt.name]
        )


def test_the_reproduce_plan_retrains_them_with_their_recorded_budget():
    plan = load_plan(REPO / "examples" / "reproduce-sst2.toml")
    assert [t.name for t in plan.tasks] == ["sst2"] and plan.seeds == (0,)
    assert sorted(plan.methods) == sorted(METHODS.values())
    for ckpt in list_checkpoints():
        config = ckpt.training["config"]
        for key in ("steps", "lr", "batch_size", "eval_every", "patience", "group_by_length", "max_length"):
            assert plan.budget[key] == config[key], (ckpt.address, key)
        assert ckpt.training["num_train"] + ckpt.training["num_eval"] == plan.budget["n_train"]


def test_specs_name_shipped_checkpoints_and_print_back():
    spec = parse_spec("capsule@sst2")
    (part,) = spec.parts
    assert isinstance(part, Directory) and part.kind == "checkpoint" and part.name == "capsule@sst2"
    assert str(spec) == "capsule@sst2" and parse_spec(str(spec)) == spec
    assert read_meta(part.path)["methods"][0]["kind"] == "capsule"
    composed = parse_spec("prompt@sst2+instance")
    assert str(composed) == "prompt@sst2+instance" and len(composed.parts) == 2
    assert shipped_checkpoint("Capsule@SST2").address == "capsule@sst2"


def test_unknown_shipped_names_are_one_line_listing_the_shipped_ones():
    with pytest.raises(UsageError) as info:
        parse_spec("capsule@rte")
    message = str(info.value)
    assert "no shipped checkpoint 'capsule@rte'" in message and "prompt@sst2" in message and "\n" not in message
    result = CliRunner().invoke(app, ["checkpoints", "nope@sst2"])
    assert result.exit_code == 2 and "no shipped checkpoint 'nope@sst2'" in result.output


def test_a_directory_of_the_same_name_wins(tmp_path, monkeypatch):
    from anchorlens.methods.checkpoints import META_FILE

    folder = tmp_path / "capsule@sst2"
    folder.mkdir()
    (folder / META_FILE).write_text((shipped_checkpoint("capsule@sst2").path / META_FILE).read_text())
    monkeypatch.chdir(tmp_path)
    (part,) = parse_spec("capsule@sst2").parts
    assert isinstance(part, Directory) and part.name is None and part.path == "capsule@sst2"


def test_checkpoints_command_lists_them_with_validation_accuracy():
    result = CliRunner().invoke(app, ["checkpoints"])
    assert result.exit_code == 0, result.output
    for address in SHIPPED:
        row = next(line for line in result.output.splitlines() if line.startswith(f"| {address} |"))
        acc = shipped_checkpoint(address).training["validation"]["accuracy"]
        assert f"{acc:.3f} [" in row and "(n=872)" in row
    assert CliRunner().invoke(app, ["checkpoints", "--task", "sst2"]).output == result.output
    other = CliRunner().invoke(app, ["checkpoints", "--task", "rte"])
    assert other.exit_code == 2 and "shipped tasks: sst2" in other.output
    one = CliRunner().invoke(app, ["checkpoints", "capsule@sst2"])
    assert one.exit_code == 0 and json.loads(one.output)["training"]["validation"]["n"] == 872


def test_shipped_checkpoints_load_on_the_embedded_model(smollm2):
    from anchorlens.methods import load_guided

    guided = load_guided("capsule@sst2+instance", base=smollm2)
    assert [g.kind for g in guided.guidances] == ["capsule", "instance"]
    assert guided.num_trainable() == 30 * 576
