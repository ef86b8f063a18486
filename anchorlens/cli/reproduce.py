"""``anchorlens reproduce``: run a declared plan and write the paper-style tables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from anchorlens.cli.app import app
from anchorlens.cli.options import OutputOptions, cli_command, input_file


@app.command()
@cli_command
def reproduce(
    plan: Annotated[
        Path, typer.Argument(help="Plan TOML (tasks x methods x seeds x budget), e.g. examples/reproduce-cpu.toml.")
    ],
    out: Annotated[
        Path,
        typer.Option(
            "--out", help="Output directory; rerunning continues it (finished cells in OUT/cells are reused)."
        ),
    ] = Path("anchorlens-reproduce"),
    smoke: Annotated[bool, typer.Option("--smoke", help="Run the plan's [smoke] size (CI: about a minute).")] = False,
    force: Annotated[bool, typer.Option("--force", help="Recompute every cell even when cached.")] = False,
) -> None:
    """Run a reproduction plan: accuracy with CIs per task and method, efficiency, instance and position sweeps, ablations."""
    input_file(plan, "the plan")
    claim = OutputOptions(out).claim("reproduce", resume=True)
    assert claim is not None  # reproduce is never run under torchrun
    with claim:
        from anchorlens.workflows.reproduce import reproduce as run_reproduce

        result = run_reproduce(plan, claim, smoke=smoke, force=force, log=lambda msg: typer.echo(msg, err=True))
    typer.echo(
        f"{len(result.ran)} cells run, {len(result.reused)} reused; tables in {result.out / 'tables'}, "
        f"summary in {result.out / 'summary.md'}"
    )
    typer.echo(
        result.tables["accuracy"].drop(columns=["seed_sd"]).to_string(index=False, float_format=lambda v: f"{v:.3f}")
    )
