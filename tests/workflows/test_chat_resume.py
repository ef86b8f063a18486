"""A resumed capture never mixes two chat templates (or two template arguments): the issue's reproduction.

A tiny model is saved with a chat template in tokenizer_config.json; a capture with --chat --chunk-size 4 stops
after its first chunk; a chat_template.jinja written beside the config (which transformers reads instead) or
other template arguments make the rerun one line naming the chat template, exit 2, with nothing in OUT changed.
The original command resumes, and the manifest names the template it used (text, sha256, source, arguments).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from anchorlens.capture.selection import Selection
from anchorlens.cli import app
from anchorlens.errors import UsageError
from anchorlens.roles.chat_template import parse_kwargs
from anchorlens.tasks.prompts import PromptOptions
from anchorlens.workflows.capture_run import run_capture
from tests.roles.chat_fixtures import QWEN3

OTHER = QWEN3.replace("'<|im_start|>system\\n'", "'<|im_start|>system:\\n'").replace(
    "'<|im_start|>assistant\\n'", "'<|im_start|>assistant:\\n'"
)
N = 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_base) -> Path:
    """tiny-llama saved with Qwen3's chat template in tokenizer_config.json (no chat_template.jinja; its control
    tokens are plain text to the tiny tokenizer)."""
    import copy

    base = tiny_base("tiny-llama")
    folder = tmp_path_factory.mktemp("model")
    base.model.save_pretrained(folder)
    tok = copy.deepcopy(base.tokenizer)
    # no added control tokens: the tiny model's embedding has the tiny tokenizer's vocabulary only
    tok.save_pretrained(folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = QWEN3
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def capture(model: Path, out: Path, force: bool = False, kwargs: tuple[str, ...] = (), **kw) -> Path:
    prompt = PromptOptions(chat=True, system="Answer briefly.", chat_template_kwargs=parse_kwargs(kwargs))
    return run_capture(
        "base",
        str(model),
        "rte",
        None,
        N,
        Selection(),
        2,
        out,
        force,
        chunk_size=4,
        progress=False,
        prompt=prompt,
        **kw,
    )


def snapshot(out: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(out)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(out.rglob("*")) if p.is_file()
    }


def stopped_after_first_chunk(model: Path, out: Path, kwargs: tuple[str, ...] = ()) -> None:
    def stop(chunk: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        capture(model, out, kwargs=kwargs, on_chunk_saved=stop)
    assert (out / ".progress" / "shard-00000.json").is_file() and not (out / "manifest.json").exists()


def test_a_template_file_beside_the_config_is_refused_on_resume(model_dir, tmp_path):
    out = tmp_path / "out"
    stopped_after_first_chunk(model_dir, out)
    before = snapshot(out)
    jinja = model_dir / "chat_template.jinja"
    jinja.write_text(OTHER)
    try:
        with pytest.raises(UsageError) as err:
            capture(model_dir, out)
        message = str(err.value)
        assert "\n" not in message and "unfinished run of a different command" in message
        old, new = hashlib.sha256(QWEN3.encode()).hexdigest(), hashlib.sha256(OTHER.encode()).hexdigest()
        assert f"the chat template: text sha256 {old[:12]} -> {new[:12]}" in message
        assert "tokenizer_config.json (chat_template)" in message and "chat_template.jinja" in message
        assert snapshot(out) == before  # nothing written
        result = CliRunner().invoke(
            app,
            ["capture", "--ckpt", "base", "--base", str(model_dir), "--n", str(N), "--chat", "--system",
             "Answer briefly.", "--batch-size", "2", "--chunk-size", "4", "--out", str(out)],
        )  # fmt: skip
        assert result.exit_code == 2 and "the chat template: text sha256" in result.output, result.output
        assert snapshot(out) == before
    finally:
        jinja.unlink()
    capture(model_dir, out)  # the original command resumes
    manifest = json.loads((out / "manifest.json").read_text())
    chat = manifest["chat_template"]
    assert chat["text"] == QWEN3 and chat["sha256"] == hashlib.sha256(QWEN3.encode()).hexdigest()
    assert chat["source"] == f"{model_dir / 'tokenizer_config.json'} (chat_template)" and chat["kwargs"] == {}
    assert manifest["prompt"]["system"] == "Answer briefly." and manifest["prompt"]["chat_template_kwargs"] == {}
    assert set(pd.read_parquet(out / "metrics.parquet")["example"]) == set(range(N))


def test_other_template_arguments_are_refused_on_resume(model_dir, tmp_path):
    out = tmp_path / "out"
    stopped_after_first_chunk(model_dir, out)
    before = snapshot(out)
    with pytest.raises(UsageError, match=r"the chat template: kwargs \{\} -> \{\"enable_thinking\": false\}"):
        capture(model_dir, out, kwargs=("enable_thinking=false",))
    assert snapshot(out) == before
    with pytest.raises(UsageError, match=r"system 'Answer briefly\.' -> 'Answer briefly\.\\n'"):
        run_capture(
            "base", str(model_dir), "rte", None, N, Selection(), 2, out, False, chunk_size=4, progress=False,
            prompt=PromptOptions(chat=True, system="Answer briefly.\n"),
        )  # fmt: skip
    assert snapshot(out) == before
    capture(model_dir, out, force=True, kwargs=("enable_thinking=false",))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["chat_template"]["kwargs"] == {"enable_thinking": False}
