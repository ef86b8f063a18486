"""Every command's --out, end to end: user files never deleted, concurrent runs, full disk, interrupts, figures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from anchorlens.atomic import TEMP_MARK
from anchorlens.cli import app

REPO = Path(__file__).resolve().parents[1]
TINY = ["--base", "tiny-llama"]


def cli(*args: str):
    """Run the CLI in-process."""
    return CliRunner().invoke(app, list(args))


def child_env() -> dict[str, str]:
    """This checkout first on the path, one thread."""
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def leftovers(root: Path) -> list[str]:
    """Temp folders/files, kept results and lock files anywhere under ``root``."""
    return [
        str(p)
        for p in root.rglob("*")
        if TEMP_MARK in p.name or p.name.endswith(".anchorlens-lock") or ".kept-" in p.name
    ]


def user_folder(path: Path) -> Path:
    """The issue's folder: notes.txt and thesis/ch1.tex."""
    (path / "thesis").mkdir(parents=True)
    (path / "notes.txt").write_text("n")
    (path / "thesis" / "ch1.tex").write_text("t")
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["evaluate", "--ckpt", "base", "--n", "2", *TINY],
        ["compare", "--ckpt", "base", "--ckpt", "instance", "--n", "2", *TINY],
    ],
)
def test_force_does_not_delete_a_users_folder(tmp_path, command):
    out = user_folder(tmp_path / "d")
    result = cli(*command, "--out", str(out), "--force")
    assert result.exit_code == 2, result.output
    assert "--force replaces only what anchorlens wrote" in result.output
    assert (out / "notes.txt").read_text() == "n" and (out / "thesis" / "ch1.tex").read_text() == "t"


def test_evaluate_workflow_force_keeps_user_files(tmp_path, tiny_base):
    from anchorlens.errors import UsageError
    from anchorlens.workflows.evaluate import evaluate

    out = user_folder(tmp_path / "d")
    with pytest.raises(UsageError, match="replaces only what anchorlens wrote"):
        evaluate("base", "rte", n=2, base=tiny_base("tiny-llama"), out=out, force=True)
    assert sorted(p.name for p in out.rglob("*")) == ["ch1.tex", "notes.txt", "thesis"]
    done = evaluate("base", "rte", n=2, base=tiny_base("tiny-llama"), out=tmp_path / "e")
    again = evaluate("base", "rte", n=3, base=tiny_base("tiny-llama"), out=tmp_path / "e", force=True)
    assert done.out == again.out and json.loads((tmp_path / "e" / "metrics.json").read_text())["num_examples"] == 3
    assert json.loads((tmp_path / "e" / "manifest.json").read_text())["base_model"]["spec"] == "tiny-llama"


def test_out_dot_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli("evaluate", "--ckpt", "base", "--n", "2", *TINY, "--out", ".", "--force")
    assert result.exit_code == 2 and "current directory" in result.output, result.output
    assert list(tmp_path.iterdir()) == []


RACE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    go, out, ckpt = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    from anchorlens.cli import app
    while not go.exists():
        time.sleep(0.005)
    sys.argv = ["anchorlens", "compare", "--ckpt", "base", "--ckpt", ckpt, "--base", "tiny-llama", "--n", "4",
                "--out", out]
    app()
""")


@pytest.mark.slow
def test_two_compares_into_one_out_exactly_one_wins(tmp_path):
    out, go = tmp_path / "R", tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, str(go), str(out), ckpt],
            cwd=REPO,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for ckpt in ("instance", "capsule")
    ]
    time.sleep(3)  # both imported and waiting
    go.touch()
    results = [(p.communicate(timeout=300)[0], p.returncode) for p in procs]
    codes = sorted(rc for _, rc in results)
    assert codes == [0, 2], results
    winner = ("instance", "capsule")[[rc for _, rc in results].index(0)]
    loser_output = next(o for o, rc in results if rc == 2)
    errors = [line for line in loser_output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in loser_output, loser_output
    assert "being written by another anchorlens run" in errors[0] or "holds a finished run" in errors[0]
    assert set(pd.read_parquet(out / "metrics.parquet")["checkpoint"]) == {"base", winner}  # nothing mixed
    assert leftovers(tmp_path) == []


FULL_DISK = textwrap.dedent("""
    import resource, signal, sys
    sys.dont_write_bytecode = True  # a .pyc cut at the size limit would break every later import of its module
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    from anchorlens.cli import app
    from anchorlens.reports import comparison
    from anchorlens.runtime import shards

    def fill_the_disk():  # like `ulimit -f 4`: from now on no file grows past 4,000 bytes
        resource.setrlimit(resource.RLIMIT_FSIZE, (4_000, 4_000))

    if sys.argv[2] == "report":
        write = comparison.write_comparison
        def full_write(*args, **kwargs):
            fill_the_disk()
            return write(*args, **kwargs)
        comparison.write_comparison = full_write
    else:
        save = shards.Progress.save
        def full_save(self, chunk, ids, rows, **recorded):
            if chunk == 1:  # the second checkpoint's chunk, once the first one is saved
                fill_the_disk()
            return save(self, chunk, ids, rows, **recorded)
        shards.Progress.save = full_save
    sys.argv = ["anchorlens", "compare", "--ckpt", "base", "--ckpt", "instance", "--base", "tiny-llama", "--n", "2",
                "--out", sys.argv[1]]
    app()
""")


@pytest.mark.slow
@pytest.mark.parametrize(("when", "saved"), [("chunk", ["shard-00000"]), ("report", ["shard-00000", "shard-00001",
                         "shard-00002"])], ids=["while-saving-a-chunk", "while-writing-the-report"])  # fmt: skip
def test_full_disk_is_one_line_keeps_the_saved_chunks_and_the_rerun_finishes(tmp_path, when, saved):
    out = tmp_path / "R"
    proc = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(out), when],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert errors[0].startswith(f"error: cannot write {out}") and errors[0].endswith("File too large"), errors[0]
    # nothing half-written: OUT is an unfinished compare run holding whole, committed chunks, no temp, no lock
    assert [p.name for p in tmp_path.iterdir()] == ["R"] and leftovers(tmp_path) == []
    assert not (out / "manifest.json").exists() and not (out / "metrics.parquet").exists()
    assert sorted(p.stem for p in (out / ".progress").glob("shard-*.json")) == saved
    assert sorted(p.stem for p in (out / ".progress").glob("shard-*.arrow")) == saved
    rerun = cli("compare", "--ckpt", "base", "--ckpt", "instance", *TINY, "--n", "2", "--out", str(out))
    assert rerun.exit_code == 0, rerun.output
    assert (out / "manifest.json").is_file() and not (out / ".progress").exists()
    assert pd.read_parquet(out / "metrics.parquet")["example"].nunique() == 2


def test_figures_write_an_atomic_folder_with_a_manifest(compare_run, tmp_path):
    from anchorlens.errors import UsageError
    from anchorlens.reports.comparison import redraw_figures

    folder, count = redraw_figures(compare_run, tmp_path / "figs")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["kind"] == "figures" and manifest["figures"] == count == len(list(folder.glob("*.png")))
    with pytest.raises(UsageError, match="holds a finished run"):
        redraw_figures(compare_run, tmp_path / "figs")
    with pytest.raises(UsageError, match="holds a finished run"):
        redraw_figures(compare_run)  # RUN/figures, written by compare
    before = sorted(p.name for p in (compare_run / "figures").iterdir())
    folder, _ = redraw_figures(compare_run, force=True)
    assert folder == compare_run / "figures" and sorted(p.name for p in folder.iterdir()) == sorted(
        before + ["manifest.json"]
    )
    assert leftovers(tmp_path) == [] and leftovers(compare_run.parent) == []


KILL_FIGURES = textwrap.dedent("""
    import os, signal, sys
    import anchorlens.reports.comparison as rc
    real = rc.save_figure
    calls = []
    def save_then_die(*a, **k):
        real(*a, **k)
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    rc.save_figure = save_then_die
    rc.redraw_figures(sys.argv[1], sys.argv[2])
""")


@pytest.mark.slow
def test_kill_during_figures_leaves_no_half_folder_and_the_rerun_works(compare_run, tmp_path):
    from anchorlens.reports.comparison import redraw_figures

    target = tmp_path / "figs"
    proc = subprocess.run(
        [sys.executable, "-c", KILL_FIGURES, str(compare_run), str(target)],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not target.exists()
    redraw_figures(compare_run, target)  # not refused; the killed run's temp folder and lock are gone
    assert (target / "manifest.json").is_file() and leftovers(tmp_path) == []


def test_results_are_readable_as_the_umask_says(compare_run):
    run = compare_run
    old = os.umask(0o022)
    os.umask(old)
    want_dir, want_file = 0o777 & ~old, 0o666 & ~old
    assert run.stat().st_mode & 0o777 == want_dir
    assert (run / "maps.safetensors").stat().st_mode & 0o777 == want_file
    assert all(p.stat().st_mode & 0o777 == (want_dir if p.is_dir() else want_file) for p in run.rglob("*"))


TRAIN_SIGINT = textwrap.dedent("""
    import signal, sys
    from anchorlens.training.trainer import Trainer
    from anchorlens.workflows.train import train
    real = Trainer.step
    def step(self):
        if self.state.step == int(sys.argv[2]):
            signal.raise_signal(signal.SIGINT)
        return real(self)
    Trainer.step = step
    train("prompt:n=2", "rte", base="tiny-llama", steps=4, out=sys.argv[1], eval_every=2, batch_size=4,
          max_length=96, progress=False)
""")


@pytest.mark.slow
def test_sigint_during_train_then_resume_leaves_no_partial_out_or_temp_dirs(tmp_path):
    from anchorlens.workflows.train import train

    early, late = tmp_path / "early", tmp_path / "late"
    for out, at in ((early, 1), (late, 3)):
        proc = subprocess.run(
            [sys.executable, "-c", TRAIN_SIGINT, str(out), str(at)],
            cwd=REPO,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr, proc.stderr
    assert not early.exists()  # stopped before its first checkpoint: nothing left
    assert sorted(p.name for p in late.iterdir()) == [".anchorlens-run.json", "checkpoints"]
    assert leftovers(tmp_path) == []
    train(
        "prompt:n=2",
        "rte",
        base="tiny-llama",
        steps=4,
        out=late,
        eval_every=2,
        batch_size=4,
        max_length=96,
        progress=False,
        resume=True,
    )
    assert (late / "manifest.json").is_file() and not (late / ".anchorlens-run.json").exists()
    assert leftovers(tmp_path) == []


def test_sweep_length_runs_are_staged_beside_out_and_moved_in_with_the_result(tmp_path):
    from anchorlens.reports.sweeps import write_sweep
    from anchorlens.rundir import claim_out

    table = pd.DataFrame({"length": [1, 3], "accuracy": [0.5, 0.75], "ci_lo": [0.4, 0.6], "ci_hi": [0.6, 0.9]})
    out = tmp_path / "sweep"
    with claim_out(out, kind="sweep-length") as claim, claim.scratch() as scratch:
        (scratch / "runs" / "len-1").mkdir(parents=True)
        (scratch / "runs" / "len-1" / "summary.json").write_text("{}")
        assert scratch.parent == tmp_path and TEMP_MARK in scratch.name  # beside OUT, owner-recorded, not in /tmp
        write_sweep(table, claim, kind="length", x="length", by=None, facts={"steps": 1}, runs=scratch / "runs")
    assert (out / "runs" / "len-1" / "summary.json").is_file() and (out / "sweep.csv").is_file()
    assert json.loads((out / "manifest.json").read_text())["kind"] == "sweep-length"
    assert leftovers(tmp_path) == []
