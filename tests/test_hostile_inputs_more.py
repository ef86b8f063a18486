"""More hostile inputs (issue 41, item 5): each is one ``error:`` line naming the problem and the fix, exit 2, and
nothing written; plus the library-level rules behind them (labels equal by value, index ranges never expanded
before they are checked).

Same table as ``tests/test_hostile_inputs.py``: a case is a row (CLI args, input files to create, expected message
regex); ``{d}`` in args and message is the case's input folder.
"""

from __future__ import annotations

import os
import re
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from anchorlens.cli import app
from anchorlens.errors import DataError, UsageError
from anchorlens.methods.knockout import KnockoutConfig, parse_index_list
from anchorlens.tasks import load_task_file

runner = CliRunner()
TINY = ("--base", "tiny-llama")
CAPTURE = ("capture", "--ckpt", "base", *TINY, "--n", "2")
EVALUATE = ("evaluate", "--ckpt", "base", *TINY, "--n", "2")
STAGE_LINE = re.compile(r" \.\.\.$|: done in \d")
PROGRESS = re.compile(r"^predict \w+: .*batch/s\]$")  # evaluate's bar, drawn before the first batch is built
HEADER = "premise,hypothesis,label\n"
TASK = 'name = "reviews"\ntemplate = "Review: {text}\\nSentiment:"\n'
REVIEWS = TASK + 'labels = { positive = " good", negative = " bad" }\n'
HARNESS = b'task: t\ndoc_to_choice: ["no", "yes"]\ndoc_to_text: "{{premise}} caf\xe9? {{hypothesis}}"\n'

Files = Callable[[Path], object]


def text(name: str, body: str) -> Files:
    """Write ``body`` to ``{d}/name``."""
    return lambda d: (d / name).write_text(body)


def raw(**files: bytes) -> Files:
    """Write each ``name=bytes`` to ``{d}/name`` (a dot in a name is written ``_``: ``bad_yaml`` is bad.yaml)."""

    def build(d: Path) -> None:
        for name, body in files.items():
            (d / name.replace("_", ".")).write_bytes(body)

    return build


def fifo(name: str) -> Files:
    """A named pipe at ``{d}/name`` (opening it for reading would wait for a writer forever)."""
    return lambda d: os.mkfifo(d / name)


def empty_parquet(d: Path) -> None:
    """A valid parquet file with RTE's columns and no row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {name: pa.array([], pa.string()) for name in ("premise", "hypothesis", "label")}
    pq.write_table(pa.table(columns), d / "empty.parquet")


@dataclass(frozen=True)
class Case:
    """One hostile input: what to run, what to create first, what the one error line must say."""

    id: str
    args: tuple[str, ...]
    message: str
    files: Files | None = None


CASES = [
    # 1. a broken quote is refused at its row, not read with the rows after it merged into one example
    Case(
        "csv-unclosed-quote",
        (*CAPTURE, "--data", "{d}/a.csv"),
        r"{d}/a.csv: row 2 \(line 3\) opens a quoted field that is never closed .*; escape a quote inside a field "
        r"by doubling it .* or use --data FILE.jsonl",
        text(
            "a.csv",
            HEADER + "A cat sat.,A cat.,entailment\n" + '"A dog ran.,It moved.,entailment\n' + "C,D,entailment\n" * 2,
        ),
    ),
    Case(
        "csv-quote-runs-on",
        (*CAPTURE, "--data", "{d}/a.csv"),
        r"{d}/a.csv: row 2 \(line 3\) opens a quoted field that runs on to line 4, merging the rows between.*"
        r"--data FILE.jsonl",
        text("a.csv", HEADER + 'A cat.,A.,entailment\n"A dog,B,entailment\nC,D",entailment\nE,F,entailment\n'),
    ),
    Case(
        "tsv-field-starts-with-quote",
        (*CAPTURE, "--data", "{d}/a.tsv"),
        r"{d}/a.tsv: row 2 \(line 3\) has a field that starts with a quote .*--data FILE.jsonl",
        text(
            "a.tsv",
            "premise\thypothesis\tlabel\nA cat.\tA.\tentailment\n"
            '"Quoted" dog ran.\tIt moved.\tentailment\nThird.\tThree.\tentailment\n',
        ),
    ),
    # 3. a knockout of a key position no input has removes nothing: refused before any forward
    Case(
        "knockout-position-beyond-every-input",
        ("capture", "--ckpt", "knockout:keys=pos=100000", *TINY, "--n", "8"),
        r"knockout:keys=pos=100000 removes no key in any of the 8 inputs \(longest \d+ tokens\); "
        r"choose keys=pos=N with N < \d+",
    ),
    Case(
        "knockout-negative-position-beyond-every-input",
        ("capture", "--ckpt", "knockout:keys=pos=-100000", *TINY, "--n", "2"),
        r"knockout:keys=pos=-100000 removes no key in any of the 2 inputs .*N >= -\d+",
    ),
    # 4. ranges checked against the model as written, never expanded first
    Case(
        "knockout-layers-huge",
        ("capture", "--ckpt", "knockout:keys=first,layers=0-1000000000", *TINY, "--n", "2"),
        r"layers 0-1000000000 is outside the model; tiny-llama has 4 layers \(0-3\)",
    ),
    Case(
        "knockout-heads-huge",
        ("capture", "--ckpt", "knockout:keys=first,heads=0-99999999", *TINY, "--n", "2"),
        r"heads 0-99999999 is outside the model; tiny-llama has 4 heads per layer \(0-3\)",
    ),
    # 5. messages that said the wrong thing
    Case(
        "task-file-is-directory",
        (*CAPTURE, "--task", "{d}/mytask.toml"),
        r"task file {d}/mytask.toml is a directory; pass the .toml task file",
        lambda d: (d / "mytask.toml").mkdir(),
    ),
    Case(
        "task-path-is-directory",
        (*CAPTURE, "--task", "{d}/tasks"),
        r"task file {d}/tasks is a directory",
        lambda d: (d / "tasks").mkdir(),
    ),
    Case(
        "parquet-without-rows",
        (*CAPTURE, "--data", "{d}/empty.parquet"),
        r"{d}/empty.parquet: no examples \(the parquet file has no rows\)",
        empty_parquet,
    ),
    Case(
        "device-xla",
        (*CAPTURE, "--device", "xla"),
        r"device 'xla' is not supported .*; use cpu, cuda, cuda:N, mps or auto",
    ),
    Case(
        "device-vulkan",
        (*CAPTURE, "--device", "vulkan"),
        r"device 'vulkan' is not supported .*; use cpu, cuda, cuda:N, mps or auto",
    ),
    Case(
        "max-length-below-the-template",
        (*EVALUATE, "--max-length", "3"),
        r"a max length of 3 tokens cannot hold an input: .* take (\d+); pass --max-length \1 or more",
    ),
    # a harness YAML (or a file it includes) that is not UTF-8: FILE:LINE and the byte, not an internal error
    Case(
        "harness-yaml-not-utf8",
        (*CAPTURE, "--task", "{d}/bad.yaml"),
        r"{d}/bad.yaml:3: not UTF-8 \(byte 0xe9 at column 30\); re-encode the file as UTF-8",
        raw(bad_yaml=HARNESS),
    ),
    Case(
        "harness-included-yaml-not-utf8",
        (*CAPTURE, "--task", "{d}/child.yaml"),
        r"{d}/base.yaml:3: not UTF-8 \(byte 0xe9 at column 30\); re-encode the file as UTF-8",
        raw(base_yaml=HARNESS, child_yaml=b"include: base.yaml\ntask: child\n"),
    ),
    # a data label the task file has no verbalizer for, at evaluate: FILE:LINE, the label and the task's labels
    Case(
        "evaluate-label-not-in-the-task-file",
        (*EVALUATE, "--task", "{d}/task.toml", "--data", "{d}/a.jsonl"),
        r"{d}/a.jsonl:2: label 'neutral' is not one of \('positive', 'negative'\) for task reviews; "
        r"give it a verbalizer in {d}/task.toml \(or drop the row\)",
        lambda d: (
            (d / "task.toml").write_text(REVIEWS),
            (d / "a.jsonl").write_text(
                '{"text": "Good.", "label": "positive"}\n{"text": "Meh.", "label": "neutral"}\n'
            ),
        ),
    ),
    Case(
        "evaluate-number-label-not-in-the-task-file",
        (*EVALUATE, "--task", "{d}/task.toml", "--data", "{d}/a.csv"),
        r"{d}/a.csv: row 2: label '5' is not one of \(0, 1\) for task reviews; give it a verbalizer in {d}/task.toml",
        lambda d: (
            (d / "task.toml").write_text(
                TASK + 'label_field = "stars"\nlabels = [{ value = 0, verbalizer = " bad" }, '
                '{ value = 1, verbalizer = " good" }]\n'
            ),
            (d / "a.csv").write_text("text,stars\nGood.,1\nMeh.,5\n"),
        ),
    ),
    # 6. a named pipe would block the read forever
    Case(
        "data-is-fifo",
        (*CAPTURE, "--data", "{d}/pipe.jsonl"),
        r"cannot read --data {d}/pipe.jsonl: not a regular file \(a named pipe or a device\)",
        fifo("pipe.jsonl"),
    ),
    Case(
        "task-is-fifo",
        (*CAPTURE, "--task", "{d}/pipe.toml"),
        r"task file {d}/pipe.toml is not a regular file",
        fifo("pipe.toml"),
    ),
]


def error_line(output: str) -> str:
    """The single ``error:`` line of a refusal (stage lines of longer steps aside); fails on anything else."""
    lines = [line for line in output.strip().splitlines() if not STAGE_LINE.search(line)]
    lines = [line for line in lines if not line.startswith("warning: ") and not PROGRESS.search(line)]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: ") and "internal error" not in lines[0] and "Traceback" not in output, output
    return lines[0]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_hostile_input_is_refused(case: Case, tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    if case.files is not None:
        case.files(d)
    args = [a.replace("{d}", str(d)) for a in case.args] + ["--out", str(tmp_path / "out")]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    line = error_line(result.output)
    assert re.search(case.message.replace("{d}", re.escape(str(d))), line), (case.message, line)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written anywhere


def test_a_quoted_field_over_several_lines_is_still_read(tmp_path: Path) -> None:
    """The quote checks refuse broken quoting only: a quoted field holding a newline, a comma and a doubled quote
    is one field, as CSV writes it."""
    from anchorlens.tasks.sources import open_source, parse_source

    path = tmp_path / "ok.csv"
    path.write_text(HEADER + '"two\nlines, one field",H.,entailment\n\n"say ""hi""",H.,entailment\n')
    rows = open_source(parse_source(path)).table.to_list()
    assert [r["premise"] for r in rows] == ["two\nlines, one field", 'say "hi"']


def test_the_max_length_the_message_names_fits(tmp_path: Path) -> None:
    result = runner.invoke(app, [*EVALUATE, "--max-length", "3", "--out", str(tmp_path / "a")])
    need = re.search(r"pass --max-length (\d+) or more", result.output)
    assert result.exit_code == 2 and need, result.output
    result = runner.invoke(app, [*EVALUATE, "--max-length", need[1], "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output


# ---------------------------------------------------------------------- 2. labels equal by value are one label
def _task_with_labels(tmp_path: Path, *values: str) -> Path:
    entries = ", ".join(f'{{ value = {v}, verbalizer = " v{i}" }}' for i, v in enumerate(values))
    path = tmp_path / "task.toml"
    path.write_text(TASK + f"labels = [{entries}]\n")
    return path


@pytest.mark.parametrize(
    "values, named",
    [
        (("1", "1.0"), "labels 1 and 1.0 are one label"),
        (("1", '"1"'), "labels 1 and '1' are one label"),
        (('"0"', '"0.0"'), "labels '0' and '0.0' are one label"),
        (("true", '"True"'), "labels True and 'True' are one label"),
        (("2", "2"), "label 2 is listed twice"),
    ],
)
def test_equal_label_values_are_refused(tmp_path: Path, values: tuple[str, ...], named: str) -> None:
    path = _task_with_labels(tmp_path, *values)
    with pytest.raises(DataError, match=re.escape(f"{path}: {named}")):
        load_task_file(path)


def test_labels_match_by_value_and_booleans_stay_apart_from_numbers(tmp_path: Path) -> None:
    """Numbers match whatever their type or text (a data label 1.0 is the task's label 1 or "1"); True is not 1
    (``tests/tasks/test_registry.py`` holds the type-strict rule for booleans)."""
    numbers = load_task_file(_task_with_labels(tmp_path, "0", "1"))
    assert [numbers.label_index(v) for v in (1, 1.0, "1", "1.0", 0.0, "0")] == [1, 1, 1, 1, 0, 0]
    words = load_task_file(_task_with_labels(tmp_path, '"0"', '"1"'))
    assert [words.label_index(v) for v in (1, 1.0, "1.0", "0.0", 0)] == [1, 1, 1, 0, 0]
    with pytest.raises(ValueError):
        numbers.label_index(True)
    with pytest.raises(ValueError):
        words.label_index("01")  # "01" is text, not a number
    # the two tasks are different labels sets: both load (no label is a boolean and a number at once)
    assert load_task_file(_task_with_labels(tmp_path, "true", "1")).labels == (True, 1)


def test_a_data_file_label_matches_by_value(tmp_path: Path) -> None:
    """A CSV written with labels 1.0/0.0 is read against a task whose labels are the texts "1"/"0"."""
    from anchorlens.tasks import load_examples

    task = load_task_file(_task_with_labels(tmp_path, '"0"', '"1"'))
    data = tmp_path / "d.csv"
    data.write_text("text,label\ngood,1.0\nbad,0.0\n")
    examples = load_examples(data, task)
    assert [task.label_index(e["label"]) for e in examples] == [1, 0]


# ---------------------------------------------------------------------- 4. ranges never expanded before a check
def test_huge_knockout_ranges_are_parsed_without_building_them() -> None:
    tracemalloc.start()
    try:
        config = KnockoutConfig(keys="first", layers="0-2000000", heads="0-3/5-2000000")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, peak  # a 2,000,001-index set would take ~100 MB
    with pytest.raises(UsageError, match="names more layers than any model has"):
        config.layer_indices()
    assert parse_index_list("0/3/5-7", "layers") == (0, 3, 5, 6, 7)
