"""``evaluate`` on every FewGLUE task with tiny-llama, and its run directory."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from anchorlens.errors import UsageError
from anchorlens.workflows.evaluate import evaluate

FEWGLUE = {"boolq": "BoolQ", "cb": "CB", "copa": "COPA", "multirc": "MultiRC", "rte": "RTE", "wic": "WiC", "wsc": "WSC"}


@pytest.mark.parametrize("task", sorted(FEWGLUE))
def test_evaluate_every_fewglue_task(task, shared_data, tiny_base, tmp_path):
    data = shared_data / "fewglue" / FEWGLUE[task] / "train.jsonl"
    out = tmp_path / task
    result = evaluate("capsule", task, data, n=6, base=tiny_base("tiny-llama"), batch_size=3, max_length=128, out=out)
    preds = pd.read_csv(out / "predictions.csv")
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(preds) == 6 and metrics["n"] == 6
    assert 0.0 <= metrics["accuracy"] <= 1.0
    assert metrics["accuracy"] == pytest.approx(result.predictions["correct"].mean())
    if task == "cb":
        assert "macro_f1" in metrics
    if task == "multirc":
        assert {"f1a", "em"} <= set(metrics) and "group" in preds
    assert (out / "manifest.json").is_file()


def test_evaluate_refuses_to_overwrite_unless_forced(tiny_base, tmp_path):
    base = tiny_base("tiny-llama")
    evaluate("base", "rte", n=2, base=base, out=tmp_path / "ev")
    with pytest.raises(UsageError, match="already exists"):
        evaluate("base", "rte", n=2, base=base, out=tmp_path / "ev")
    evaluate("base", "rte", n=3, base=base, out=tmp_path / "ev", force=True)
    assert len(pd.read_csv(tmp_path / "ev" / "predictions.csv")) == 3
