"""A resumed training run never trains on other tokens: what shapes them is part of the run (issue 41).

``train --resume`` continues from the latest step checkpoint; another chat template (a chat_template.jinja written
beside the config), other template arguments, another system prompt, chat turned off, a changed task file or
another few-shot draw is one line naming what changed, exit 2, with nothing in OUT changed (the checkpoint and
its optimizer state included). The original inputs resume: the step counter continues and the result equals an
uninterrupted run's; the manifest, ``final/anchorlens.json`` and every step checkpoint record what shaped the tokens.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from anchorlens.cli import app
from anchorlens.errors import UsageError
from anchorlens.roles.chat_template import parse_kwargs
from anchorlens.tasks import builtin_task_text
from anchorlens.tasks.prompts import PromptOptions
from anchorlens.training import Trainer, latest_checkpoint
from anchorlens.workflows.train import train
from tests.roles.chat_fixtures import QWEN3
from tests.workflows.test_chat_resume import OTHER, snapshot

from .helpers import config, guided, rte, same_state

SYSTEM = "Answer briefly."
RUN = dict(n=12, steps=4, batch_size=4, eval_every=2, progress=False, max_length=256)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory, tiny_base) -> Path:
    """tiny-llama saved with Qwen3's chat template in tokenizer_config.json (no chat_template.jinja)."""
    base = tiny_base("tiny-llama")
    folder = tmp_path_factory.mktemp("model")
    base.model.save_pretrained(folder)
    copy.deepcopy(base.tokenizer).save_pretrained(folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = QWEN3
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


def chat(system: str | None = SYSTEM, kwargs: tuple[str, ...] = (), on: bool = True) -> PromptOptions:
    return PromptOptions(chat=on, system=system, chat_template_kwargs=parse_kwargs(kwargs))


def run(base, out: Path, prompt: PromptOptions, task: str = "rte", **kw):
    return train("prompt:n=2", task, base=str(base) if isinstance(base, Path) else base, out=out, prompt=prompt,
                 **{**RUN, **kw})  # fmt: skip


def stopped_after_first_checkpoint(monkeypatch, base, out: Path, prompt: PromptOptions, **kw) -> None:
    """A run killed right after its step-2 checkpoint (an unfinished OUT: run marker + checkpoints/step-000002)."""
    saved = Trainer.save

    def save_then_die(self):
        path = saved(self)
        if self.state.step == 2:
            raise KeyboardInterrupt
        return path

    with monkeypatch.context() as m:
        m.setattr(Trainer, "save", save_then_die)
        with pytest.raises(KeyboardInterrupt):
            run(base, out, prompt, **kw)
    assert latest_checkpoint(out).name == "step-000002" and not (out / "manifest.json").exists()


def refused(base, out: Path, prompt: PromptOptions, pattern: str, **kw) -> str:
    with pytest.raises(UsageError, match=pattern) as err:
        run(base, out, prompt, resume=True, **kw)
    message = str(err.value)
    assert "\n" not in message and "the training tokens would differ" in message, message
    return message


def test_a_resumed_training_run_refuses_another_chat_template_system_prompt_or_chat(chat_model, tmp_path, monkeypatch):
    out = tmp_path / "run"
    stopped_after_first_checkpoint(monkeypatch, chat_model, out, chat())
    before = snapshot(out)
    jinja = chat_model / "chat_template.jinja"
    jinja.write_text(OTHER)  # transformers reads it instead of the config's template
    try:
        message = refused(chat_model, out, chat(), r"the chat template: text sha256")
        old, new = hashlib.sha256(QWEN3.encode()).hexdigest(), hashlib.sha256(OTHER.encode()).hexdigest()
        assert f"text sha256 {old[:12]} -> {new[:12]}" in message
        assert "tokenizer_config.json (chat_template)" in message and "chat_template.jinja" in message
        assert snapshot(out) == before
    finally:
        jinja.unlink()
    refused(chat_model, out, chat(kwargs=("enable_thinking=false",)), r"the chat template: kwargs \{\} -> ")
    refused(chat_model, out, chat(system=SYSTEM + "\n"), r"system 'Answer briefly\.' -> 'Answer briefly\.\\n'")
    refused(chat_model, out, chat(system=None, on=False), r"the prompt options: chat true -> false")
    assert snapshot(out) == before  # the checkpoint, its optimizer state and the run marker untouched
    args = ["train", "--method", "prompt:n=2", "--base", str(chat_model), "--n", "12", "--steps", "4",
            "--batch-size", "4", "--eval-every", "2", "--max-length", "256", "--chat", "--system", "Be terse.",
            "--out", str(out), "--resume"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "the prompt options: system 'Answer briefly.' -> 'Be terse.'" in lines[0], result.output
    assert snapshot(out) == before

    resumed = run(chat_model, out, chat(), resume=True)  # the original inputs resume where the run stopped
    straight = run(chat_model, tmp_path / "straight", chat())
    assert resumed.summary["steps"] == 4 and list(resumed.history["step"]) == [1, 2, 3, 4]
    assert same_state(resumed.guided, straight.guided)
    assert resumed.history["loss"].tolist() == straight.history["loss"].tolist()
    manifest = json.loads((out / "manifest.json").read_text())
    template = manifest["chat_template"]
    assert template["text"] == QWEN3 and template["sha256"] == hashlib.sha256(QWEN3.encode()).hexdigest()
    assert template["source"] == f"{chat_model / 'tokenizer_config.json'} (chat_template)" and template["kwargs"] == {}
    assert manifest["prompt"]["system"] == SYSTEM and manifest["prompt"]["chat"] is True
    final = json.loads((out / "final" / "anchorlens.json").read_text())["training"]["inputs"]
    state = json.loads((latest_checkpoint(out) / "trainer_state.json").read_text())["inputs"]
    assert final == state and final["run_key"] == manifest["run_key"]
    assert final["chat_template"]["sha256"] == template["sha256"] and final["prompt"]["system"] == SYSTEM
    assert len(pd.read_csv(out / "history.csv")) == 4


def test_a_resumed_training_run_refuses_a_changed_task_file_or_few_shot_draw(tiny_base, tmp_path):
    base = tiny_base("tiny-llama")
    task = tmp_path / "rte.toml"
    text = builtin_task_text("rte")
    task.write_text(text)
    out = tmp_path / "run"
    shots = PromptOptions(shots=1)
    run(base, out, shots, task=str(task), steps=2)
    before = snapshot(out)
    refused(base, out, PromptOptions(shots=1, seed=7), r"the few-shot demonstrations: .*seed 0 -> 7", task=str(task))
    refused(base, out, PromptOptions(shots=2), r"the few-shot demonstrations: .*shots 1 -> 2", task=str(task))
    refused(base, out, PromptOptions(shots=0), r"the prompt options: shots 1 -> 0", task=str(task))
    old = hashlib.sha256(text.encode()).hexdigest()
    task.write_text(text.replace("answer:", "Answer:"))
    new = hashlib.sha256(task.read_text().encode()).hexdigest()
    refused(base, out, shots, rf"the task: sha256 '{old[:12]}\w*\.\.\. -> '{new[:12]}", task=str(task))
    assert snapshot(out) == before
    task.write_text(text)  # the task file the run started with: the run goes on
    more = run(base, out, shots, task=str(task), resume=True)
    assert more.summary["steps"] == 4 and list(more.history["step"]) == [1, 2, 3, 4]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["task_source"]["sha256"] == old and manifest["demonstrations"]["shots"] == 1
    assert manifest["prompt"]["shots"] == 1 and "chat_template" not in manifest


def test_a_checkpoint_from_before_inputs_were_recorded_still_resumes(tiny_base, tmp_path):
    base = tiny_base("tiny-llama")
    out = tmp_path / "run"
    run(base, out, PromptOptions(), steps=2)
    state = latest_checkpoint(out) / "trainer_state.json"
    facts = json.loads(state.read_text())
    del facts["inputs"]
    state.write_text(json.dumps(facts))
    assert run(base, out, PromptOptions(), resume=True).summary["steps"] == 4


def test_the_trainer_refuses_a_checkpoint_of_other_inputs(tiny_base, tmp_path):
    base = tiny_base("tiny-llama")
    cfg = config(steps=2, save_every=1)
    inputs = {"prompt": {"system": None}, "data_digest": "a", "run_key": "1"}
    Trainer(guided(base), "rte", rte(8), None, cfg, out=tmp_path, progress=False, inputs=inputs).fit()
    other = {**inputs, "prompt": {"system": "x"}, "run_key": "2"}
    with pytest.raises(UsageError, match=r"inputs: prompt \(the training tokens would differ\)"):
        Trainer(guided(base), "rte", rte(8), None, config(steps=4, save_every=1), out=tmp_path, progress=False,
                inputs=other).fit(resume=True)  # fmt: skip
    more = Trainer(guided(base), "rte", rte(8), None, config(steps=4, save_every=1), out=tmp_path, progress=False,
                   inputs=inputs).fit(resume=True)  # fmt: skip
    assert more.state.step == 4
