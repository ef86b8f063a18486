"""lm-evaluation-harness tasks scored as the harness scores them: choices per document, targets given as choice
text, Jinja rendered as the harness renders it ({% set %}, quoted lists of Jinja), and a bounded sandbox."""

from __future__ import annotations

import json

import pytest
import torch

from anchorlens.errors import DataError
from anchorlens.evaluation import predict, task_metrics
from anchorlens.evaluation.rows import split_rows, strip_trailing_specials
from anchorlens.roles.templates import TemplateError
from anchorlens.tasks import get_task, load_examples

RTE_T5 = """group:
  - super-glue-t5-prompt
task: super_glue-rte-t5-prompt
dataset_path: super_glue
dataset_name: rte
training_split: train
validation_split: validation
output_type: generate_until
doc_to_text: "rte hypothesis: {{hypothesis}} premise: {{premise}}"
doc_to_target: label
doc_to_choice: ['entailment', 'not_entailment']
generation_kwargs:
  until:
    - "</s>"
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: true
metadata:
  version: 0.0
"""

MULTIRC_T5 = """group:
  - super-glue-t5-prompt
task: super_glue-multirc-t5-prompt
dataset_path: super_glue
dataset_name: multirc
training_split: train
validation_split: validation
output_type: generate_until
doc_to_text: "multirc question: {{question}} answer: {{answer}} paragraph: {{paragraph}}"
doc_to_target: label
doc_to_choice: "{% set group_id = idx.question|string %}{{[group_id+'_False', group_id+'_True']}}"
generation_kwargs:
  until:
    - "</s>"
metric_list:
  - metric: exact_match
metadata:
  version: 0.0
"""

MULTIRC = """task: multirc
dataset_path: super_glue
dataset_name: multirc
output_type: multiple_choice
training_split: train
validation_split: validation
doc_to_text: "{{paragraph}}\\nQuestion: {{question}}\\nAnswer:"
doc_to_target: label
doc_to_choice: "['''{{answer}}\\\\nIs the answer correct? yes''', '''{{answer}}\\\\nIs the answer correct? no''']"
metric_list:
  - metric: acc
metadata:
  version: 2.0
"""

TRUTHFULQA_MC1 = """tag:
  - truthfulqa
task: truthfulqa_mc1
dataset_path: truthful_qa
dataset_name: multiple_choice
output_type: multiple_choice
training_split: null
validation_split: validation
test_split: null
num_fewshot: 0
doc_to_text: "{% set prompt_qa = 'Q: What is human life expectancy in the United States?\\nA: Human life expectancy in the United States is 78 years.'%}{{prompt_qa + '\\n\\nQ: ' + question + '\\nA:'}}"
doc_to_target: 0
doc_to_choice: "{{mc1_targets.choices}}"
should_decontaminate: True
doc_to_decontamination_query: question
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 2.0
"""

PIQA = """task: piqa
dataset_path: baber/piqa
dataset_name: null
output_type: multiple_choice
training_split: train
validation_split: validation
test_split: null
doc_to_text: "Question: {{goal}}\\nAnswer:"
doc_to_target: label
doc_to_choice: "{{[sol1, sol2]}}"
should_decontaminate: true
doc_to_decontamination_query: goal
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

ARC_EASY = """tag:
  - ai2_arc
task: arc_easy
dataset_path: allenai/ai2_arc
dataset_name: ARC-Easy
output_type: multiple_choice
training_split: train
validation_split: validation
test_split: test
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_target: "{{choices.label.index(answerKey)}}"
doc_to_choice: "{{choices.text}}"
should_decontaminate: true
doc_to_decontamination_query: "Question: {{question}}\\nAnswer:"
metric_list:
  - metric: acc
  - metric: acc_norm
metadata:
  version: 1.0
"""

SCIQ = """task: sciq
dataset_path: sciq
dataset_name: null
output_type: multiple_choice
training_split: train
validation_split: validation
test_split: test
doc_to_text: "{{support.lstrip()}}\\nQuestion: {{question}}\\nAnswer:"
doc_to_target: 3
doc_to_choice: "{{[distractor1, distractor2, distractor3, correct_answer]}}"
should_decontaminate: true
doc_to_decontamination_query: "{{support}} {{question}}"
metric_list:
  - metric: acc
  - metric: acc_norm
metadata:
  version: 1.0
"""


def _task(tmp_path, text, name="task.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return get_task(str(path))


def _data(tmp_path, rows, task):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_examples(path, task, require_labels=True)


def reference_loglik(base, task, example, answer: str) -> float:
    """log p(answer | prompt) summed over the answer's tokens, from the HF model on prompt + answer token ids."""
    enc = base.encode([task.template.render(example)])
    prompt = strip_trailing_specials(split_rows(enc)[0]).ids
    cont = base.tokenizer(answer, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = base.model(input_ids=torch.tensor([prompt + cont])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    return sum(float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(cont))


RTE_ROWS = [
    {"premise": f"The cat number {i} sat on the mat.", "hypothesis": f"A cat {i} sat.", "label": i % 2, "idx": i}
    for i in range(8)
]


def test_rte_t5_prompt_is_ranked_by_the_whole_choice(tmp_path, tiny_base):
    base = tiny_base("tiny-llama")
    task = _task(tmp_path, RTE_T5)
    examples = _data(tmp_path, RTE_ROWS, task)
    df = predict(base, examples, task, batch_size=3)
    correct, correct_norm = [], []
    for b, ex in enumerate(examples):
        ll = [reference_loglik(base, task, ex, " " + c) for c in ("entailment", "not_entailment")]
        assert [df.loc[b, "score_0"], df.loc[b, "score_1"]] == pytest.approx(ll, abs=1e-5)
        correct.append(int(torch.tensor(ll).argmax()) == ex["label"])
        norm = [ll[0] / len("entailment"), ll[1] / len("not_entailment")]  # the harness: the choice without " "
        correct_norm.append(int(torch.tensor(norm).argmax()) == ex["label"])
    metrics = task_metrics(df, task, n_boot=20)
    assert metrics["accuracy"] == pytest.approx(sum(correct) / len(correct))
    assert metrics["acc_norm"] == pytest.approx(sum(correct_norm) / len(correct_norm))


@pytest.mark.parametrize(
    ("text", "rows", "choices"),
    [
        (PIQA, [{"goal": "open a jar", "sol1": "twist the lid", "sol2": "eat the lid", "label": 0}], ["twist the lid", "eat the lid"]),
        (ARC_EASY, [{"question": "Which is hot?", "choices": {"text": ["ice", "fire", "snow"], "label": ["A", "B", "C"]}, "answerKey": "B"}], ["ice", "fire", "snow"]),
        (SCIQ, [{"support": " Water boils.", "question": "What boils?", "distractor1": "rock", "distractor2": "iron", "distractor3": "sand", "correct_answer": "water"}], ["rock", "iron", "sand", "water"]),
    ],
)  # fmt: skip
def test_choices_per_document_evaluate(tmp_path, tiny_base, text, rows, choices):
    base = tiny_base("tiny-llama")
    task = _task(tmp_path, text)
    assert task.has_labels
    examples = _data(tmp_path, rows * 2 + [{**rows[0]}], task)
    label = examples[0]["label"]
    assert label == {"piqa": 0, "arc_easy": 1, "sciq": 3}[task.name]
    df = predict(base, examples, task, batch_size=2)
    ll = [reference_loglik(base, task, examples[0], " " + c) for c in choices]
    assert [df.loc[0, f"score_{i}"] for i in range(len(choices))] == pytest.approx(ll, abs=1e-5)
    assert df.loc[0, "pred"] == int(torch.tensor(ll).argmax())
    assert df.loc[0, "correct"] == (df.loc[0, "pred"] == label)
    metrics = task_metrics(df, task, n_boot=20)
    assert metrics["n"] == 3 and metrics["label_nll"] == pytest.approx(-ll[label], abs=1e-5)


def test_choices_per_document_of_different_counts_share_a_batch(tmp_path, tiny_base):
    base = tiny_base("tiny-llama")
    task = _task(tmp_path, ARC_EASY)
    rows = [
        {"question": "Which is hot?", "choices": {"text": ["ice", "fire"], "label": ["A", "B"]}, "answerKey": "B"},
        {"question": "Which is wet?", "choices": {"text": ["sun", "sand", "rain", "dust"], "label": list("ABCD")}, "answerKey": "C"},
    ]  # fmt: skip
    examples = _data(tmp_path, rows, task)
    together = predict(base, examples, task, batch_size=2)
    alone = [predict(base, [ex], task, batch_size=1) for ex in examples]
    assert pd_isna(together.loc[0, "score_2"]) and together.loc[1, "label"] == 2
    for b, one in enumerate(alone):
        cols = [c for c in one if c.startswith("score_")]
        assert together.loc[b, cols].tolist() == pytest.approx(one.loc[0, cols].tolist(), abs=1e-5)


def pd_isna(value) -> bool:
    import pandas as pd

    return bool(pd.isna(value))


def test_a_target_equal_to_a_choice_text_is_that_choice(tmp_path):
    text = "task: t\ndoc_to_text: '{{q}}'\ndoc_to_choice: ['1', '0']\ndoc_to_target: '{{answer}}'\n"
    task = _task(tmp_path, text)
    assert task.example_label({"q": "x", "answer": "1"}) == 0  # the text "1" is choice 0, not the index 1
    assert task.example_label({"q": "x", "answer": "0"}) == 1
    per_doc = "task: t\ndoc_to_text: '{{q}}'\ndoc_to_choice: '{{opts}}'\ndoc_to_target: '{{answer}}'\n"
    task = _task(tmp_path, per_doc, "per_doc.yaml")
    assert task.example_label({"q": "x", "opts": ["2", "1"], "answer": "1"}) == 1
    assert task.example_label({"q": "x", "opts": ["2", "1"], "answer": "2"}) == 0
    assert task.example_label({"q": "x", "opts": ["a", "b"], "answer": 1}) == 1
    with pytest.raises(ValueError, match="not a choice index or one of the choices"):
        task.example_label({"q": "x", "opts": ["a", "b"], "answer": "c"})


def test_set_variables_are_not_data_fields(tmp_path, tiny_base):
    task = _task(tmp_path, TRUTHFULQA_MC1)
    assert task.fields == ("question",)
    doc = {"question": "Is the sky green?", "mc1_targets": {"choices": ["No.", "Yes."], "labels": [1, 0]}}
    r = task.template.render(doc)
    assert r.text.startswith("Q: What is human life expectancy") and r.text.endswith("\n\nQ: Is the sky green?\nA:")
    examples = _data(tmp_path, [doc, {**doc, "question": "Is fire cold?"}], task)
    assert [e["label"] for e in examples] == [0, 0]
    df = predict(tiny_base("tiny-llama"), examples, task)
    assert list(df["pred"]) == [int(df.loc[b, ["score_0", "score_1"]].astype(float).argmax()) for b in range(2)]


def test_multirc_quoted_list_of_jinja_is_rendered_then_parsed(tmp_path, tiny_base):
    task = _task(tmp_path, MULTIRC)
    doc = {"paragraph": "Bob ran.", "question": "Who ran?", "answer": "Bob", "label": 1, "idx": {"question": 0}}
    assert task.example_choices(doc) == ["Bob\nIs the answer correct? yes", "Bob\nIs the answer correct? no"]
    base = tiny_base("tiny-llama")
    examples = _data(tmp_path, [doc, {**doc, "answer": "Ann", "label": 0}], task)
    df = predict(base, examples, task)
    ll = [reference_loglik(base, task, examples[1], " Ann\nIs the answer correct? " + w) for w in ("yes", "no")]
    assert [df.loc[1, "score_0"], df.loc[1, "score_1"]] == pytest.approx(ll, abs=1e-5)


def test_multirc_t5_prompt_set_in_doc_to_choice(tmp_path, tiny_base):
    task = _task(tmp_path, MULTIRC_T5)
    doc = {"paragraph": "Bob ran.", "question": "Who ran?", "answer": "Bob", "label": 1, "idx": {"paragraph": 0, "question": 7, "answer": 0}}  # fmt: skip
    assert task.example_choices(doc) == ["7_False", "7_True"]
    examples = _data(tmp_path, [doc], task)
    df = predict(tiny_base("tiny-llama"), examples, task)
    assert df.loc[0, "label"] == 1 and df.loc[0, "pred"] in (0, 1)


@pytest.mark.parametrize(
    ("key", "value", "doc", "message"),
    [
        ("doc_to_choice", "'{{ [1] * 10000000 }}'", {"q": "x"}, r"task.yaml: doc_to_choice: SecurityError: repeating"),
        ("doc_to_choice", "'{{ range(n) | list }}'", {"q": "x", "n": 10**8}, r"doc_to_choice: SecurityError: range\(\)"),
        ("doc_to_choice", "'{{ [q, 1 / n] }}'", {"q": "x", "n": 0}, r"doc_to_choice: ZeroDivisionError"),
        ("doc_to_choice", "'{{ [q, missing] }}'", {"q": "x"}, r"doc_to_choice: UndefinedError: 'missing' is undefined"),
        ("doc_to_choice", "'{{ q.__class__ }}'", {"q": "x"}, r"doc_to_choice: SecurityError: access to attribute"),
        ("doc_to_choice", "'{{ [q] * n }}'", {"q": "x", "n": 10**7}, r"doc_to_choice: SecurityError: repeating"),
        ("doc_to_target", "'{{ 1 / n }}'", {"q": "x", "n": 0}, r"doc_to_target fails on this example \(ZeroDivisionError"),
        ("doc_to_target", "'{{ n ** n }}'", {"q": "x", "n": 100000}, r"doc_to_target fails on this example \(SecurityError"),
        ("doc_to_target", "'{% for i in range(n) %}{{ q }}{% endfor %}'", {"q": "x", "n": 10**5}, r"doc_to_target fails on this example \(SecurityError: range"),
    ],
)  # fmt: skip
def test_jinja_failures_are_one_line_naming_the_key(tmp_path, key, value, doc, message):
    other = "doc_to_target: 0\n" if key == "doc_to_choice" else "doc_to_choice: [a, b]\n"
    with pytest.raises(DataError, match=message) as info:  # a constant's error comes with the task, others per row
        _data(tmp_path, [doc], _task(tmp_path, f"task: t\ndoc_to_text: '{{{{q}}}}'\n{key}: {value}\n{other}"))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("'{% for i in range(20000) %}{{q}}{% endfor %}'", r"SecurityError: range\(\) of 20000 items"),
        ("'{{ q * 2000000 }}'", r"SecurityError: repeating"),
        ("'{% for i in range(9999) %}{% for j in range(9999) %}{{q}}{% endfor %}{% endfor %}'", r"SecurityError: the rendered text is over"),
        ("'{{ q }}{{ 1 / 0 }}'", r"ZeroDivisionError"),
    ],
)  # fmt: skip
def test_doc_to_text_rendering_is_bounded(tmp_path, template, message):
    task = _task(tmp_path, f"task: t\ndoc_to_text: {template}\ndoc_to_choice: [a, b]\ndoc_to_target: 0\n")
    with pytest.raises(TemplateError, match=message) as info:
        task.template.render({"q": "xx"})
    assert "\n" not in str(info.value) and str(info.value).startswith("template 't doc_to_text': ")


def test_doc_to_choice_syntax_errors_name_the_key(tmp_path):
    with pytest.raises(DataError, match=r"doc_to_choice: Jinja syntax error") as info:
        _task(tmp_path, "task: t\ndoc_to_text: '{{q}}'\ndoc_to_choice: \"{% set x %}{{[q]}}\"\n")
    assert "\n" not in str(info.value)


PIQA_ROWS = [
    {"goal": "open a jar", "sol1": "twist the lid", "sol2": "eat the lid", "label": 0},
    {"goal": "dry hair", "sol1": "use a hammer", "sol2": "use a towel", "label": 1},
    {"goal": "cut paper", "sol1": "use scissors", "sol2": "use soup", "label": 0},
    {"goal": "light a room", "sol1": "paint the wall", "sol2": "switch on a lamp", "label": 1},
]


def test_demonstrations_of_choices_per_document_show_their_own_choice(tmp_path, tiny_base):
    """piqa with --shots 2: each demonstration's answer is target_delimiter + its own document's choice at its label
    (role demo_label), as the harness writes it; evaluate scores the query on its own choices."""
    from anchorlens.errors import UsageError
    from anchorlens.tasks.prompts import PromptOptions, build_prompts

    base = tiny_base("tiny-llama")
    task = _task(tmp_path, PIQA)
    examples = _data(tmp_path, PIQA_ROWS, task)
    with pytest.raises(UsageError, match="choices vary per document"):
        task.verbalizer(0)  # a label alone has no answer text: it needs its document
    prompts = build_prompts(task, base.tokenizer, PromptOptions(shots=2, seed=3), queries=examples)
    own = {ex["goal"]: [ex["sol1"], ex["sol2"]][ex["label"]] for ex in PIQA_ROWS}
    for query in examples:
        demos = prompts.demos.draw(query)
        rendered = prompts.render(query)
        answers = [rendered.text[s.start : s.end] for s in rendered.spans if s.role == "demo_label"]
        assert answers == [" " + own[d["goal"]] for d in demos]
        expected = "".join(f"Question: {d['goal']}\nAnswer: {own[d['goal']]}\n\n" for d in demos)
        assert rendered.text == expected + f"Question: {query['goal']}\nAnswer:"
    df = predict(base, examples, task, batch_size=2, prompts=prompts)
    first = prompts.render(examples[0]).text
    enc = base.tokenizer(first)["input_ids"]
    for i, choice in enumerate(("twist the lid", "eat the lid")):
        cont = base.tokenizer(" " + choice, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = base.model(input_ids=torch.tensor([enc + cont])).logits[0].float()
        logp = torch.log_softmax(logits, -1)
        ll = sum(float(logp[len(enc) - 1 + j, t]) for j, t in enumerate(cont))
        assert df.loc[0, f"score_{i}"] == pytest.approx(ll, abs=1e-4)
