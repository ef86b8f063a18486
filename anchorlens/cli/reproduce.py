"""``anchorlens reproduce``: run a declared plan and write the paper-style tables (register on the app)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from anchorlens.cli.options import usage_errors


@usage_errors
def reproduce(
    plan: Annotated[Path, typer.Argument(help="Plan TOML (tasks x methods x seeds x budget), e.g. examples/reproduce-cpu.toml.")],
    out: Annotated[Path, typer.Option("--out", help="Output directory; cells already in OUT/cells are reused (resumable).")] = Path("anchorlens-reproduce"),
    smoke: Annotated[bool, typer.Option("--smoke", help="Run the plan's [smoke] size (CI: seconds to a minute).")] = False,
    force: Annotated[bool, typer.Option("--force", help="Recompute every cell even when cached.")] = False,
) -> None:
    """Run a reproduction plan: accuracy with CIs per task and method, efficiency, instance and position sweeps, ablations."""
    from anchorlens.workflows.reproduce import reproduce as run_reproduce

    result = run_reproduce(plan, out, smoke=smoke, force=force, log=lambda msg: typer.echo(msg, err=True))
    typer.echo(f"{len(result.ran)} cells run, {len(result.reused)} reused; tables in {result.out / 'tables'}, "
               f"summary in {result.out / 'summary.md'}")
    typer.echo(result.tables["accuracy"].drop(columns=["seed_sd"]).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
