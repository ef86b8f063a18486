"""Safetensors files: a write that fails (full disk, file size limit) is the OSError it is, so commands give one line
naming the file; round trips and damaged files give the tensors or one line."""

from __future__ import annotations

import errno
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from anchorlens.atomic import os_errors
from anchorlens.errors import PathError, UsageError
from anchorlens.tensorfile import load_tensors, save_tensors
from tests.runtime.helpers import REPO, child_env

LIMITED = textwrap.dedent("""
    import errno, resource, signal, sys
    sys.dont_write_bytecode = True
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    import torch
    from anchorlens.tensorfile import save_tensors
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    try:
        save_tensors({"w": torch.ones(10_000)}, sys.argv[1])
    except OSError as err:
        print(err.errno == errno.EFBIG, err.filename == sys.argv[1])
""")


def test_a_write_past_the_file_size_limit_raises_the_os_error_naming_the_file(tmp_path):
    target = str(tmp_path / "big.safetensors")
    done = subprocess.run(
        [sys.executable, "-c", LIMITED, target], cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.split() == ["True", "True"], done.stdout + done.stderr


def test_the_os_error_becomes_one_line_under_os_errors(monkeypatch, tmp_path):
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr("anchorlens.tensorfile.save_file", full)
    target = tmp_path / "maps.safetensors"
    with pytest.raises(PathError, match=f"^cannot write {re.escape(str(target))}: no space left on the device"):
        with os_errors(target, "cannot write"):
            save_tensors({"w": torch.ones(3)}, target)
    with pytest.raises(OSError) as caught:
        save_tensors({"w": torch.ones(3)}, target)
    assert caught.value.errno == errno.ENOSPC


def test_other_safetensors_errors_are_not_disguised_as_disk_errors(monkeypatch, tmp_path):
    from safetensors import SafetensorError

    def bad(*args, **kwargs):
        raise SafetensorError("Error while serializing: some tensors share memory")

    monkeypatch.setattr("anchorlens.tensorfile.save_file", bad)
    with pytest.raises(SafetensorError, match="share memory"):
        save_tensors({"w": torch.ones(3)}, tmp_path / "x.safetensors")


def test_round_trip_and_a_truncated_file_is_one_line(tmp_path):
    path = save_tensors({"w": torch.arange(6.0).view(2, 3)}, tmp_path / "t.safetensors", metadata={"k": "v"})
    assert torch.equal(load_tensors(path)["w"], torch.arange(6.0).view(2, 3))
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(UsageError, match="is truncated or corrupted"):
        load_tensors(path)
