"""The package builds into a wheel that carries its data and runs the demo outside the repository.

A fresh virtual environment gets the wheel by ``pip install --no-index`` (no dependencies downloaded:
the dependencies this environment already has are put on its path after its own site-packages), then ``anchorlens --version`` and the demo run from a
folder outside the checkout, so nothing can come from the source tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import anchorlens
from tests.conftest import REPO, embedded_available

pytestmark = pytest.mark.slow  # builds a wheel and a venv, then runs the demo: about a minute


def _tracked(prefix: str) -> list[str]:
    """Files git tracks under ``prefix`` (the file set a release is built from)."""
    done = subprocess.run(["git", "ls-files", prefix], cwd=REPO, capture_output=True, text=True, check=True)
    return [line for line in done.stdout.splitlines() if line]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    src = tmp_path_factory.mktemp("src")
    for rel in _tracked("."):
        target = src / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, target)
    out = tmp_path_factory.mktemp("dist")
    try:
        import build  # noqa: F401

        cmd = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(src)]
    except ImportError:  # pip builds the same wheel from the same pyproject
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (path,) = out.glob("anchorlens-*.whl")
    return path


def test_the_wheel_has_the_version_and_every_data_file(wheel):
    assert wheel.name.startswith(f"anchorlens-{anchorlens.__version__}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = [f for f in _tracked("anchorlens") if not f.endswith(".py")]
    assert data, "the package has data files (bundled examples, report template)"
    missing = [f for f in data if f not in names]
    assert not missing, f"package data missing from the wheel (add them to [tool.setuptools.package-data]): {missing}"
    assert "anchorlens/reports/templates/report.html.j2" in names and "anchorlens/tasks/examples/rte.jsonl" in names
    for name in ("prompt", "capsule", "deep-prompt"):  # the shipped trained checkpoints (--ckpt NAME@sst2)
        assert {
            f"anchorlens/methods/trained/sst2/{name}/{f}" for f in ("anchorlens.json", "guidance.safetensors")
        } <= names
    assert wheel.stat().st_size < 2_000_000


def test_the_installed_wheel_runs_the_demo_outside_the_repo(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python, entry = venv / "bin" / "python", venv / "bin" / "anchorlens"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    # the dependencies (torch, transformers ...) of this environment, after the venv's own site-packages:
    # nothing is downloaded, and the checkout itself is not on the path
    (site / "zz-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["ANCHORLENS_CACHE"] = os.environ.get("ANCHORLENS_CACHE", str(Path.home() / ".cache" / "anchorlens"))

    def run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
        return subprocess.run([str(entry), *args], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)

    where = subprocess.run(
        [str(python), "-c", "import anchorlens; print(anchorlens.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.stdout.startswith(str(site)), where.stdout + where.stderr  # the wheel's copy, not the checkout
    version = run("--version")
    assert version.returncode == 0 and version.stdout.startswith(f"anchorlens {anchorlens.__version__} ")
    base = [] if embedded_available() else ["--base", "tiny-llama"]
    demo = run("demo", *base, "--n", "2", "--out", str(work / "demo"))
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "instance vs base (2 paired examples, 95% bootstrap CI)" in demo.stdout
    assert (work / "demo" / "report.html").is_file() and (work / "demo" / "attention_budget.png").is_file()
    listed = run("checkpoints")
    assert listed.returncode == 0 and all(
        f"| {n}@sst2 |" in listed.stdout for n in ("prompt", "capsule", "deep-prompt")
    )
    if embedded_available():  # trained guidance compares on a fresh install, with no training
        args = ["--task", "sst2", "--ckpt", "base", "--ckpt", "prompt@sst2", "--ckpt", "capsule@sst2", "--n", "2"]
        done = run("compare", *args, "--no-figures", "--out", str(work / "sst2"))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert (work / "sst2" / "accuracy_pairs.csv").is_file()
    bad = run("demo", "--n", "0")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --n: 0 is below 1")
