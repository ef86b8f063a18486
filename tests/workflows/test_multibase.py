"""Cross-model comparisons: checkpoints on different bases that share a tokenizer run on the same tokens."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from anchorlens.errors import UsageError
from anchorlens.workflows.compare import compare
from anchorlens.workflows.multibase import split_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _save(model, tok, path) -> str:
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return str(path)


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """Two tiny llama bases of different seeds (one tokenizer), a gpt2 one (another tokenizer), and one whose
    tokenizer has the same vocabulary but adds no ``<s>``."""
    from anchorlens.models.tiny import build_tiny

    root = tmp_path_factory.mktemp("bases")
    out = {
        "llama1": _save(*build_tiny("tiny-llama", seed=1), root / "llama1"),
        "llama2": _save(*build_tiny("tiny-llama", seed=2), root / "llama2"),
        "gpt2": _save(*build_tiny("tiny-gpt2", seed=1), root / "gpt2"),
        "nobos": _save(*build_tiny("tiny-llama", seed=3), root / "nobos"),
    }
    file = root / "nobos" / "tokenizer.json"
    data = json.loads(file.read_text())
    data["post_processor"] = None  # same vocabulary, no <s> in front: other tokens
    file.write_text(json.dumps(data))
    return out


def test_split_model():
    assert split_model("instance") == (None, "instance")
    assert split_model("model=ORG/NAME") == ("ORG/NAME", "base")
    assert split_model("model=ORG/NAME@v1+instance:k=2") == ("ORG/NAME@v1", "instance:k=2")
    with pytest.raises(UsageError, match="names no model after 'model='"):
        split_model("model=+instance")


def test_split_model_keeps_a_directory_with_plus_whole(tmp_path):
    folder = tmp_path / "a+b"
    folder.mkdir()
    assert split_model(f"model={folder}+instance") == (str(folder), "instance")


@pytest.mark.slow
def test_two_bases_sharing_a_tokenizer_compare_on_the_same_tokens(bases):
    one, two = bases["llama1"], bases["llama2"]
    result = compare([f"model={one}", f"model={two}", f"model={two}+instance"], n=3, n_boot=50)
    names = result.checkpoints
    facts = result.facts
    assert facts["base"] == one and {b["spec"] for b in facts["bases"].values()} == {one, two}
    assert facts["bases"][names[0]]["fingerprint"]["weights"] != facts["bases"][names[1]]["fingerprint"]["weights"]
    assert _max_diff(result.metrics, result.metrics, names[0], names[1]) > 1e-3, "other weights, other attention"
    # the model= checkpoint measures exactly what a run on that base alone measures
    alone = compare(["base", "instance"], base=two, n=3, n_boot=50)
    assert _max_diff(result.metrics, alone.metrics, names[1], "base") == 0.0
    assert _max_diff(result.metrics, alone.metrics, names[2], "instance") == 0.0


def _max_diff(left, right, a: str, b: str) -> float:
    """Largest |value| difference between checkpoint ``a`` of ``left`` and ``b`` of ``right`` (every row pairs)."""
    mine = left[left["checkpoint"] == a].drop(columns="checkpoint")
    theirs = right[right["checkpoint"] == b].drop(columns="checkpoint")
    keys = [c for c in mine.columns if c != "value"]
    merged = mine.merge(theirs, on=keys, suffixes=("", "_other"))
    assert len(merged) == len(mine) == len(theirs)
    return float((merged["value"] - merged["value_other"]).abs().max())


def test_a_model_checkpoint_beside_plain_checkpoints_on_the_run_base(bases):
    one, two = bases["llama1"], bases["llama2"]
    result = compare(["base", f"model={two}"], base=one, n=2, n_boot=50)
    assert result.facts["base"] == one and result.facts["bases"][result.checkpoints[1]]["spec"] == two


@pytest.mark.parametrize(
    "other,needle",
    [("gpt2", "their vocabularies differ"), ("nobos", "example 0 differs at token 0 ('<s>' vs")],
)
def test_bases_with_other_tokens_are_refused_saying_why(bases, other, needle):
    with pytest.raises(UsageError) as err:
        compare([f"model={bases['llama1']}", f"model={bases[other]}"], n=2, n_boot=50)
    text = str(err.value)
    assert needle in text and "does not share the tokenizer" in text and "\n" not in text, text


def test_cli_refuses_another_tokenizer_with_one_line_and_exit_2(bases, tmp_path):
    from anchorlens.cli import app

    out = tmp_path / "cmp"
    args = ["compare", "--ckpt", f"model={bases['llama1']}", "--ckpt", f"model={bases['gpt2']}", "--n", "2"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("error:") and "vocabularies differ" in line
    assert not out.exists()


@pytest.mark.slow
def test_embedded_smollm2_against_a_tiny_fine_tune_of_itself_shares_tokens(smollm2, tmp_path):
    """The embedded SmolLM2-Instruct against itself after one Adam step on its last block: same tokens, other maps."""
    from anchorlens.models.loading import load_base
    from tests.methods.helpers import rte_batch

    tuned = load_base("smollm2-135m")  # a fresh copy: the fixture's base stays untouched
    block = tuned.adapter.blocks(tuned.model, tuned.adapter.stacks()[0])[-1]
    params = list(block.parameters())
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.Adam(params, lr=1e-3)
    batch = rte_batch(tuned, "right", n=2)
    for _ in range(1):
        loss = tuned.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    folder = _save(tuned.model, tuned.tokenizer, tmp_path / "smollm2-tuned")
    del tuned
    result = compare(["base", f"model={folder}"], base="smollm2-135m", n=3, n_boot=20)
    names = result.checkpoints
    assert result.facts["tokenizer_check"]["reference"] == "smollm2-135m"
    ent = result.metrics[result.metrics["metric"] == "entropy"].groupby("checkpoint")["value"].mean()
    print(f"smollm2 vs its fine-tune: input entropy {ent[names[0]]:.5f} vs {ent[names[1]]:.5f}")
    assert abs(ent[names[0]] - ent[names[1]]) > 1e-6


@pytest.mark.slow
def test_cli_cross_model_run_records_each_base(bases, tmp_path):
    from anchorlens.cli import app

    out = tmp_path / "cmp"
    one, two = bases["llama1"], bases["llama2"]
    args = ["compare", "--ckpt", f"model={one}", "--ckpt", f"model={two}+instance", "--n", "2", "--no-figures"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = (out / "summary.md").read_text()
    assert f"on {two} (one tokenizer: every example gives the same tokens as on {one})" in summary
    manifest = json.loads((out / "manifest.json").read_text())
    assert {b["spec"] for b in manifest["bases"].values()} == {one, two}
    assert manifest["tokenizer_check"]["reference"] == one


def test_model_is_a_compare_checkpoint_only():
    from anchorlens.methods import parse_spec

    with pytest.raises(UsageError, match="model=BASE names another base for one checkpoint of `anchorlens compare`"):
        parse_spec("model=acme/tiny+instance")
