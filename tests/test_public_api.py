"""Every public name resolves, and importing the package stays light."""

from __future__ import annotations

import subprocess
import sys

import anchorlens


def test_every_export_resolves():
    for name in anchorlens.__all__:
        assert getattr(anchorlens, name) is not None, name


def test_import_does_not_pull_torch():
    code = "import sys, anchorlens; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cli_and_progress_import_without_torch():
    """`anchorlens --help` and the argument checks stay fast: no torch behind the CLI modules or the stage reporter."""
    code = "import sys, anchorlens.cli, anchorlens.progress; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
