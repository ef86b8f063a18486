"""load_examples(): SuperGLUE/FewGLUE jsonl reading and one-line errors naming file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from anchorlens.errors import PathError
from anchorlens.tasks import DataError, count_unlabelled, get_task, load_examples

FEWGLUE = {
    "rte": "RTE",
    "cb": "CB",
    "boolq": "BoolQ",
    "copa": "COPA",
    "wic": "WiC",
    "wsc": "WSC",
    "multirc": "MultiRC",
}


def _write(tmp_path: Path, lines: list[str], name: str = "data.jsonl") -> Path:
    """Write raw lines to a jsonl file."""
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _row(**kw) -> str:
    """One RTE row as a JSON line."""
    base = {"premise": "P.", "hypothesis": "H.", "label": "entailment"}
    base.update(kw)
    return json.dumps(base)


def _error(path: Path, task: str = "rte", **kw) -> str:
    """The message of the DataError (PathError when the file cannot be read) raised by loading ``path``."""
    with pytest.raises((DataError, PathError)) as info:
        load_examples(path, task, **kw)
    assert isinstance(info.value, ValueError)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_loads_rows_with_labels_and_default_idx(tmp_path):
    path = _write(tmp_path, [_row(idx=5), "", _row(label="not_entailment")])
    rows = load_examples(path, "RTE")
    assert [(r["idx"], r["label"], r["labelled"]) for r in rows] == [
        (5, "entailment", True),
        (1, "not_entailment", True),
    ]
    assert load_examples(path, get_task("rte"), limit=1) == rows[:1]


def test_malformed_json_names_file_and_line(tmp_path):
    path = _write(tmp_path, [_row(), "", '{"premise": "P.",'])
    msg = _error(path)
    assert msg.startswith(f"{path}:3: not valid JSON (")


def test_a_deeply_nested_row_is_one_line_naming_file_and_line(tmp_path):
    deep = '{"premise": "P.", "hypothesis": "H.", "label": "entailment", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    path = _write(tmp_path, [_row(), deep])
    assert _error(path) == f"{path}:2: nested deeper than 500 levels; flatten the row"
    text = "[{" * 600 + ' \\" [['  # brackets in a string (an escaped quote among them) are text, not nesting
    row = json.dumps({"premise": text, "hypothesis": "H.", "label": "entailment"})
    rows = load_examples(_write(tmp_path, [_row(), row]), "RTE")
    assert rows[1]["premise"] == text


def test_row_that_is_not_an_object(tmp_path):
    path = _write(tmp_path, [_row(), "[1, 2]"])
    assert _error(path) == f"{path}:2: expected a JSON object, got list"


def test_missing_field(tmp_path):
    path = _write(tmp_path, [_row(), _row(), json.dumps({"premise": "P.", "label": "entailment"})])
    assert _error(path) == f"{path}:3: missing field 'hypothesis' for task rte; fill it in or drop the row"


def test_label_not_in_task_labels(tmp_path):
    path = _write(tmp_path, [_row(label="maybe")])
    assert _error(path) == (
        f"{path}:1: label 'maybe' is not one of ('entailment', 'not_entailment') for task rte; correct the row's label "
        "(or drop the row)"
    )
    copa = _write(
        tmp_path,
        [json.dumps({"premise": "p", "choice1": "a", "choice2": "b", "question": "cause", "label": True})],
        "copa.jsonl",
    )
    assert (
        _error(copa, "copa")
        == f"{copa}:1: label True is not one of (0, 1) for task copa; correct the row's label (or drop the row)"
    )


def test_empty_and_missing_files(tmp_path):
    empty = _write(tmp_path, ["", "  "])
    assert _error(empty) == f"{empty}: no examples (the file is empty)"
    missing = tmp_path / "nope.jsonl"
    assert _error(missing) == f"cannot read --data {missing}: no such file or directory"


def test_unreadable_paths_are_one_line_naming_the_path(tmp_path):
    """A directory, or a path under a regular file (what root sees instead of 'permission denied')."""
    assert _error(tmp_path).startswith(
        f"cannot read --data {tmp_path}: is a directory, not a dataset written by datasets.save_to_disk"
    )
    under_file = _write(tmp_path, [_row()]) / "x.jsonl"
    assert _error(under_file) == f"cannot read --data {under_file}: a parent is a file, not a directory"


def test_invalid_utf8_names_file_line_byte_and_column(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(_row().encode() + b"\n" + '{"premise": "caf\u00e9", "hypothesis": "H."}'.encode("latin-1") + b"\n")
    assert _error(path) == f"{path}:2: not UTF-8 (byte 0xe9 at column 17); re-encode the file as UTF-8"


def test_utf8_bom_is_accepted(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + _row().encode() + b"\n")
    assert load_examples(path, "rte")[0]["premise"] == "P."


@pytest.mark.parametrize("value, kind", [(["a", "b"], "a list"), ({"a": 1}, "an object"), (True, "a boolean")])
def test_list_or_object_as_text_field_is_refused(tmp_path, value, kind):
    path = _write(tmp_path, [_row(), _row(hypothesis=value)])
    assert _error(path) == f"{path}:2: field 'hypothesis' must be a string or number, got {kind}"


def test_numbers_are_text_but_nan_is_not_json(tmp_path):
    path = _write(tmp_path, [_row(premise=3, hypothesis=2.5)])
    assert load_examples(path, "rte")[0]["premise"] == 3
    nan = _write(tmp_path, ['{"premise": NaN, "hypothesis": "H."}'], "nan.jsonl")
    assert _error(nan) == f"{nan}:1: not valid JSON (NaN is not JSON)"


def test_unlabelled_rows_are_allowed_but_flagged(tmp_path):
    path = _write(tmp_path, [_row(), json.dumps({"premise": "P.", "hypothesis": "H."})])
    rows = load_examples(path, "rte")
    assert rows[1]["label"] is None and rows[1]["labelled"] is False
    assert count_unlabelled(rows) == 1
    assert _error(path, require_labels=True) == (
        f"{path}:2: missing field 'label' for task rte; evaluation and "
        "training need labelled examples (use a labelled split)"
    )


def test_nested_wsc_fields_are_flattened(tmp_path):
    row = {
        "text": "Tom hit it.",
        "target": {"span1_text": "Tom", "span2_text": "it", "span1_index": 0},
        "label": False,
        "idx": 3,
    }
    path = _write(tmp_path, [json.dumps(row)])
    (ex,) = load_examples(path, "wsc")
    assert ex["target.span1_text"] == "Tom" and ex["target.span1_index"] == 0
    assert get_task("wsc").template.render(ex).text.endswith("span2: it\nanswer:")
    bad = _write(tmp_path, [json.dumps({"text": "x", "target": {"span1_text": "x"}, "label": True})], "bad.jsonl")
    assert _error(bad, "wsc").startswith(f"{bad}:1: missing field 'target.span2_text' for task wsc")


def test_multirc_rows_flatten_to_answers(tmp_path):
    row = {
        "idx": 0,
        "passage": {
            "text": "P.",
            "questions": [
                {
                    "question": "Q1?",
                    "idx": 0,
                    "answers": [{"text": "a", "idx": 0, "label": 1}, {"text": "b", "idx": 1, "label": 0}],
                },
                {"question": "Q2?", "idx": 1, "answers": [{"text": "c", "idx": 2, "label": 2}]},
            ],
        },
    }
    path = _write(tmp_path, [json.dumps(row)])
    assert _error(path, "multirc") == (
        f"{path}:1: label 2 is not one of (0, 1) for task multirc; correct the row's label (or drop the row)"
    )
    row["passage"]["questions"][1]["answers"][0]["label"] = 0
    path = _write(tmp_path, [json.dumps(row), json.dumps({"idx": 1, "passage": {"text": "P."}})])
    assert _error(path, "multirc") == f"{path}:2: missing field 'passage.questions' for task multirc"
    path = _write(tmp_path, [json.dumps(row)])
    rows = load_examples(path, "multirc")
    assert [(r["group"], r["answer"], r["label"]) for r in rows] == [(0, "a", 1), (0, "b", 0), (1, "c", 0)]


@pytest.mark.parametrize("name", sorted(FEWGLUE))
def test_fewglue_train_files_load(shared_data, name):
    folder = shared_data / "fewglue" / FEWGLUE[name]
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent")
    task = get_task(name)
    path = folder / "train.jsonl"
    raw = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = load_examples(path, task)
    assert all(r["labelled"] for r in rows)
    for r in rows:
        task.template.render(r)
    if name == "multirc":
        questions = [q for row in raw for q in row["passage"]["questions"]]
        assert len(rows) == sum(len(q["answers"]) for q in questions) > len(raw)
        assert len({r["group"] for r in rows}) == len(questions)
        assert {r["label"] for r in rows} == {0, 1}
    else:
        assert len(rows) == len(raw)
        assert {task.label_index(r["label"]) for r in rows} <= set(range(task.num_labels))


def test_fewglue_unlabeled_copa_loads_unlabelled(shared_data):
    path = shared_data / "fewglue" / "COPA" / "unlabeled.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    rows = load_examples(path, "copa", limit=50)
    assert len(rows) == 50 and count_unlabelled(rows) == 50
