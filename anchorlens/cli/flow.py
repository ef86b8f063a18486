"""``anchorlens flow RUN``: per layer, where the queries of one role attend, over the run's own roles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from anchorlens.cli.app import app
from anchorlens.cli.options import cli_command, input_dir
from anchorlens.errors import DataError, UsageError


def _run_roles(run: Path) -> list[str] | None:
    """The role table a run recorded in its manifest (None for runs written before roles were recorded)."""
    manifest = run / "manifest.json"
    if not manifest.is_file():
        return None
    try:
        data = json.loads(manifest.read_text())
    except (ValueError, UnicodeDecodeError):
        raise DataError(f"{manifest} is damaged (not JSON); re-run the command that wrote {run}") from None
    if not isinstance(data, dict):
        raise DataError(f"{manifest} is damaged (not a JSON object); re-run the command that wrote {run}")
    roles = data.get("roles") or (data.get("facts") or {}).get("roles")
    return list(roles["names"]) if isinstance(roles, dict) and "names" in roles else None


@app.command()
@cli_command
def flow(
    run_dir: Annotated[Path, typer.Argument(help="A run written by `anchorlens capture` or `anchorlens compare`.")],
    queries: Annotated[
        str, typer.Option("--queries", help="Query role: content, structural, scaffold... (or input, all).")
    ] = "input",
    checkpoint: Annotated[
        str | None, typer.Option("--checkpoint", help="Which checkpoint of a compare run (default: each in turn).")
    ] = None,
    stack: Annotated[str | None, typer.Option("--stack", help="decoder, encoder, cross (default: the first).")] = None,
) -> None:
    """Per layer, the mean attention mass queries of one role put on each key role of the run."""
    run = input_dir(run_dir, "the run")
    path = run / "metrics.parquet"
    if not path.is_file():
        raise UsageError(f"{run} has no metrics.parquet; pass a directory written by capture or compare")
    import pandas as pd

    from anchorlens.analyses.flow import flow_by_layer

    try:
        metrics = pd.read_parquet(path, filters=[("metric", "==", "role_flow")])
    except Exception as err:  # a damaged parquet file
        raise DataError(f"{path}: cannot read ({' '.join(str(err).split())[:200]})") from None
    roles = _run_roles(run)
    names: list[str | None] = [None]
    if "checkpoint" in metrics.columns:
        known = list(dict.fromkeys(metrics["checkpoint"]))
        if checkpoint is not None and checkpoint not in known:
            raise UsageError(f"--checkpoint {checkpoint!r} is not in this run; checkpoints: {', '.join(known)}")
        names = [checkpoint] if checkpoint is not None else list(known)
    for name in names:
        part = metrics if name is None else metrics[metrics["checkpoint"] == name]
        try:
            table = flow_by_layer(part, queries, roles=roles, stack=stack)
        except ValueError as err:
            raise UsageError(str(err)) from None
        title = f"{name}: " if name is not None else ""
        typer.echo(f"{title}attention of {queries} queries by key role (mean over examples and heads; rows sum to 1)")
        typer.echo(table.to_string(float_format=lambda v: f"{v:.3f}"))
