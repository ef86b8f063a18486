"""--data in the formats people have: jsonl, json, csv, tsv, parquet, txt, save_to_disk directories and hub ids
from the HF cache, read through HF datasets; --field-map; one-line errors naming the file and the line or row."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from anchorlens.errors import DataError, UsageError
from anchorlens.tasks import get_task, load_examples, load_task_file, parse_field_map, parse_source

REVIEWS = (
    'name = "reviews"\ntemplate = "Review: {text}\\nSentiment:"\nlabels = { positive = " good", negative = " bad" }\n'
)
ROWS = [{"review_body": f"review number {i}", "stars": "positive" if i % 2 else "negative"} for i in range(6)]


@pytest.fixture()
def reviews(tmp_path):
    path = tmp_path / "reviews.toml"
    path.write_text(REVIEWS + 'label_field = "stars"\n')
    return load_task_file(path)


def _write_csv(path: Path, rows: list[dict], sep: str = ",") -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]), delimiter=sep)
        writer.writeheader()
        writer.writerows(rows)
    return path


def _write(tmp_path: Path, fmt: str, rows: list[dict]) -> Path:
    import pandas as pd

    path = tmp_path / f"data.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    elif fmt in ("csv", "tsv"):
        _write_csv(path, rows, "\t" if fmt == "tsv" else ",")
    elif fmt == "parquet":
        pd.DataFrame(rows).to_parquet(path)
    elif fmt == "saved":
        from datasets import Dataset

        path = tmp_path / "saved"
        Dataset.from_list(rows).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "tsv", "parquet", "saved"])
def test_every_format_gives_the_same_examples(tmp_path, reviews, fmt):
    path = _write(tmp_path, fmt, ROWS)
    examples = load_examples(path, reviews, field_map="text=review_body")
    assert len(examples) == 6
    assert [(e["text"], e["label"], e["idx"], e["labelled"]) for e in examples] == [
        (r["review_body"], r["stars"], i, True) for i, r in enumerate(ROWS)
    ]
    assert examples.facts["field_map"] == {"text": "review_body"} and examples.facts["rows"] == 6
    assert len(load_examples(path, reviews, limit=2, field_map={"text": "review_body"})) == 2
    assert examples.digest() == load_examples(path, reviews, field_map="text=review_body").digest()


def test_typed_columns_match_typed_labels(tmp_path):
    """A CSV's 'true'/'false' cells and a parquet bool column both match BoolQ's boolean labels."""
    import pandas as pd

    rows = [{"passage": "p", "question": "q", "label": v} for v in (True, False, True)]
    csv_path = _write_csv(tmp_path / "b.csv", [{**r, "label": str(r["label"]).lower()} for r in rows])
    pq = tmp_path / "b.parquet"
    pd.DataFrame(rows).to_parquet(pq)
    for path in (csv_path, pq):
        ex = load_examples(path, "boolq")
        assert [get_task("boolq").label_index(e["label"]) for e in ex] == [0, 1, 0]


def test_a_million_row_parquet_is_not_read_into_memory(tmp_path):
    """The rows stay in a memory-mapped Arrow file: examples are built when read (here 200k rows, 4 used)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 200_000
    table = pa.table({"text": [f"document {i}" for i in range(n)], "label": ["positive", "negative"] * (n // 2)})
    path = tmp_path / "big.parquet"
    pq.write_table(table, path, row_group_size=50_000)
    task_path = tmp_path / "t.toml"
    task_path.write_text(REVIEWS)
    examples = load_examples(path, task_path, limit=4)
    assert len(examples) == 4 and examples[3]["text"] == "document 3" and examples._rows is None
    everything = load_examples(path, task_path)
    assert len(everything) == n and everything[n - 1]["text"] == f"document {n - 1}"
    assert everything._table.column("text").chunk(0).buffers()[1] is not None  # Arrow buffers, not Python rows


def test_csv_missing_value_at_row_1207_names_the_row(tmp_path, reviews):
    rows = [{"review_body": f"r{i}", "stars": "positive"} for i in range(1500)]
    rows[1206]["review_body"] = ""  # row 1,207 (1-based): an empty cell
    path = _write_csv(tmp_path / "reviews.csv", rows)
    with pytest.raises(DataError) as info:
        load_examples(path, reviews, field_map="text=review_body")
    assert str(info.value) == f"{path}: row 1,207: missing field 'text' for task reviews; fill it in or drop the row"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.parquet", b"not parquet at all", r"bad.parquet: not a parquet file"),
        ("a.csv", b"text,stars\n", r"a.csv: no examples"),
        ("a.xlsx", b"x", r"unknown file type '.xlsx'"),
        ("a.jsonl", b'{"text": "x", "stars": "positive"}\n{"text": ["a"], "stars": "positive"}\n',
         r"a.jsonl:2: field 'text' must be a string or number, got a list"),
        ("a.jsonl", b'{"text": "x\xff", "stars": "positive"}\n', r"a.jsonl:1: not UTF-8 \(byte 0xff at column 12\)"),
        ("a.csv", b"text,stars\nhello,positive\nbye,maybe\n", r"a.csv: row 2: label 'maybe' is not one of"),
        ("a.csv", b"body,stars\nhello,positive\n", r"a.csv: row 1: missing field 'text' .*--field-map text=COLUMN"),
    ],
)  # fmt: skip
def test_bad_data_is_one_line(tmp_path, reviews, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(UsageError, match=message) as info:
        load_examples(path, reviews)
    assert "\n" not in str(info.value)


def test_field_map_errors(tmp_path, reviews):
    path = _write(tmp_path, "csv", ROWS)
    with pytest.raises(DataError, match=r"no column 'body'; columns: review_body, stars"):
        load_examples(path, reviews, field_map="text=body")
    with pytest.raises(UsageError, match="write FIELD=COLUMN"):
        parse_field_map("text")
    assert parse_field_map(["a=b", "c=d,e=f"]) == {"a": "b", "c": "d", "e": "f"}
    with pytest.raises(DataError, match=r"maps text and stars to the one column 'review_body'; map each field to"):
        load_examples(path, reviews, field_map="text=review_body,stars=review_body")
    nested = tmp_path / "nested.jsonl"
    nested.write_text('{"meta": {"body": "x"}, "stars": "positive"}\n')
    with pytest.raises(DataError, match=r"renames whole columns, not fields inside 'meta'; write \{meta.body\} in"):
        load_examples(nested, reviews, field_map="text=meta.body")


def test_saved_dataset_dict_splits(tmp_path, reviews):
    from datasets import Dataset, DatasetDict

    rows = [{"text": f"t{i}", "stars": "positive"} for i in range(3)]
    DatasetDict({"train": Dataset.from_list(rows), "test": Dataset.from_list(rows[:1])}).save_to_disk(
        str(tmp_path / "dd")
    )
    assert len(load_examples(tmp_path / "dd", reviews)) == 3  # train by default
    assert len(load_examples(f"{tmp_path / 'dd'}@test", reviews)) == 1
    with pytest.raises(UsageError, match="has no split 'dev'; splits: train, test"):
        load_examples(f"{tmp_path / 'dd'}@dev", reviews)


def test_hub_dataset_from_the_hf_cache_offline(tmp_path, monkeypatch, reviews):
    """hf:ORG/NAME:CONFIG@SPLIT from a hub cache laid out as huggingface_hub writes it; the commit is recorded."""
    import pandas as pd

    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "datasets--acme--reviews"
    snap = repo / "snapshots" / commit
    (snap / "en").mkdir(parents=True)
    pd.DataFrame([{"text": f"t{i}", "stars": "negative"} for i in range(4)]).to_parquet(
        snap / "en" / "test-00000.parquet"
    )
    pd.DataFrame([{"text": "x", "stars": "positive"}]).to_parquet(snap / "en" / "train-00000.parquet")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    src = parse_source("hf:acme/reviews:en@test")
    assert (src.repo_id, src.config, src.split) == ("acme/reviews", "en", "test")
    examples = load_examples("hf:acme/reviews:en@test", reviews)
    assert len(examples) == 4 and examples.facts["revision"] == commit and examples.facts["repo_id"] == "acme/reviews"
    with pytest.raises(DataError, match=r"hub dataset acme/missing is not in the local HF cache.*hf download"):
        load_examples("hf:acme/missing", reviews)
    with pytest.raises(UsageError, match="not a hub dataset id"):
        parse_source("hf:")


def test_text_corpus_from_txt_skips_blank_lines(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("First document.\n\n   \nSecond one, with a comma.\n")
    docs = load_examples(path, "text")
    assert [d["text"] for d in docs] == ["First document.", "Second one, with a comma."]
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # a byte-order mark (Windows editors write one)
    assert [d["text"] for d in load_examples(path, "text")][0] == "First document."
    assert [d["labelled"] for d in docs] == [False, False]


def test_csv_cells_are_read_as_the_text_they_are(tmp_path, reviews):
    """No type guessing: zip codes keep their zeros, 3.10 its zero, and True / None / NA stay words."""
    path = tmp_path / "t.csv"
    path.write_text(
        "review_body,stars\n007,positive\n3.10,negative\n1e5,positive\nTrue,negative\nNone,positive\nNA,negative\n"
    )
    examples = load_examples(path, reviews, field_map="text=review_body")
    assert [e["text"] for e in examples] == ["007", "3.10", "1e5", "True", "None", "NA"]
    empty = tmp_path / "empty_label.csv"
    empty.write_text("review_body,stars\nfine,positive\nno label,\n")
    assert [e["labelled"] for e in load_examples(empty, reviews, field_map="text=review_body")] == [True, False]


def test_a_csv_label_written_as_a_number_matches_a_numeric_label_but_not_a_padded_one(tmp_path):
    task = tmp_path / "ints.toml"
    task.write_text('name = "ints"\ntemplate = "Q: {text}"\nlabels = [ { value = 0, verbalizer = " no" }, { value = 1, verbalizer = " yes" } ]\n')  # fmt: skip
    floats = tmp_path / "f.csv"
    floats.write_text("text,label\na,0.0\nb,1.0\nc,1\n")
    loaded = load_examples(floats, load_task_file(task))
    assert [loaded.task.label_index(e["label"]) for e in loaded] == [0, 1, 1]
    padded = tmp_path / "p.csv"
    padded.write_text("text,label\na,01\n")
    with pytest.raises(DataError, match=r"p.csv: row 1: label '01' is not one of \(0, 1\)"):
        load_examples(padded, load_task_file(task))
    words = tmp_path / "na.toml"  # a class named NA is a label like any other, not a missing value
    words.write_text('name = "na"\ntemplate = "Q: {text}"\nlabels = { yes = " yes", no = " no", NA = " unsure" }\n')
    na = tmp_path / "na.csv"
    na.write_text("text,label\nIs it?,yes\nMaybe,NA\n")
    assert [e["label"] for e in load_examples(na, load_task_file(words), require_labels=True)] == ["yes", "NA"]


def test_a_repeated_csv_column_name_is_refused(tmp_path, reviews):
    path = tmp_path / "dup.csv"
    path.write_text("text,text,stars\nA,B,positive\n")
    with pytest.raises(DataError, match=r"dup.csv: the header names column 'text' 2 times; give each column its own"):
        load_examples(path, reviews)


def test_a_file_rewritten_with_its_old_modification_time_is_read_again(tmp_path, reviews):
    """The datasets cache keys on path and mtime; anchorlens' copy keys on the content (cp -p, rsync -a, tar x)."""
    import os

    path = tmp_path / "edit.csv"
    path.write_text("text,stars\nAAAA,positive\nBBBB,negative\n")
    first = load_examples(path, reviews)
    stat = path.stat()
    path.write_text("text,stars\nZZZZ,negative\nEEEE,positive\nFFFF,negative\n")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    second = load_examples(path, reviews)
    assert [e["text"] for e in first] == ["AAAA", "BBBB"]
    assert [e["text"] for e in second] == ["ZZZZ", "EEEE", "FFFF"]
    assert first.digest() != second.digest()


def test_text_documents_keep_their_own_ids(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"idx": "doc-a", "text": "Hello world."}\n{"idx": 7, "text": "Second."}\n{"text": "Third."}\n')
    from anchorlens.models.tiny_tokenizers import tiny_tokenizer
    from anchorlens.tasks.windows import Windows

    windows = Windows(load_examples(path, "text"), tiny_tokenizer("llama"), max_length=64)
    assert [w["document"] for w in windows] == ["doc-a", 7, 2]  # a text id as written, not int("doc-a")


def test_a_nan_in_a_number_label_column_is_a_missing_label_at_its_own_row(tmp_path):
    import pandas as pd

    task = tmp_path / "ints.toml"
    task.write_text('name = "ints"\ntemplate = "Q: {text}"\nlabels = [ { value = 0, verbalizer = " no" }, { value = 1, verbalizer = " yes" } ]\n')  # fmt: skip
    path = tmp_path / "nan.parquet"
    pd.DataFrame({"text": ["a", "b", "c"], "label": [0.0, float("nan"), 1.0]}).to_parquet(path)
    loaded = load_examples(path, load_task_file(task))
    assert [(e["label"], e["labelled"]) for e in loaded] == [(0.0, True), (None, False), (1.0, True)]
    with pytest.raises(DataError, match=r"nan.parquet: row 2: missing field 'label'"):
        load_examples(path, load_task_file(task), require_labels=True)


def test_a_parquet_file_with_a_repeated_column_name_says_so(tmp_path, reviews):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "dup.parquet"
    pq.write_table(pa.table([pa.array(["x"]), pa.array(["y"]), pa.array(["positive"])], names=["text", "text", "stars"]), path)  # fmt: skip
    with pytest.raises(DataError, match=r"dup.parquet: column 'text' appears 2 times; give each column its own name"):
        load_examples(path, reviews)


def test_a_json_array_names_rows_not_lines(tmp_path, reviews):
    path = tmp_path / "arr.json"
    path.write_text('[{"text": "hello", "stars": "positive"}, {"text": "bye", "stars": "neutral"}]')
    with pytest.raises(DataError, match=r"arr.json: row 2: label 'neutral' is not one of"):
        load_examples(path, reviews)
    lines = tmp_path / "lines.json"  # JSON lines named .json: lines still
    lines.write_text('{"text": "hello", "stars": "positive"}\n{"text": "bye", "stars": "neutral"}\n')
    with pytest.raises(DataError, match=r"lines.json:2: label 'neutral' is not one of"):
        load_examples(lines, reviews)
