"""Prompts: few-shot demonstrations (demo / demo_label roles, deterministic, never the query itself), plain-text
windows with token-rule roles, and lm-evaluation-harness YAML tasks."""

from __future__ import annotations

import pytest

from anchorlens.errors import DataError, UsageError
from anchorlens.models.tiny_tokenizers import tiny_tokenizer
from anchorlens.roles import encode
from anchorlens.tasks import bundled_examples, get_task
from anchorlens.tasks.prompts import PromptOptions, build_prompts
from anchorlens.tasks.windows import Windows


def _names(enc, row: int = 0) -> list[str]:
    valid = enc.attention_mask[row].bool().tolist()
    return [enc.role_table.names[r] for r, v in zip(enc.roles[row].tolist(), valid) if v]


def test_demonstrations_get_demo_and_demo_label_roles():
    task, tok = get_task("rte"), tiny_tokenizer("llama")
    examples = list(bundled_examples("rte"))
    prompts = build_prompts(task, tok, PromptOptions(shots=2, seed=3), queries=examples)
    assert prompts.roles.extra == ("demo", "demo_label")
    query = examples[5]
    rendered = prompts.render(query)
    demos = prompts.demos.draw(query)
    assert len(demos) == 2 and all(d["idx"] != query["idx"] for d in demos)
    assert demos == prompts.demos.draw(dict(query))  # the same demonstrations in every run, rank and shard
    assert (
        rendered.text
        == "".join(task.template.render(d).text + task.verbalizer(d["label"]) + "\n\n" for d in demos)
        + task.template.render(query).text
    )
    spans = [(rendered.text[s.start : s.end], s.role) for s in rendered.spans]
    assert [t for t, r in spans if r == "demo_label"] == [task.verbalizer(d["label"]) for d in demos]
    assert {r for t, r in spans[:-5]} <= {"demo", "demo_label"} and spans[-1] == ("\nanswer:", "structural")
    names = _names(encode([rendered], tok, scheme=prompts.scheme))
    assert names[0] == "special" and names.count("demo_label") >= 2 and "content" in names
    # the query's own tokens come after every demonstration token
    last_demo = max(i for i, n in enumerate(names) if n in ("demo", "demo_label"))
    assert all(n in ("structural", "content") for n in names[last_demo + 1 :])


def test_other_seeds_draw_other_demonstrations_and_too_many_shots_fail():
    task, tok = get_task("rte"), tiny_tokenizer("llama")
    examples = list(bundled_examples("rte"))
    draws = {
        tuple(
            d["idx"]
            for d in build_prompts(task, tok, PromptOptions(shots=3, seed=s), queries=examples).demos.draw(examples[0])
        )
        for s in range(6)
    }
    assert len(draws) > 1
    with pytest.raises(DataError, match=r"--shots 30 needs 30 labelled demonstrations but the file holds 23 besides"):
        build_prompts(task, tok, PromptOptions(shots=30), queries=examples)
    with pytest.raises(UsageError, match="--system needs --chat"):
        build_prompts(task, tok, PromptOptions(system="be brief"))
    with pytest.raises(UsageError, match="--shots needs a task with labels"):
        build_prompts(get_task("text"), tok, PromptOptions(shots=1))


class _CountingTokenizer:
    """A tokenizer that records the longest text it was given in one call."""

    def __init__(self, tok) -> None:
        self.tok, self.longest = tok, 0

    def __call__(self, text, **kwargs):
        self.longest = max(self.longest, *(len(t) for t in ([text] if isinstance(text, str) else text)))
        return self.tok(text, **kwargs)


class _CountingDocuments(list):
    """Documents that count how often one is read."""

    reads = 0

    def __getitem__(self, i):
        self.reads += 1
        return super().__getitem__(i)


def test_a_document_on_one_long_line_is_tokenized_in_pieces_and_read_once():
    """Issue 41: ``--task text`` on a 50 MB file without a newline tokenized the line in one call (73 s and 9 GB
    for tiny-llama) and read the whole document again for every window. The tokenizer now sees at most PIECE
    characters at once, the windows are the ones the whole text gives (the same tokens, tiling the text) and
    iterating over them reads the document once."""
    from anchorlens.tasks import windows as windows_module

    tok = tiny_tokenizer("llama")
    text = "The cat sat on the mat. A dog ran, then it sang! " * 5000  # 250,000 characters, one line
    spy = _CountingTokenizer(tok)
    docs = _CountingDocuments([{"text": text, "idx": "doc-a"}])
    windows = Windows(docs, spy, max_length=64)
    assert spy.longest <= windows_module.PIECE < len(text)
    whole = tok(text, add_special_tokens=False)["input_ids"]
    assert len(windows) == -(-len(whole) // windows.per_window)
    assert sum(int(n) for n in windows._spans[:, 4]) == len(whole)
    docs.reads = 0
    got = list(windows)
    assert docs.reads == 1 and "".join(w["text"] for w in got) == text
    assert {w["document"] for w in got} == {"doc-a"} and [w["window"] for w in got] == list(range(len(got)))


def test_text_windows_cover_documents_and_roles_come_from_rules():
    tok = tiny_tokenizer("llama")
    docs = [
        {"text": "The cat sat. The dog ran!\nA bird flew, then it sang.\n" * 6, "idx": 0},
        {"text": "Short one.", "idx": 1},
    ]
    windows = Windows(docs, tok, max_length=16)
    assert windows.per_window == 15  # one BOS per window
    whole = tok(docs[0]["text"], add_special_tokens=False)["input_ids"]
    first = [w for w in windows if w["document"] == 0]
    assert len(first) == -(-len(whole) // 15) and "".join(w["text"] for w in first) == docs[0]["text"]
    assert windows[len(windows) - 1] == {
        "text": "Short one.", "idx": len(windows) - 1, "document": 1, "window": 0,
        "tokens": len(tok("Short one.", add_special_tokens=False)["input_ids"]), "label": None, "labelled": False,
    }  # fmt: skip
    prompts = build_prompts(get_task("text"), tok)
    assert prompts.roles.extra == ("newline", "punct")
    rendered = [prompts.render(w) for w in first[:2]]
    enc = encode(rendered, tok, scheme=prompts.scheme, max_length=16)
    assert enc.input_ids.shape[1] <= 16
    for row in range(2):
        valid = enc.attention_mask[row].bool().tolist()
        for token, role, v in zip(enc.tokens[row], enc.roles[row].tolist(), valid):
            if not v:
                continue
            text = tok.convert_tokens_to_string([token])
            name = enc.role_table.names[role]
            if token == "<s>":
                assert name == "special"
            elif "\n" in text and not text.strip():
                assert name == "newline", repr(text)
            elif text.strip() and all(not c.isalnum() and not c.isspace() for c in text.strip()):
                assert name == "punct", repr(text)
            else:
                assert name == "content", repr(text)


HARNESS_BOOLQ = """\
task: boolq_yesno
dataset_path: super_glue
dataset_name: boolq
output_type: multiple_choice
training_split: train
validation_split: validation
doc_to_text: "{{passage}}\\nQuestion: {{question}}?\\nAnswer:"
doc_to_target: label
doc_to_choice: ["no", "yes"]
should_decontaminate: true
doc_to_decontamination_query: passage
metric_list:
  - metric: acc
metadata:
  version: 2.0
"""
HARNESS_MC_BASE = """\
dataset_path: cais/mmlu
test_split: test
fewshot_split: dev
output_type: multiple_choice
doc_to_text: "{{question.strip()}}\\nA. {{choices[0]}}\\nB. {{choices[1]}}\\nC. {{choices[2]}}\\nD. {{choices[3]}}\\nAnswer:"
doc_to_choice: ["A", "B", "C", "D"]
doc_to_target: answer
"""
HARNESS_MC = """\
"dataset_name": "astronomy"
"description": "The following are multiple choice questions (with answers) about astronomy.\\n\\n"
"include": "_default.yaml"
"task": "mmlu_astronomy"
"""


def test_harness_yes_no_task(tmp_path):
    path = tmp_path / "boolq.yaml"
    path.write_text(HARNESS_BOOLQ)
    task = get_task(str(path))
    assert (task.name, task.fields, task.labels, task.verbalizers) == (
        "boolq_yesno",
        ("passage", "question"),
        (0, 1),
        (" no", " yes"),
    )
    assert task.data == "hf:super_glue:boolq@validation" and task.fewshot_data == "hf:super_glue:boolq@train"
    example = {"passage": "Ice melts.", "question": "does ice melt", "label": 1}
    assert task.example_label(example) == 1 and task.verbalizer(1) == " yes"
    r = task.template.render(example)
    assert r.text == "Ice melts.\nQuestion: does ice melt?\nAnswer:"
    assert [(r.text[s.start : s.end], s.role, s.field) for s in r.spans] == [
        ("Ice melts.", "content", "passage"),
        ("\nQuestion: ", "structural", "Question:"),
        ("does ice melt", "content", "question"),
        ("?\nAnswer:", "structural", "?\nAnswer:".strip()),
    ]
    assert any("metric_list" in n for n in task.notes)


def test_harness_multiple_choice_task_with_include_and_description(tmp_path):
    (tmp_path / "_default.yaml").write_text(HARNESS_MC_BASE)
    path = tmp_path / "mmlu_astronomy.yaml"
    path.write_text(HARNESS_MC)
    task = get_task(str(path))
    assert task.verbalizers == (" A", " B", " C", " D") and task.labels == (0, 1, 2, 3)
    assert task.preamble.startswith("The following are") and task.fewshot_data == "hf:cais/mmlu:astronomy@dev"
    example = {"question": "  Which is a planet? ", "choices": ["Mars", "Sirius", "Vega", "Rigel"], "answer": 0}
    prompts = build_prompts(task, tiny_tokenizer("llama"))
    r = prompts.render(example)
    assert r.text.startswith(task.preamble + "Which is a planet?\nA. Mars\nB. Sirius")
    assert [s.field for s in r.spans if s.role == "content"] == ["question", "choices", "choices", "choices", "choices"]
    assert task.example_label({**example, "answer": 2}) == 2
    rows = [{"question": "q?", "choices": ["a", "b", "c", "d"], "answer": i % 4} for i in range(8)]
    data = tmp_path / "mmlu.jsonl"
    import json

    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from anchorlens.tasks import load_examples

    loaded = load_examples(data, task)
    assert [e["label"] for e in loaded] == [0, 1, 2, 3, 0, 1, 2, 3] and loaded[0]["choices"] == ["a", "b", "c", "d"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("task: t\ndoc_to_text: '{{x}}'\nprocess_docs: !function utils.process_docs\n", r"process_docs is `!function utils.process_docs`"),
        ("task: t\ndoc_to_text: !function utils.doc_to_text\n", r"doc_to_text is `!function"),
        ("task: t\nclass: !function x.Task\ndoc_to_text: '{{x}}'\n", r"class is `!function"),
        ("task: t\ndoc_to_text: 'no fields here'\n", r"doc_to_text reads no field"),
        ("doc_to_text: '{{x}}'\n", r"missing key 'task'"),
        ("task: t\ndoc_to_text: '{{x'\n", r"Jinja syntax error"),
        ("task: [unclosed\n", r"not valid YAML"),
        ("task: t\ndoc_to_text: '{{x}}'\ninclude: nope.yaml\n", r"include nope.yaml: no such file"),
        ("task: t\ndoc_to_text: '{{x}}'\ndoc_to_choice: [a, b]\ndoc_to_targt: y\n", r"unknown key 'doc_to_targt'; did you mean 'doc_to_target'\?"),
    ],
)  # fmt: skip
def test_harness_entries_anchorlens_cannot_read_are_refused_in_one_line(tmp_path, text, message):
    path = tmp_path / "task.yaml"
    path.write_text(text)
    with pytest.raises(DataError, match=message) as info:
        get_task(str(path))
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_a_query_is_never_shown_with_its_own_answer_whatever_the_demonstrations_file():
    task, tok = get_task("rte"), tiny_tokenizer("llama")
    examples = [dict(e) for e in bundled_examples("rte")][:6]
    shown = lambda e: (e["premise"], e["hypothesis"])  # noqa: E731
    # the same rows passed again as --shots-from (another list, other idx): the query's copy is never drawn
    copies = [{**e, "idx": 100 + i} for i, e in enumerate(examples)]
    prompts = build_prompts(task, tok, PromptOptions(shots=5), queries=examples, pool=copies, pool_source="copy")
    for query in examples:
        drawn = prompts.demos.draw(query)
        assert len(drawn) == 5 and shown(query) not in {shown(d) for d in drawn}
    # every row with the same idx: rows are told apart by what they show, so each still gets its demonstrations
    same_idx = [{**e, "idx": 0} for e in examples]
    prompts = build_prompts(task, tok, PromptOptions(shots=3), queries=same_idx)
    for query in same_idx:
        drawn = prompts.demos.draw(query)
        assert len(drawn) == 3 and shown(query) not in {shown(d) for d in drawn}
    # a pool of copies of the query alone cannot give a demonstration: one line, not a prompt without them
    lonely = build_prompts(task, tok, PromptOptions(shots=1), queries=examples, pool=[examples[0]] * 3, pool_source="p")
    with pytest.raises(DataError, match=r"p: --shots 1 but only 0 demonstration\(s\) differ from the query"):
        lonely.demos.draw(examples[0])
    assert lonely.demos.draw(examples[1]) == [examples[0]]


@pytest.mark.parametrize(("role", "options"), [("demo", PromptOptions(shots=1)), ("system", PromptOptions(chat=True))])
def test_a_task_role_named_like_a_role_the_options_add_is_refused(tmp_path, role, options):
    from anchorlens.tasks.prompts import role_scheme

    path = tmp_path / "t.toml"
    path.write_text(
        f'name = "t"\ntemplate = "Review: {{text:{role}}}\\nSentiment:"\nlabels = {{ a = " a", b = " b" }}\n'
    )
    task = get_task(str(path))
    role_scheme(task, chat=False, shots=0)  # without the option the name is the task's own
    with pytest.raises(UsageError, match=rf"task t tags its own text with role '{role}', which --"):
        role_scheme(task, chat=bool(options.chat), shots=options.shots or 0)


def test_a_task_files_system_prompt_needs_its_chat_and_names_the_file_or_the_flag(tmp_path):
    from anchorlens.tasks import load_task_file

    body = 'name = "t"\ntemplate = "Review: {text}"\nlabels = { a = " a", b = " b" }\nsystem = "Be brief."\n'
    path = tmp_path / "t.toml"
    path.write_text(body)
    with pytest.raises(DataError, match=r"t.toml: system needs chat = true"):
        load_task_file(path)
    path.write_text(body + "chat = true\n")
    task = load_task_file(path)
    assert PromptOptions().resolved(task).system == "Be brief."
    with pytest.raises(UsageError, match=r"task t sets a system prompt, which needs the chat template; drop --no-chat"):
        PromptOptions(chat=False).resolved(task)


def test_two_labels_with_one_verbalizer_are_refused_when_the_task_is_read(tmp_path):
    from anchorlens.tasks import load_task_file

    path = tmp_path / "v.toml"
    path.write_text('name = "v"\ntemplate = "Q: {text}"\nlabels = { yes = " yes", no = " yes" }\n')
    with pytest.raises(DataError, match=r"v.toml: task v: labels yes and no share the verbalizer ' yes'"):
        load_task_file(path)
