"""Atomic writes: whole or nothing, umask modes, owner-recorded temp dirs cleaned after a kill."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from anchorlens.atomic import OWNER_FILE, TEMP_MARK, atomic_dir, clean_stale_temps, os_errors, write_json, write_text
from anchorlens.errors import PathError


def test_write_text_replaces_whole_and_follows_umask(tmp_path):
    old = os.umask(0o022)
    try:
        path = write_text(tmp_path / "a" / "x.txt", "one")
        write_text(path, "two")
    finally:
        os.umask(old)
    assert path.read_text() == "two"
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    assert [p.name for p in path.parent.iterdir()] == ["x.txt"]


def test_atomic_dir_error_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_dir(tmp_path / "run") as tmp:
            (tmp / "f").write_text("half")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_mode_and_replace(tmp_path):
    old = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "run") as tmp:
            write_json(tmp / "m.json", {"a": 1})
    finally:
        os.umask(old)
    run = tmp_path / "run"
    assert json.loads((run / "m.json").read_text()) == {"a": 1}
    assert not (run / OWNER_FILE).exists()
    assert oct(run.stat().st_mode & 0o777) == oct(0o755)
    with pytest.raises(PathError, match="changed by someone else.*result is kept in .*run.kept-"):
        with atomic_dir(run) as tmp:
            (tmp / "new").write_text("kept")
    kept = [p for p in tmp_path.iterdir() if ".kept-" in p.name]
    assert len(kept) == 1 and (kept[0] / "new").read_text() == "kept"
    assert not [p for p in tmp_path.iterdir() if TEMP_MARK in p.name]
    with atomic_dir(run, replace=True) as tmp:
        (tmp / "b").write_text("b")
    assert sorted(p.name for p in run.iterdir()) == ["b"]


def test_temp_dir_of_killed_writer_is_cleaned_by_next_writer(tmp_path):
    code = (
        "import os, sys\n"
        "from anchorlens.atomic import atomic_dir\n"
        f"with atomic_dir({str(tmp_path / 'run')!r}) as tmp:\n"
        "    (tmp / 'part').write_text('x')\n"
        "    os.kill(os.getpid(), 9)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], check=False)
    assert proc.returncode == -9
    left = [p for p in tmp_path.iterdir() if TEMP_MARK in p.name]
    assert len(left) == 1
    with atomic_dir(tmp_path / "run") as tmp:
        (tmp / "done").write_text("y")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_live_writer_temp_dir_is_kept(tmp_path):
    with atomic_dir(tmp_path / "run") as tmp:
        assert clean_stale_temps(tmp_path, "run") == []
        assert tmp.exists()


def test_os_errors_name_the_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PathError, match=r"file/sub.*a parent is a file"):
        with os_errors(blocker / "sub", "cannot write"):
            (blocker / "sub").mkdir(parents=True)
