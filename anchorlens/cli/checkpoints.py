"""``anchorlens checkpoints``: the trained checkpoints shipped with the package, or one's full record."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from anchorlens.cli.app import app
from anchorlens.cli.options import cli_command
from anchorlens.errors import UsageError


def _validation(training: dict[str, Any]) -> str:
    """``0.862 [0.838, 0.884] (n=872, glue SST-2 validation)`` or ``-`` when not recorded."""
    val = training.get("validation") or {}
    if "accuracy" not in val:
        return "-"
    low, high = val.get("interval", (float("nan"), float("nan")))
    return f"{val['accuracy']:.3f} [{low:.3f}, {high:.3f}] (n={val.get('n', '?')})"


def checkpoint_lines(shipped: list) -> list[str]:
    """A markdown table: address, method, trainable parameters, steps, seed, time per step, validation accuracy."""
    lines = [
        "| checkpoint | method | trainable | steps | seed | s/step | validation accuracy [95% CI] |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for ckpt in shipped:
        t = ckpt.training
        lines.append(
            f"| {ckpt.address} | {t.get('method_spec', '-')} | {ckpt.meta.get('num_trainable', 0):,} | "
            f"{t.get('steps', '-')} | {ckpt.meta.get('seed', '-')} | {t.get('time_per_step_s', float('nan')):.2f} | "
            f"{_validation(t)} |"
        )
    return lines


@app.command()
@cli_command
def checkpoints(
    name: Annotated[
        str | None, typer.Argument(help="A shipped checkpoint NAME@TASK (e.g. capsule@sst2): print its full record.")
    ] = None,
    task: Annotated[
        str | None, typer.Option("--task", help="Only the checkpoints trained on this task (e.g. sst2).")
    ] = None,
) -> None:
    """List the trained checkpoints shipped with anchorlens (use them as --ckpt NAME@TASK); or one's record."""
    from anchorlens.methods.shipped import list_checkpoints, shipped_checkpoint

    if name is not None:
        typer.echo(json.dumps(shipped_checkpoint(name).meta, indent=2))
        return
    shipped = list_checkpoints()
    if task is not None:
        tasks = sorted({c.task for c in shipped})
        shipped = [c for c in shipped if c.task == task.strip().lower()]
        if not shipped:
            raise UsageError(
                f"--task {task}: no shipped checkpoint was trained on it; shipped tasks: {', '.join(tasks)}"
            )
    if not shipped:
        typer.echo("no trained checkpoints ship with this installation")
        return
    typer.echo("shipped checkpoints (use as --ckpt NAME@TASK; `anchorlens checkpoints NAME@TASK` prints one's record):")
    typer.echo("\n".join(checkpoint_lines(shipped)))
