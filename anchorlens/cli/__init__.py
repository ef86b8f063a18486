"""The ``anchorlens`` command line: thin typer commands over the workflows and reports."""

from __future__ import annotations

import platform
import warnings
from importlib import metadata
from typing import Annotated

import typer

from anchorlens import __version__
from anchorlens.cli import checkpoints, flow, learn, measure, models, reproduce, tasks  # noqa: F401  (commands register on import)
from anchorlens.cli.app import app
from anchorlens.cli.options import one_line_warning


def _installed(dist: str) -> str:
    """Installed version of ``dist`` without importing it ("not installed" when absent)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def version_line() -> str:
    """``anchorlens 0.1.0 (python 3.11.9, torch 2.13.0+cpu, transformers 5.25.0)``: read without importing torch."""
    deps = ", ".join(f"{d} {_installed(d)}" for d in ("torch", "transformers"))
    return f"anchorlens {__version__} (python {platform.python_version()}, {deps})"


def _show_version(value: bool) -> None:
    """``--version``: print the version line and exit before any command runs."""
    if value:
        typer.echo(version_line())
        raise typer.Exit(0)


@app.callback()
def root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_show_version, help="Print the version and exit."),
    ] = False,
) -> None:
    """Without a command: compare the embedded SmolLM2 with an instance token on bundled RTE examples (the demo)."""
    warnings.showwarning = one_line_warning
    if ctx.invoked_subcommand is None:
        measure.demo()


def main() -> None:
    """Console-script entry point."""
    app(prog_name="anchorlens")


__all__ = ["app", "main", "version_line"]
