"""The train workflow's run dir, resume and refusal rules, spec defaults, and the sweeps."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from anchorlens.errors import UsageError
from anchorlens.workflows.evaluate import evaluate
from anchorlens.workflows.sweeps import compose, sweep_instance, sweep_length
from anchorlens.workflows.train import train

from .helpers import same_state

FAST = dict(batch_size=4, eval_every=2, progress=False, max_length=96)


def test_sweep_compose_adds_instance_tokens():
    assert compose("base", 2, "last") == "instance:k=2,pos=last" and compose("capsule", 0, "first") == "capsule"


def test_train_writes_a_run_dir_and_the_final_checkpoint_evaluates(tiny_base, tmp_path):
    base = tiny_base("tiny-llama")
    run = train("capsule", "rte", base=base, steps=4, out=tmp_path / "run", **FAST)
    out = tmp_path / "run"
    assert {p.name for p in out.iterdir()} >= {
        "checkpoints",
        "final",
        "history.csv",
        "metrics.json",
        "summary.json",
        "manifest.json",
    }
    meta = json.loads((out / "final" / "anchorlens.json").read_text())
    assert meta["task"] == "rte" and meta["training"]["steps"] == 4
    assert {"wall_time_s", "time_per_step_s", "peak_rss_mb", "best_eval_accuracy", "num_trainable"} <= set(
        meta["training"]
    )
    assert len(pd.read_csv(out / "history.csv")) == 4
    assert run.metrics["n"] == 3  # 10% of the 24 bundled examples
    ev = evaluate(str(out / "final"), "rte", n=4, base=base)
    assert ev.metrics["n"] == 4


def test_train_refuses_an_existing_out_resumes_and_forces(tiny_base, tmp_path):
    base = tiny_base("tiny-llama")
    first = train("prompt:n=2", "rte", base=base, steps=2, out=tmp_path / "run", **FAST)
    with pytest.raises(UsageError, match="holds a finished run"):
        train("prompt:n=2", "rte", base=base, steps=2, out=tmp_path / "run", **FAST)
    more = train("prompt:n=2", "rte", base=base, steps=4, out=tmp_path / "run", resume=True, **FAST)
    straight = train("prompt:n=2", "rte", base=base, steps=4, out=tmp_path / "other", **FAST)
    assert more.summary["steps"] == 4 and same_state(more.guided, straight.guided)
    assert first.summary["steps"] == 2
    train("prompt:n=2", "rte", base=base, steps=1, out=tmp_path / "run", force=True, **FAST)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 1
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="holds no anchorlens run"):
        train("capsule", "rte", base=base, steps=1, out=tmp_path / "plain", resume=True, **FAST)


def test_sweeps_on_a_tiny_base(tiny_base):
    base = tiny_base("tiny-llama")
    inst = sweep_instance("base", "rte", k=(0, 1), positions=("first", "last"), base=base, n=6)
    assert list(inst[["k", "position"]].itertuples(index=False, name=None)) == [
        (0, "first"),
        (0, "last"),
        (1, "first"),
        (1, "last"),
    ]
    assert inst.loc[0, "accuracy"] == inst.loc[1, "accuracy"]  # k=0 is the spec alone
    lengths = sweep_length("prompt", (1, 3), "rte", base=base, steps=1, n=10, **{**FAST, "eval_every": 0})
    assert list(lengths["length"]) == [1, 3] and list(lengths["num_trainable"]) == [64, 192]
