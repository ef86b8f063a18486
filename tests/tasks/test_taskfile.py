"""Task files: the schema and its one-line errors, and the built-in tasks read from their shipped files."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from anchorlens.errors import DataError
from anchorlens.roles.templates import Template
from anchorlens.tasks import TASKS, builtin_task_text, get_task, load_task_file, parse_task_text
from anchorlens.tasks.examples import examples_from_rows

GOLDEN = Path(__file__).parent / "golden"
MINIMAL = 'name = "reviews"\ntemplate = "Review: {text}\\nSentiment:"\nlabels = { positive = " good", negative = " bad" }\nlabel_field = "label"\n'

# The seven SuperGLUE tasks as they were written in code before they became files (commit 2756f03).
BEFORE = {
    "rte": (("premise", "hypothesis"), "premise: {premise}\nhypothesis: {hypothesis}\nanswer:",
            ("entailment", "not_entailment"), (" yes", " no"), ("accuracy",), None),
    "cb": (("premise", "hypothesis"), "premise: {premise}\nhypothesis: {hypothesis}\nanswer:",
           ("entailment", "contradiction", "neutral"), (" yes", " no", " maybe"), ("accuracy", "macro_f1"), None),
    "boolq": (("passage", "question"), "passage: {passage}\nquestion: {question}?\nanswer:",
              (True, False), (" yes", " no"), ("accuracy",), None),
    "copa": (("premise", "question", "choice1", "choice2"),
             "premise: {premise}\nquestion: {question}\nchoice1: {choice1}\nchoice2: {choice2}\nanswer:",
             (0, 1), (" 1", " 2"), ("accuracy",), None),
    "wic": (("word", "sentence1", "sentence2"), "word: {word}\nsentence1: {sentence1}\nsentence2: {sentence2}\nanswer:",
            (True, False), (" yes", " no"), ("accuracy",), None),
    "wsc": (("text", "target.span1_text", "target.span2_text"),
            "text: {text}\nspan1: {target.span1_text}\nspan2: {target.span2_text}\nanswer:",
            (True, False), (" yes", " no"), ("accuracy",), None),
    "multirc": (("passage", "question", "answer"), "passage: {passage}\nquestion: {question}\nanswer: {answer}\ncorrect:",
                (0, 1), (" no", " yes"), ("f1a", "em"), ("passage_idx", "group")),
}  # fmt: skip


def _write(tmp_path: Path, text: str, name: str = "task.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_builtin_task_files_define_what_the_code_did(name):
    fields, spec, labels, verbalizers, metrics, group = BEFORE[name]
    task = TASKS[name]
    assert task.fields == fields and task.template.spec == spec
    assert task.labels == labels and [type(x) for x in task.labels] == [type(x) for x in labels]
    assert task.verbalizers == verbalizers and task.metrics == metrics and task.group_fields == (group or ())
    assert task.roles == () and task.rules == () and not task.chat and task.shots == 0
    assert parse_task_text(builtin_task_text(name), name, "x").template == task.template  # the same code reads them


def test_builtin_tasks_give_the_metrics_they_gave_before_they_were_files(tiny_base):
    """Every metric row (head means) of tiny-llama + instance on each task equals what commit 2756f03 computed."""
    from anchorlens.analyses.frames import average_heads
    from anchorlens.methods import load_guided
    from anchorlens.workflows.inputs import Inputs
    from anchorlens.workflows.statistics import capture_statistics

    rows = json.loads((GOLDEN / "builtin_rows.json").read_text())
    golden = json.loads(gzip.decompress((GOLDEN / "builtin_metrics_2756f03.json.gz").read_bytes()))
    model = load_guided("instance", tiny_base("tiny-llama"))
    worst = 0.0
    for name, data in rows.items():
        task = get_task(name)
        df = capture_statistics(model, Inputs(task, examples_from_rows(data, task), "golden"), batch_size=2)
        df = average_heads(df[df["metric"].isin(["decomposition", "role_flow", "entropy", "first_token_mass"])])
        fields = df["query_role"].str.startswith("content:") | df["key_role"].str.startswith("content:")
        assert fields.any() == (len(task.fields) > 1), name  # field groups (content:premise ...) came later
        df = df[~fields]  # the golden rows predate them; content itself is unchanged
        df = df.sort_values(["example", "layer", "metric", "query_role", "key_role"])
        got = [
            [int(r.example), int(r.layer), r.metric, r.query_role, r.key_role, float(r.value), str(r.fixed or "")]
            for r in df.itertuples()
        ]
        want = golden[name]
        assert [g[:5] for g in got] == [w[:5] for w in want], name
        for g, w in zip(got, want):
            if math.isnan(g[5]) and not math.isnan(w[5]):
                # the one n/a policy: a cell the mask fixes (its old value 0 or 1) is NaN with the reason
                assert g[6].startswith(("fixed by the causal mask", "empty")) and w[5] in (0.0, 1.0), (name, g, w)
                continue
            assert math.isnan(g[5]) == math.isnan(w[5]), (name, g, w)
            if not math.isnan(w[5]):
                worst = max(worst, abs(g[5] - w[5]))
                assert abs(g[5] - w[5]) <= 1e-6, (name, g, w)
    assert worst <= 1e-6  # bitwise on the machine that wrote the file; other CPUs may round differently


def test_minimal_user_task_file(tmp_path):
    task = load_task_file(_write(tmp_path, MINIMAL))
    assert (task.name, task.fields, task.labels, task.verbalizers) == (
        "reviews",
        ("text",),
        ("positive", "negative"),
        (" good", " bad"),
    )
    assert task.source == str((tmp_path / "task.toml").resolve()) and len(task.digest) == 64
    r = task.template.render({"text": "Great film."})
    assert [(r.text[s.start : s.end], s.role, s.field) for s in r.spans] == [
        ("Review: ", "structural", "Review:"),
        ("Great film.", "content", "text"),
        ("\nSentiment:", "structural", "Sentiment:"),
    ]
    assert get_task(str(tmp_path / "task.toml")) == task  # --task PATH goes through get_task


def test_template_roles_typed_labels_rules_and_segments(tmp_path):
    text = """
name = "chatty"
template = [
  { text = "### Instruction\\n", role = "scaffold" },
  { field = "question" },
  { text = "\\n### Answer:" },
]
labels = [{ value = true, verbalizer = " yes" }, { value = false, verbalizer = " no" }]
label_field = "gold"
[roles]
newline = '^\\s*\\n\\s*$'
"""
    task = load_task_file(_write(tmp_path, text))
    assert task.roles == ("scaffold", "newline") and task.label_field == "gold" and task.labels == (True, False)
    assert task.label_index("TRUE") == 0 and task.label_index(False) == 1  # a CSV cell matches by its text
    with pytest.raises(ValueError):
        task.label_index(1)  # type-strict otherwise: 1 is not True
    r = task.template.render({"question": "Is it?"})
    assert r.spans[0].role == "scaffold" and r.spans[1].role == "content" and r.spans[2].role == "structural"
    compact = Template.parse("Q: {question:query}\nA:")
    assert compact.segments[1].role == "query" and compact.spec == "Q: {question:query}\nA:"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (MINIMAL + 'lables = { a = " b" }\n', r"unknown key 'lables' \(did you mean 'labels'\?\)"),
        ('template = "x {a}"\nlabels = { a = " b", c = " d" }\n', r"missing key 'name'"),
        ('name = "t"\ntemplate = "no slot here"\nlabels = { a = " b", c = " d" }\n', r"no \{field\} slot"),
        ('name = "t"\ntemplate = "x {a}"\n', r"classification task needs labels"),
        ('name = "t"\ntemplate = "x {a}"\nlabels = { a = "  " }\n', r"verbalizer of label 'a' must be non-blank"),
        ('name = "t"\ntemplate = "x {a"\nlabels = { a = " b" }\n', r"template: unclosed"),
        ('name = "t"\ntemplate = "x {a}"\nlabels = { a = " b" }\nmetrics = ["f1"]\n', r"unknown metric 'f1'"),
        ('name = "t"\ntemplate = "x {a}"\nlabels = { a = " b" }\nmetric = "em"\n', r"metric em needs group_field"),
        ('name = "t"\ntemplate = "x {a}"\nlabels = { a = " b" }\nshots = -1\n', r"shots must be an integer"),
        ('name = "t"\ntemplate = "x {a:all}"\nlabels = { a = " b" }\n', r"reserved for pooled labels"),
        ('name = "t"\ntemplate = "x {a:capsule}"\nlabels = { a = " b" }\n', r"'capsule' is a guidance role"),
        (
            'name = "t"\ntemplate = "x {a}"\nlabels = { a = " b" }\n[roles]\npunct = "[unclosed"\n',
            r"\[roles\].*not a regular expression",
        ),
        ('name = "t"\ntemplate = "x {a}"\nkind = "text"\nlabels = { a = " b" }\n', r"text task has no labels"),
        ('name = "t"\ntemplate = "x {a}"\nlabels = { a = " b" \n', r"not valid TOML \(.*line 3"),
    ],
)
def test_bad_task_files_are_one_line_naming_the_file(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(DataError, match=message) as info:
        load_task_file(path)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)


def test_missing_task_file_and_unknown_names(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        get_task(str(tmp_path / "nope.toml"))
    with pytest.raises(ValueError, match="known tasks: rte, cb, boolq, copa, wic, wsc, multirc, sst2, text"):
        get_task("glue")


SUPERGLUE_FIELDS = ("premise", "hypothesis", "passage", "question", "choice1", "choice2", "sentence1", "sentence2",
                    "span1_text", "span2_text", "target.span1_text", "target.span2_text", "passage_idx", "questions")  # fmt: skip


def test_no_superglue_field_name_is_written_in_code():
    """The seven tasks' field names live in their task files only: no string in the package's code (docstrings
    aside) is such a name or a template slot of one."""
    import ast

    import anchorlens

    found = []
    for path in sorted(Path(anchorlens.__file__).parent.rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                text = node.value
                if text in SUPERGLUE_FIELDS or any(f"{{{name}}}" in text for name in SUPERGLUE_FIELDS):
                    found.append(f"{path.name}:{node.lineno}: {text!r}")
    assert not found, found
