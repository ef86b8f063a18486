"""The train workflow scores the held-out set once (with a bar), its metrics are those of ``final``, one default lr."""

from __future__ import annotations

import inspect
import json

import pytest

from anchorlens.evaluation import predict, task_metrics
from anchorlens.training import DEFAULT_LR, TrainConfig
from anchorlens.training import trainer as trainer_module
from anchorlens.workflows import train as train_module

FAST = dict(batch_size=4, max_length=96)


def test_one_default_learning_rate():
    assert DEFAULT_LR == 3e-3  # what the README's reproduction used
    assert TrainConfig(steps=1).lr == DEFAULT_LR
    assert inspect.signature(train_module.train).parameters["lr"].default == DEFAULT_LR


@pytest.mark.parametrize("eval_every", [0, 2])
def test_held_out_set_is_scored_once_at_the_end_with_a_bar(tiny_base, tmp_path, monkeypatch, eval_every):
    calls: list[bool] = []

    def counting(*a, **k):
        calls.append(bool(k.get("progress")))
        return predict(*a, **k)

    monkeypatch.setattr(trainer_module, "predict", counting)
    monkeypatch.setattr(train_module, "predict", counting)
    base = tiny_base("tiny-llama")
    run = train_module.train(
        "prompt:n=2", "rte", base=base, steps=4, out=tmp_path / "run", eval_every=eval_every, progress=True, **FAST
    )
    evals = 4 // eval_every if eval_every else 1
    assert len(calls) == evals  # was evals + 1: the workflow scored the held-out set again
    assert calls[-1] is True and not any(calls[:-1])  # the final scoring shows a bar
    final = train_module.load_guided(str(tmp_path / "run" / "final"), base)
    inputs = train_module.resolve_inputs("rte", None, None)
    examples = train_module.split_train_eval(inputs.examples, inputs.task, 0.1, 0)[1]
    again = task_metrics(predict(final, examples, "rte", max_length=96, batch_size=16), "rte")
    written = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert written["accuracy"] == again["accuracy"] == run.metrics["accuracy"]
    assert written["n"] == again["n"] == len(examples)
