"""The trainer: loss goes down, only guidance trains, checkpoints reload, resume is exact."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from anchorlens.evaluation import predict
from anchorlens.methods.checkpoints import load_checkpoint, save_checkpoint
from anchorlens.training import Trainer, dataset_loss, latest_checkpoint, step_checkpoints

from .helpers import config, guided, rte, same_state


@pytest.mark.parametrize("spec", ["capsule", "prompt:n=5"])
def test_a_few_steps_reduce_the_loss(spec, tiny_base):
    base = tiny_base("tiny-llama")
    data = rte(16)
    model = guided(base, spec)
    before = dataset_loss(model, data, "rte")
    result = Trainer(model, "rte", data, None, config(steps=8, batch_size=16), progress=False).fit()
    after = dataset_loss(result.guided, data, "rte")
    assert after < before - 1e-3
    assert all(p.grad is None or not p.requires_grad for p in base.model.parameters())
    assert not any(p.requires_grad for p in base.model.parameters())


def test_base_weights_do_not_change(tiny_base):
    base = tiny_base("tiny-llama")
    before = {k: v.clone() for k, v in base.model.state_dict().items()}
    Trainer(guided(base, "deep-prompt:n=2"), "rte", rte(8), None, config(steps=2), progress=False).fit()
    assert all(torch.equal(before[k], v) for k, v in base.model.state_dict().items())


def test_a_training_free_method_is_refused(tiny_base):
    with pytest.raises(RuntimeError, match="no trainable parameters"):
        Trainer(guided(tiny_base("tiny-llama"), "instance"), "rte", rte(4), None, config(), progress=False)


class Crash(Exception):
    """Stands in for a killed process."""


def _crash_at(step: int):
    def hook(state):
        if state.step == step:
            raise Crash

    return hook


@pytest.mark.parametrize("optimizer", ["adamw", "adafactor"])
def test_kill_and_resume_equals_an_uninterrupted_run(optimizer, tiny_base, tmp_path):
    base = tiny_base("tiny-llama")
    data, held = rte(10), rte(14)[10:]
    cfg = config(
        steps=6,
        batch_size=4,
        grad_accum=2,
        optimizer=optimizer,
        eval_every=2,
        save_every=3,
        keep_best=optimizer == "adamw",
    )
    straight = Trainer(
        guided(base, "capsule:fusion=project"), "rte", data, held, cfg, out=tmp_path / "a", progress=False
    ).fit()
    with pytest.raises(Crash):
        Trainer(guided(base, "capsule:fusion=project"), "rte", data, held, cfg, out=tmp_path / "b", progress=False).fit(
            on_step=_crash_at(4)
        )
    assert [s for s, _ in step_checkpoints(tmp_path / "b")] == [3]
    resumed = Trainer(
        guided(base, "capsule:fusion=project"), "rte", data, held, cfg, out=tmp_path / "b", progress=False
    ).fit(resume=True)
    assert resumed.state.step == 6
    assert same_state(straight.guided, resumed.guided)
    assert straight.state.history == resumed.state.history
    assert straight.state.best_accuracy == resumed.state.best_accuracy


def test_resume_refuses_changed_settings(tiny_base, tmp_path):
    base = tiny_base("tiny-llama")
    Trainer(guided(base), "rte", rte(8), None, config(steps=2, save_every=1), out=tmp_path, progress=False).fit()
    from anchorlens.errors import UsageError

    with pytest.raises(UsageError, match="lr"):
        Trainer(guided(base), "rte", rte(8), None, config(steps=4, lr=0.1), out=tmp_path, progress=False).fit(
            resume=True
        )


def test_step_checkpoint_files_are_safetensors_and_json(tiny_base, tmp_path):
    base = tiny_base("tiny-llama")
    Trainer(
        guided(base),
        "rte",
        rte(8),
        None,
        config(steps=3, save_every=1, keep_checkpoints=2),
        out=tmp_path,
        progress=False,
    ).fit()
    assert [s for s, _ in step_checkpoints(tmp_path)] == [2, 3]
    last = latest_checkpoint(tmp_path)
    assert sorted(p.name for p in last.iterdir()) == [
        "anchorlens.json",
        "guidance.safetensors",
        "trainer_state.json",
        "trainer_state.safetensors",
    ]
    facts = json.loads((last / "trainer_state.json").read_text())
    assert facts["state"]["step"] == 3 and facts["optimizer"]["param_groups"][0]["lr"] == 3e-3
    assert not list(tmp_path.rglob(".*"))  # no temp leftovers


def test_early_stopping_restores_the_best_state(tiny_base):
    base = tiny_base("tiny-llama")
    data = rte(12)
    cfg = config(steps=30, lr=0.3, eval_every=1, patience=2)
    trainer = Trainer(guided(base), "rte", data[:8], data[8:], cfg, progress=False)
    result = trainer.fit()
    assert result.state.stopped and result.state.step < 30
    assert result.summary["best_eval_accuracy"] == result.state.best_accuracy
    assert trainer.evaluate() == result.state.best_accuracy


def test_checkpoint_reloads_with_identical_predictions(tiny_base, tmp_path):
    base = tiny_base("tiny-llama")
    result = Trainer(guided(base, "prompt:n=3"), "rte", rte(8), None, config(steps=2, lr=0.05), progress=False).fit()
    save_checkpoint(result.guided, tmp_path / "ck", task="rte", training=result.summary)
    again = load_checkpoint(tmp_path / "ck", base=base)
    a = predict(result.guided, rte(6), "rte")
    b = predict(again, rte(6), "rte")
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert again.meta["training"]["steps"] == 2


def test_t5_trains_through_its_decoder_targets(tiny_base):
    base = tiny_base("tiny-t5")
    model = guided(base, "capsule")
    data = rte(8)
    before = dataset_loss(model, data, "rte")
    result = Trainer(model, "rte", data, None, config(steps=3, batch_size=8, lr=0.01), progress=False).fit()
    assert result.state.step == 3 and dataset_loss(result.guided, data, "rte") < before  # it learned
