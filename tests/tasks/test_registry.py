"""Task registry: the seven SuperGLUE tasks and plain text as shipped task files, lookups, labels, bundled examples."""

from __future__ import annotations

from collections import Counter

import pytest

from anchorlens.roles import Literal, Template
from anchorlens.tasks import (
    TASKS,
    RowError,
    Task,
    bundled_examples,
    bundled_tasks,
    flatten_row,
    get_task,
)

SYNTHETIC = {
    "rte": {"premise": "P.", "hypothesis": "H."},
    "cb": {"premise": "P.", "hypothesis": "H."},
    "boolq": {"passage": "P.", "question": "is it"},
    "copa": {"premise": "P.", "question": "cause", "choice1": "A.", "choice2": "B."},
    "wic": {"word": "w", "sentence1": "S1.", "sentence2": "S2."},
    "wsc": {"text": "T.", "target": {"span1_text": "x", "span2_text": "it"}},
    "multirc": {"passage": "P.", "question": "Q?", "answer": "A"},
    "sst2": {"sentence": "a fine film ."},
}


SUPERGLUE = ("rte", "cb", "boolq", "copa", "wic", "wsc", "multirc")


def test_all_seven_superglue_tasks_sst2_and_plain_text():
    assert tuple(TASKS) == (*SUPERGLUE, "sst2", "text")
    assert TASKS["text"].kind == "text" and not TASKS["text"].has_labels and TASKS["text"].roles == ("newline", "punct")
    for name in SUPERGLUE:
        task = TASKS[name]
        assert task.source == f"builtin:{name}" and len(task.digest) == 64
        assert task.name == name and task.description
        assert set(task.template.fields) == set(task.fields)
        assert len(task.labels) == len(task.verbalizers) == task.num_labels >= 2
        assert all(v.startswith(" ") and v.strip() for v in task.verbalizers)
        assert len(set(task.verbalizers)) == task.num_labels


def test_labels_verbalizers_and_metrics():
    assert get_task("rte").labels == ("entailment", "not_entailment")
    assert get_task("rte").verbalizers == (" yes", " no")
    assert get_task("cb").labels == ("entailment", "contradiction", "neutral")
    assert get_task("cb").metrics == ("accuracy", "macro_f1")
    assert get_task("boolq").labels == (True, False)
    assert get_task("copa").labels == (0, 1)
    assert (
        get_task("multirc").metrics == ("f1a", "em")
        and get_task("multirc").group_field == "group"
        and get_task("multirc").group_fields == ("passage_idx", "group")
    )
    assert get_task("rte").metrics == ("accuracy",)
    sst2 = get_task("sst2")  # GLUE SST-2's 0/1 labels; "Review:" and "Sentiment:" are structural words
    assert sst2.labels == (0, 1) and sst2.verbalizers == (" negative", " positive") and sst2.fields == ("sentence",)
    assert sst2.template.spec == "Review: {sentence}\nSentiment:"


def test_get_task_is_case_insensitive_and_lists_known_names():
    assert get_task("RTE") is get_task(" Rte ") is TASKS["rte"]
    assert get_task(TASKS["cb"]) is TASKS["cb"]
    with pytest.raises(ValueError) as info:
        get_task("mnli")
    assert "'mnli'" in str(info.value)
    for name in TASKS:
        assert name in str(info.value)


def test_label_index_is_type_strict():
    assert get_task("rte").label_index("not_entailment") == 1
    assert get_task("boolq").label_index(True) == 0 and get_task("boolq").label_index(False) == 1
    assert get_task("copa").label_index(1) == 1
    assert get_task("cb").verbalizer("neutral") == " maybe"
    with pytest.raises(ValueError, match="for task copa"):
        get_task("copa").label_index(True)
    with pytest.raises(ValueError):
        get_task("boolq").label_index(1)
    with pytest.raises(ValueError):
        get_task("rte").label_index("contradiction")


def test_templates_use_field_names_as_structural_words():
    assert get_task("rte").template.spec == "premise: {premise}\nhypothesis: {hypothesis}\nanswer:"
    for name, task in TASKS.items():
        if name == "text":
            continue
        r = task.template.render(SYNTHETIC[name])
        assert r.text.rstrip().endswith(":")
        structural = [s.field for s in r.spans if s.role == "structural"]
        assert structural[0].endswith(":")
        content = [s.field for s in r.spans if s.role == "content"]
        assert content == list(task.template.fields)
    names = [seg.name for seg in TASKS["copa"].template.segments if isinstance(seg, Literal)]
    assert names == ["premise:", "question:", "choice1:", "choice2:", "answer:"]


def test_task_checks_its_definition():
    tpl = Template.parse("x: {x}\nanswer:")
    with pytest.raises(ValueError, match="verbalizers"):
        Task("t", "d", ("x",), tpl, labels=(0, 1), verbalizers=(" a",))
    with pytest.raises(ValueError, match="undeclared"):
        Task("t", "d", (), tpl, labels=(0, 1), verbalizers=(" a", " b"))


def test_flatten_row_uses_dotted_keys():
    row = {"text": "t", "target": {"span1_text": "a", "span2_index": 3}, "idx": 1}
    assert flatten_row(row) == {"text": "t", "target.span1_text": "a", "target.span2_index": 3, "idx": 1}


def test_expand_multirc_one_example_per_answer():
    row = {
        "idx": 4,
        "passage": {
            "text": "Some passage.",
            "questions": [
                {
                    "question": "Q1?",
                    "idx": 10,
                    "answers": [{"text": "a", "idx": 100, "label": 1}, {"text": "b", "idx": 101, "label": 0}],
                },
                {"question": "Q2?", "idx": 11, "answers": [{"text": "c", "idx": 102}]},
            ],
        },
    }
    expand_multirc = TASKS["multirc"].expand  # declared in multirc.toml's [explode], not written in code
    out = expand_multirc(row)
    assert [(e["question"], e["answer"], e["idx"], e["group"], e.get("label")) for e in out] == [
        ("Q1?", "a", 100, 10, 1),
        ("Q1?", "b", 101, 10, 0),
        ("Q2?", "c", 102, 11, None),
    ]
    assert all(e["passage"] == "Some passage." and e["passage_idx"] == 4 for e in out)
    flat = {"passage": "p", "question": "q", "answer": "a", "label": 1}
    assert expand_multirc(flat) == [flat]
    with pytest.raises(RowError, match="'passage.questions'"):
        expand_multirc({"passage": {"text": "p"}})
    with pytest.raises(RowError, match=r"'passage.questions\[\].answers\[\].text'"):
        expand_multirc({"passage": {"text": "p", "questions": [{"question": "q", "answers": [{"idx": 1}]}]}})
    missing_ids = {
        "passage": {"text": "p", "questions": [{"question": "q", "answers": [{"text": "a"}, {"text": "b"}]}]}
    }
    assert [(e["idx"], e["group"], e["passage_idx"]) for e in expand_multirc(missing_ids)] == [
        (0, 0, None),
        (1, 0, None),
    ]


def test_bundled_examples_are_balanced_short_and_labelled():
    assert bundled_tasks() == ("boolq", "cb", "copa", "rte", "sst2")
    for name in bundled_tasks():
        task = get_task(name)
        rows = bundled_examples(name)
        assert len(rows) >= 20
        assert all(r["labelled"] for r in rows)
        counts = Counter(task.label_index(r["label"]) for r in rows)
        assert sorted(counts) == list(range(task.num_labels))
        assert len(set(counts.values())) == 1, counts  # balanced
        assert len({r["idx"] for r in rows}) == len(rows)
        for r in rows:
            assert all(isinstance(r[f], str) and r[f].strip() for f in task.fields)
            assert len(r[task.fields[0]].split()) <= 40
            task.template.render(r)
    assert len(bundled_examples("rte", limit=5)) == 5
    with pytest.raises(ValueError, match="no bundled examples"):
        bundled_examples("wic")
