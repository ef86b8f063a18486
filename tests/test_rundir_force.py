"""--force never deletes what the command reads (an --out that is, holds or lies inside an input) nor entries of a
finished run that anchorlens did not write (the user's notes beside the results); reruns with --force still work."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from anchorlens.cli import app
from anchorlens.errors import UsageError
from anchorlens.rundir import MANIFEST, check_inputs, claim_out, clear_run, local_paths, write_manifest

TINY = ["--base", "tiny-llama", "--limit", "2"]
GOOD = {"premise": "A cat sat on the mat.", "hypothesis": "A cat sat.", "label": "entailment"}


def cli(*args: str | Path):
    """Run the CLI in-process."""
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line_error(result, *needles: str) -> str:
    """The refusal: exit 2, one ``error:`` line containing every needle."""
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The reviewer's folder: a finished train run whose final/ checkpoint later commands read."""
    out = tmp_path_factory.mktemp("train") / "ckq"
    result = cli("train", "--method", "capsule", "--steps", "1", *TINY, "--limit", "4", "--out", out)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def ckq(trained, tmp_path, monkeypatch) -> Path:
    """A copy of the train run as ``./ckq`` in a fresh working directory."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(trained, tmp_path / "ckq")
    return Path("ckq")


# ---------------------------------------------------------------------------- (a) --out and the inputs
@pytest.mark.parametrize(
    ("command", "relation"),
    [
        (["compare", "--ckpt", "base", "--ckpt", "ckq/final", "--no-figures", "--out", "ckq", "--force"], "holds"),
        (["capture", "--ckpt", "ckq/final", "--out", "ckq", "--force"], "holds"),
        (["evaluate", "--ckpt", "ckq/final", "--out", "ckq", "--force"], "holds"),
        (["evaluate", "--ckpt", "ckq/final", "--out", "ckq/final", "--force"], "is"),
        (["positions", "--ckpt", "ckq/final+instance", "--out", "ckq", "--force"], "holds"),
    ],
)
def test_out_touching_a_checkpoint_it_reads_is_refused(ckq, command, relation):
    before = tree(ckq)
    result = cli(*command, *TINY)
    line = one_line_error(result, f"--out {command[command.index('--out') + 1]} {relation} the input", "--out runs/")
    assert "ckq/final" in line
    assert tree(ckq) == before  # the checkpoint and the train run are untouched
    assert not (ckq / "final" / "cmp").exists()


def test_out_holding_the_data_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli("evaluate", "--ckpt", "base", *TINY, "--out", "ev").exit_code == 0
    data = Path("ev") / "examples.jsonl"  # the user keeps the data beside the results, then reruns with --force
    data.write_text("\n".join(json.dumps(GOOD) for _ in range(2)) + "\n")
    result = cli("evaluate", "--ckpt", "base", "--data", data, *TINY, "--out", "ev", "--force")
    one_line_error(result, "--out ev holds the input ev/examples.jsonl")
    assert data.is_file()


REVIEWS = (
    'name = "reviews"\ntemplate = "Review: {text}\\nSentiment:"\nlabels = { positive = " good", negative = " bad" }\n'
)


@pytest.mark.parametrize(
    ("task", "data", "named"),
    [
        # the data a task file names (data = ...) under a name the run wrote: the stray-entry rule cannot see it
        ("task.toml", "ev/predictions.csv", "ev/predictions.csv"),
        ("task.toml", "ev/examples.jsonl", "ev/examples.jsonl"),
        ("ev/task.toml", None, "ev/task.toml"),  # the task file itself inside --out (data from --data)
    ],
)
def test_out_holding_what_the_task_file_reads_is_refused(tmp_path, monkeypatch, task, data, named):
    """Issue 41: --force replaced an --out holding the run's data when the task file named it (``data = ...``),
    not --data: the new predictions.csv overwrote the user's data of that name."""
    monkeypatch.chdir(tmp_path)
    Path("d.csv").write_text("text,label\nGreat kettle.,positive\nBroke fast.,negative\n")
    Path("task0.toml").write_text(REVIEWS)
    assert (
        cli("evaluate", "--ckpt", "base", "--task", "task0.toml", "--data", "d.csv", *TINY, "--out", "ev").exit_code
        == 0
    )
    if data is not None:
        Path(data).write_text(Path("d.csv").read_text())  # the user's data, kept beside the results
    Path(task).write_text(REVIEWS + (f'data = "{data}"\n' if data else ""))
    before = tree(Path("ev"))
    extra = ["--data", "d.csv"] if data is None else []
    result = cli("evaluate", "--ckpt", "base", "--task", task, *extra, *TINY, "--out", "ev", "--force")
    one_line_error(result, f"--out ev holds the input {named}", "--out runs/")
    assert tree(Path("ev")) == before  # the data, the task file and the old results are untouched


def test_local_paths_of_specs_and_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ck").mkdir()
    (tmp_path / "ds").mkdir()
    ck, ds = (tmp_path / "ck").resolve(), (tmp_path / "ds").resolve()
    for spec in ("ck", "ck:merge=true", "model=ck+instance", "instance+ck"):
        assert local_paths(spec) == [ck], spec
    assert local_paths("ds@train") == [ds]
    assert local_paths("base") == local_paths("tiny-llama") == local_paths(None) == local_paths("hf:org/name") == []
    check_inputs(tmp_path / "runs" / "x", ["ck", "ds@train", "base"])  # beside the inputs: fine
    check_inputs(tmp_path / "ck" / "x", ["model=ck+instance"])  # inside an input folder: deletes nothing of it
    with pytest.raises(UsageError, match=rf"--out {tmp_path} holds the input model=ck\+instance \({ck}\)"):
        check_inputs(tmp_path, ["model=ck+instance"])


# ---------------------------------------------------------------------------- (b) the user's files in a run
def test_capture_force_keeps_the_users_files_and_says_what_to_move(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = Path("cap")
    assert cli("capture", "--ckpt", "base", *TINY, "--out", out).exit_code == 0
    (out / "my_notes.md").write_text("my notes")
    (out / "analysis").mkdir()
    (out / "analysis" / "plot.py").write_text("print('plot')")
    before = tree(out)
    result = cli("capture", "--ckpt", "base", *TINY, "--out", out, "--force")
    one_line_error(result, "holds analysis, which anchorlens did not write", "move analysis out of")
    assert tree(out) == before  # the notes, the script and the old results are all still there
    (out / "analysis" / "plot.py").unlink()
    (out / "analysis").rmdir()
    one_line_error(cli("capture", "--ckpt", "base", *TINY, "--out", out, "--force"), "holds my_notes.md")
    (out / "my_notes.md").unlink()
    assert cli("capture", "--ckpt", "base", *TINY, "--out", out, "--force").exit_code == 0  # a plain rerun works


def test_compare_force_keeps_a_note_and_reruns_without_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    command = ["compare", "--ckpt", "base", "--ckpt", "instance", "--no-figures", *TINY, "--out", "cmp"]
    assert cli(*command).exit_code == 0
    files = json.loads((tmp_path / "cmp" / MANIFEST).read_text())["files"]
    assert "metrics.parquet" in files and MANIFEST in files
    (tmp_path / "cmp" / "notes.txt").write_text("n")
    one_line_error(cli(*command, "--force"), "holds notes.txt, which anchorlens did not write")
    assert (tmp_path / "cmp" / "notes.txt").read_text() == "n"
    (tmp_path / "cmp" / "notes.txt").unlink()
    assert cli(*command, "--force").exit_code == 0


def test_train_force_keeps_a_readme_in_the_run(ckq):
    (ckq / "README.md").write_text("what this run is")
    result = cli("train", "--method", "capsule", "--steps", "1", *TINY, "--out", ckq, "--force")
    one_line_error(result, "holds README.md, which anchorlens did not write")
    assert (ckq / "README.md").is_file() and (ckq / "final" / "anchorlens.json").is_file()


def finished(path: Path, *names: str) -> Path:
    """A finished run written through a claim: ``names`` (``figures/x.png`` makes the folder)."""
    with claim_out(path, kind="compare") as claim, claim.atomic() as tmp:
        for name in names:
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text("old")
        write_manifest(tmp, "compare")
    return path


def test_force_refuses_entries_the_run_did_not_write_at_claim_and_at_clear(tmp_path):
    out = finished(tmp_path / "run", "result.txt", "figures/a.png")
    assert json.loads((out / MANIFEST).read_text())["files"] == ["figures", MANIFEST, "result.txt"]
    claim_out(out, kind="compare", force=True).release()  # only its own entries: replaceable
    (out / "figures" / "notes.md").write_text("n")
    with pytest.raises(UsageError, match="holds figures/notes.md, which anchorlens did not write"):
        claim_out(out, kind="compare", force=True)
    with pytest.raises(UsageError, match="holds figures/notes.md"):
        clear_run(out)
    (out / "figures" / "notes.md").unlink()
    (out / "summary.md").write_text("mine")  # a name other runs write, but not this one
    with pytest.raises(UsageError, match="holds summary.md"):
        claim_out(out, kind="compare", force=True)
    assert (out / "summary.md").read_text() == "mine" and (out / "result.txt").read_text() == "old"


def test_user_file_added_while_a_forced_run_writes_is_kept(tmp_path):
    out = finished(tmp_path / "run", "result.txt")
    with pytest.raises(Exception, match="result is kept in"):
        with claim_out(out, kind="compare", force=True) as claim, claim.atomic() as tmp:
            (tmp / "result.txt").write_text("new")
            write_manifest(tmp, "compare")
            (out / "notes.txt").write_text("written meanwhile")
    assert (out / "notes.txt").read_text() == "written meanwhile" and (out / "result.txt").read_text() == "old"
