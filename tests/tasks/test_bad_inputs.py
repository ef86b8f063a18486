"""The bad inputs of a user's own experiment, through the CLI: each is one ``error:`` line naming the file (and the
line or row) and the fix, exit code 2, and nothing written to ``--out``."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from anchorlens.cli import app
from anchorlens.errors import UsageError
from anchorlens.evaluation import verbalizer_ids
from anchorlens.tasks import load_examples, load_task_file

runner = CliRunner()
TASK = (
    'name = "reviews"\ntemplate = "Review: {text}\\nSentiment:"\nlabels = { positive = " good", negative = " bad" }\n'
)
BODIES = ["Lovely kettle, boils fast.", "Broke after two days.", "Soft and warm.", "Arrived crushed."]


def _csv(path: Path, n: int, short_row: int | None = None) -> Path:
    """``n`` reviews (columns review_body, label); data row ``short_row`` (1-based) lacks its label column."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["review_body", "label"])
        for i in range(1, n + 1):
            row = [BODIES[i % 4], "positive" if i % 2 else "negative"]
            w.writerow(row[:1] if i == short_row else row)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bad")
    (d / "reviews.toml").write_text(TASK)
    (d / "unknown_key.toml").write_text(TASK + 'lable_field = "label"\n')
    (d / "no_slot.toml").write_text(TASK.replace("{text}", "the review"))
    (d / "other_slot.toml").write_text(TASK.replace("{text}", "{body}"))
    (d / "few_labels.toml").write_text(TASK.replace(', negative = " bad"', ""))
    _csv(d / "reviews.csv", 12)
    _csv(d / "short.csv", 1300, short_row=1207)
    (d / "wide.csv").write_text("review_body,label\nfine,positive\nsoft, warm,negative\n")
    (d / "fake.parquet").write_bytes(b"PAR1 this is not parquet\n")
    (d / "code.yaml").write_text(
        "task: r\ndoc_to_text: 'Review: {{text}}'\ndoc_to_target: label\ndoc_to_choice: ['positive', 'negative']\n"
        "process_docs: !function utils.process_docs\n"
    )
    return d


def _args(d: Path, task: str = "reviews.toml", data: str = "reviews.csv") -> list[str]:
    return ["--task", str(d / task), "--data", str(d / data), "--field-map", "text=review_body"]


CASES = [
    ("unknown key", "unknown_key.toml", "reviews.csv", [],
     r"{d}/unknown_key.toml: unknown key 'lable_field' \(did you mean 'label_field'\?\)"),
    ("a slot the data lacks", "other_slot.toml", "reviews.csv", [],
     r"{d}/reviews.csv: row 1: missing field 'body' for task reviews .*rename one with --field-map body=COLUMN"),
    ("a label without verbalizer", "few_labels.toml", "reviews.csv", [],
     r"{d}/reviews.csv: row 2: label 'negative' is not one of \('positive',\) for task reviews; "
     r"give it a verbalizer in .*few_labels.toml"),
    ("no content slot", "no_slot.toml", "reviews.csv", [], r"{d}/no_slot.toml: the template has no \{field\} slot"),
    ("a missing column at row 1,207", "reviews.toml", "short.csv", [],
     r"{d}/short.csv: row 1,207 \(line 1,208\) has 1 of the header's 2 columns \(label missing\); complete the row"),
    ("a row with a column too many", "reviews.toml", "wide.csv", [],
     r"{d}/wide.csv: row 2 \(line 3\) has 3 columns, the header 2; quote the field that holds a ','"),
    ("a .parquet that is not parquet", "reviews.toml", "fake.parquet", [],
     r"{d}/fake.parquet: not a parquet file \(.*\); check the file or its extension"),
    ("--chat without a chat template", "reviews.toml", "reviews.csv", ["--chat"],
     r"the tokenizer .* has no chat template; drop --chat"),
    ("more shots than the file holds", "reviews.toml", "reviews.csv", ["--shots", "12"],
     r"{d}/reviews.csv: --shots 12 needs 12 labelled demonstrations but the file holds 11 besides the query; "
     r"lower --shots or pass --shots-from"),
    ("more shots than --shots-from holds", "reviews.toml", "reviews.csv",
     ["--shots", "5", "--shots-from", "{d}/wide_ok.csv"], r"{d}/wide_ok.csv: --shots 5 needs 5 .* holds 1;"),
    ("harness code", "code.yaml", "reviews.csv", [],
     r"{d}/code.yaml: process_docs is `!function utils.process_docs` .*preprocess the data and drop process_docs"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "task", "data", "extra", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_naming_the_file_exit_2_nothing_written(files, case, task, data, extra, message):
    d = files
    (d / "wide_ok.csv").write_text("review_body,label\nfine,positive\n")
    out = d / f"out-{re.sub(r'[^a-z0-9]+', '-', case)}"
    extra = [e.replace("{d}", str(d)) for e in extra]
    r = runner.invoke(
        app,
        ["capture", "--ckpt", "base", "--base", "tiny-llama", *_args(d, task, data), *extra, "--out", str(out)],
    )
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert re.search(message.replace("{d}", re.escape(str(d))), lines[0]), lines[0]
    assert not out.exists()


def test_a_reader_failure_prints_nothing_of_its_own(files, capfd):
    """HF datasets logs a failed read before raising it; only anchorlens's one line may reach the terminal."""
    with pytest.raises(UsageError, match="not a parquet file"):
        load_examples(files / "fake.parquet", load_task_file(files / "reviews.toml"))
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""


def test_a_verbalizer_that_tokenizes_to_nothing_names_the_task_file(tmp_path):
    """A tokenizer that drops format characters (BERT's text cleaning) turns a zero-width answer into no token."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({"[UNK]": 0, "good": 1, "bad": 2}, unk_token="[UNK]"))
    raw.normalizer = normalizers.BertNormalizer(clean_text=True, lowercase=True)
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]")
    path = tmp_path / "zw.toml"
    path.write_text(TASK.replace('" good"', '" \\u200b"'))
    task = load_task_file(path)  # not blank text, so the file itself is valid
    with pytest.raises(UsageError) as info:
        verbalizer_ids(tok, task)
    assert str(info.value) == (
        f"{path.resolve()}: the verbalizer ' \\u200b' tokenizes to nothing; give each label a non-empty answer"
    )
