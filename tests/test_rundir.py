"""The --out claim: refusals up front, --force only on anchorlens runs, an exclusive lock, stale takeover, modes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from anchorlens.atomic import TEMP_MARK
from anchorlens.errors import PathError, UsageError
from anchorlens.rundir import (
    MANIFEST,
    RUN_MARKER,
    OutClaim,
    base_facts,
    claim_out,
    lock_path,
    manifest,
    run_state,
    write_manifest,
)

REPO = Path(__file__).resolve().parents[1]


def finished_run(path: Path, kind: str = "compare") -> Path:
    """A finished anchorlens run folder at ``path``."""
    with claim_out(path, kind=kind) as claim, claim.atomic() as tmp:
        (tmp / "result.txt").write_text("old")
        write_manifest(tmp, kind)
    return path


def user_folder(path: Path) -> Path:
    """A folder of the user's own files (the issue's notes.txt and thesis/ch1.tex)."""
    (path / "thesis").mkdir(parents=True)
    (path / "notes.txt").write_text("n")
    (path / "thesis" / "ch1.tex").write_text("t")
    return path


@pytest.mark.parametrize("where", [".", "..", "/"])
def test_out_that_is_the_cwd_or_a_parent_is_refused(tmp_path, monkeypatch, where):
    cwd = tmp_path / "a" / "b"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    with pytest.raises(UsageError, match="current directory or one of its parents"):
        claim_out(where, kind="compare", force=True)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b"]


def test_out_under_a_file_is_refused_up_front(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(PathError, match=r"f is a file, not a directory"):
        claim_out(tmp_path / "f" / "deeper" / "out", kind="compare")
    with pytest.raises(PathError, match="not a directory"):
        claim_out(tmp_path / "f", kind="compare")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_parent_is_refused_up_front(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir(mode=0o555)
    with pytest.raises(PathError, match="not writable"):
        claim_out(parent / "out", kind="compare")


def test_force_never_replaces_a_folder_anchorlens_did_not_write(tmp_path):
    out = user_folder(tmp_path / "d")
    for force in (False, True):
        with pytest.raises(UsageError, match="--force replaces only what anchorlens wrote"):
            claim_out(out, kind="evaluate", force=force)
    assert (out / "notes.txt").read_text() == "n" and (out / "thesis" / "ch1.tex").read_text() == "t"
    assert not lock_path(out.absolute()).exists()


def test_user_files_added_to_a_claimed_empty_folder_are_kept(tmp_path):
    out = tmp_path / "d"
    out.mkdir()
    with pytest.raises(PathError, match="result is kept in"):
        with claim_out(out, kind="compare") as claim, claim.atomic() as tmp:
            (tmp / "result.txt").write_text("new")
            (out / "notes.txt").write_text("written meanwhile")
    assert (out / "notes.txt").read_text() == "written meanwhile"
    kept = list(tmp_path.glob("d.kept-*"))
    assert len(kept) == 1 and (kept[0] / "result.txt").read_text() == "new"


def test_finished_run_is_refused_without_force_and_replaced_with_it(tmp_path):
    out = finished_run(tmp_path / "run")
    assert run_state(out) == "finished"
    with pytest.raises(UsageError, match="already exists and holds a finished run; pass --force"):
        claim_out(out, kind="compare")
    with claim_out(out, kind="compare", force=True) as claim, claim.atomic() as tmp:
        (tmp / "result.txt").write_text("new")
        write_manifest(tmp, "compare")
    assert (out / "result.txt").read_text() == "new"
    assert not [p for p in tmp_path.iterdir() if TEMP_MARK in p.name or p.name.endswith(".anchorlens-lock")]


def test_unfinished_runs_need_resume_or_force_and_resume_checks_the_kind(tmp_path):
    out = tmp_path / "run"
    with claim_out(out, kind="train") as claim:
        claim.start_in_place()
    assert run_state(out) == "unfinished" and (out / RUN_MARKER).is_file()
    with pytest.raises(UsageError, match="pass --resume"):
        claim_out(out, kind="train")
    with pytest.raises(UsageError, match="holds a train run, not a capture run"):
        claim_out(out, kind="capture", resume=True)
    claim_out(out, kind="train", resume=True).release()
    with claim_out(out, kind="capture", force=True) as claim:
        claim.start_in_place()
        claim.finish_in_place(manifest("capture"))
    assert run_state(out) == "finished" and not (out / RUN_MARKER).exists()


def test_second_claim_is_refused_while_the_first_holds_it(tmp_path):
    out = tmp_path / "run"
    first = claim_out(out, kind="compare")
    with pytest.raises(UsageError, match=rf"being written by another anchorlens run \(pid {os.getpid()} on"):
        claim_out(out, kind="compare")
    first.release()
    assert not lock_path(first.path).exists()
    claim_out(out, kind="compare").release()


def test_a_lock_file_planted_as_a_symlink_is_refused_and_its_target_kept(tmp_path):
    thesis = tmp_path / "thesis.txt"
    thesis.write_text("chapter 1")
    out = tmp_path / "d" / "run"
    out.parent.mkdir()
    lock_path(out).symlink_to(thesis)
    with pytest.raises(PathError, match=r"lock file .* is a symbolic link; remove it"):
        claim_out(out, kind="compare")
    assert thesis.read_text() == "chapter 1"
    assert not out.exists()


def test_one_folder_named_through_a_symlink_takes_the_same_lock(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    first = claim_out(tmp_path / "real" / "run", kind="compare")
    with pytest.raises(UsageError, match="being written by another anchorlens run"):
        claim_out(tmp_path / "alias" / "run", kind="compare")
    first.release()
    claim_out(tmp_path / "alias" / "run", kind="compare").release()


def test_claim_and_temp_folder_of_a_killed_run_are_taken_over(tmp_path):
    out = tmp_path / "run"
    script = textwrap.dedent(f"""
        import os, signal
        from anchorlens.rundir import claim_out
        claim = claim_out({str(out)!r}, kind="compare")
        with claim.atomic() as tmp:
            (tmp / "half.txt").write_text("half")
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == -signal.SIGKILL
    assert lock_path(out).exists() and [p for p in tmp_path.iterdir() if TEMP_MARK in p.name]
    finished_run(out)  # the dead owner's lock is taken over, its temp folder removed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert (out / "result.txt").read_text() == "old"


def test_results_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        with claim_out(tmp_path / "run", kind="compare") as claim, claim.atomic() as tmp:
            (tmp / "figures").mkdir()
            save_file({"a": torch.zeros(2)}, str(tmp / "maps.safetensors"))  # safetensors writes 0600
            write_manifest(tmp, "compare")
    finally:
        os.umask(old)
    run = tmp_path / "run"
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in [run, *run.iterdir()]}
    assert modes == {"run": "0o755", "figures": "0o755", "maps.safetensors": "0o644", MANIFEST: "0o644"}


class FakeBase:
    spec = "tiny-llama"

    def fingerprint(self) -> dict:
        return {"model_type": "llama"}


class FakeBaseWithProvenance(FakeBase):
    def provenance(self) -> dict:
        return {"source": "hub", "revision": "abc"}


def test_manifest_records_command_versions_base_data_and_seed(tmp_path):
    record = manifest("compare", base_model=FakeBase(), data_digest="d" * 16, seed=3, extra=1)
    assert record["kind"] == "compare" and record["command"] == sys.argv and "anchorlens" in record["versions"]
    assert record["base_model"] == {"spec": "tiny-llama", "fingerprint": {"model_type": "llama"}}
    assert (record["data_digest"], record["seed"], record["extra"]) == ("d" * 16, 3, 1)
    assert base_facts(FakeBaseWithProvenance())["provenance"] == {"source": "hub", "revision": "abc"}
    path = write_manifest(tmp_path, "figures", source="x")
    assert json.loads(path.read_text())["source"] == "x" and run_state(tmp_path) == "finished"


def test_a_claim_given_to_a_writer_is_used_not_claimed_again(tmp_path):
    from anchorlens.rundir import claimed

    claim = claim_out(tmp_path / "run", kind="compare")
    with claimed(claim, kind="compare") as same:
        assert same is claim
    assert claim.held
    claim.release()
    assert isinstance(claim, OutClaim) and not claim.held
