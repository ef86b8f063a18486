"""Commands that measure attention: demo, compare, figures, positions, capture, params."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from anchorlens.cli.app import app
from anchorlens.cli.options import (
    N_,
    Base_,
    Batch_,
    Ckpts_,
    Data_,
    Device_,
    Dtype_,
    Force_,
    Heads_,
    Layers_,
    Task_,
    selection_of,
    usage_errors,
)


@app.command()
@usage_errors
def demo(base: Base_ = "smollm2-135m", task: Task_ = "rte", n: N_ = None, batch_size: Batch_ = 8) -> None:
    """Per-layer attention to the first token and to structural tokens on bundled examples."""
    from anchorlens.models.loading import load_base
    from anchorlens.workflows.demo import format_table, per_layer_table
    from anchorlens.workflows.inputs import resolve_inputs
    from anchorlens.workflows.statistics import capture_statistics

    inputs = resolve_inputs(task, None, n)
    typer.echo(f"loading {base} ...", err=True)
    model = load_base(base)
    typer.echo(f"capturing attention on {len(inputs.examples)} {inputs.task.name} examples ({inputs.source}) ...", err=True)
    metrics = capture_statistics(model, inputs, batch_size=batch_size)
    title = f"{base} on {len(inputs.examples)} {inputs.task.name} examples: mean over examples and heads"
    typer.echo(format_table(per_layer_table(metrics), title))


@app.command()
@usage_errors
def compare(
    ckpt: Ckpts_,
    out: Annotated[Path, typer.Option("--out", help="Output directory (refused if it exists, unless --force).")] = Path("anchorlens-compare"),
    base: Base_ = "smollm2-135m",
    task: Task_ = "rte",
    data: Data_ = None,
    n: N_ = None,
    layers: Layers_ = None,
    heads: Heads_ = None,
    batch_size: Batch_ = 8,
    map_example: Annotated[int, typer.Option("--map-example", help="Index of the example drawn in the attention-map figure.")] = 0,
    dtype: Dtype_ = "float32",
    device: Device_ = None,
    force: Force_ = False,
) -> None:
    """Compare 2+ checkpoints on the same inputs; writes metrics, summary.md, figures/ and report.html."""
    from anchorlens import runtime as rt
    from anchorlens.reports.comparison import write_comparison
    from anchorlens.reports.tables import headline_grid, to_text
    from anchorlens.rundir import check_writable
    from anchorlens.workflows.compare import compare as run_compare

    check_writable(out, force)  # fail before minutes of capture, not after
    started = rt.init_if_needed()  # under torchrun / accelerate launch: examples are sharded across ranks
    try:
        result = run_compare(ckpt, base=base, task=task, data=data, n=n, selection=selection_of(layers, heads),
                             batch_size=batch_size, map_example=map_example, dtype=dtype, device=device,
                             progress=rt.is_main())
        if rt.is_main():
            write_comparison(result, out, force)
            typer.echo(to_text(headline_grid(result.headline, result.checkpoints)))
            typer.echo(f"wrote {out}/ (metrics.parquet, summary.md, figures/, report.html)", err=True)
        rt.barrier()
    finally:
        rt.shutdown(started)


@app.command()
@usage_errors
def figures(
    run_dir: Annotated[Path, typer.Argument(help="A directory written by `anchorlens compare`.")],
    out: Annotated[Optional[Path], typer.Option("--out", help="Where to write (default RUN_DIR/figures).")] = None,
    force: Force_ = False,
) -> None:
    """Redraw every figure of a compare run from its saved metrics and maps."""
    from anchorlens.reports.comparison import load_comparison, write_figures
    from anchorlens.rundir import check_writable

    result = load_comparison(run_dir)
    target = out or run_dir / "figures"
    check_writable(target, force)
    written = write_figures(result, target)
    typer.echo(f"wrote {len(written)} figures (png + pdf) to {target}/")


@app.command()
@usage_errors
def positions(
    ckpt: Annotated[str, typer.Option("--ckpt", help="Spec or checkpoint with a capsule or instance token (e.g. instance, capsule, runs/capsule).")],
    positions: Annotated[str, typer.Option("--positions", help="Comma-separated: first, after_structural, middle, last, or token indices.")] = "first,middle,last",
    out: Annotated[Path, typer.Option("--out", help="Output directory (refused if it exists, unless --force).")] = Path("anchorlens-positions"),
    base: Base_ = "smollm2-135m",
    task: Task_ = "rte",
    data: Data_ = None,
    n: N_ = None,
    layers: Layers_ = None,
    heads: Heads_ = None,
    batch_size: Batch_ = 8,
    dtype: Dtype_ = "float32",
    force: Force_ = False,
) -> None:
    """Sweep the capsule/instance position; writes metrics, positions.csv, summary.md and figures/."""
    from anchorlens.reports.positions import position_grid, write_positions
    from anchorlens.rundir import check_writable
    from anchorlens.workflows.positions import sweep_positions

    check_writable(out, force)
    sweep = sweep_positions(ckpt, positions, base=base, task=task, data=data, n=n, selection=selection_of(layers, heads),
                            batch_size=batch_size, dtype=dtype)
    write_positions(sweep, out, force)
    typer.echo(position_grid(sweep.summary, sweep.positions).to_string())
    typer.echo(f"wrote {out}/", err=True)


@app.command()
@usage_errors
def capture(
    ckpt: Annotated[str, typer.Option("--ckpt", help="Checkpoint spec: base, instance, capsule, a checkpoint dir or a PEFT dir.")],
    out: Annotated[Path, typer.Option("--out", help="Output directory; re-running the same command resumes an interrupted run.")] = Path("anchorlens-capture"),
    base: Base_ = "smollm2-135m",
    task: Task_ = "rte",
    data: Data_ = None,
    n: N_ = None,
    layers: Layers_ = None,
    heads: Heads_ = None,
    batch_size: Batch_ = 8,
    chunk_size: Annotated[int, typer.Option("--chunk-size", min=1, help="Examples per saved progress shard.")] = 32,
    max_length: Annotated[Optional[int], typer.Option("--max-length", min=2, help="Truncate inputs to this many tokens.")] = None,
    dtype: Dtype_ = "float32",
    device: Device_ = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a finished run / discard unfinished progress.")] = False,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="No progress bar.")] = False,
) -> None:
    """Stream attention statistics into OUT/metrics.parquet; sharded under torchrun, resumable after a kill."""
    from anchorlens.workflows.capture_run import run_capture

    path = run_capture(ckpt, base, task, data, n, selection_of(layers, heads), batch_size, out, force,
                       chunk_size=chunk_size, progress=not no_progress, dtype=dtype, max_length=max_length,
                       device=device)
    from anchorlens.runtime import is_main

    if is_main():
        typer.echo(f"wrote {path}/metrics.parquet", err=True)


@app.command()
@usage_errors
def params(
    ckpt: Annotated[list[str], typer.Option("--ckpt", help="Checkpoint spec (repeat).")],
    base: Base_ = "smollm2-135m",
) -> None:
    """Trainable parameters of each checkpoint spec and their share of the base."""
    from anchorlens.methods.spec import load_guided
    from anchorlens.models.loading import load_base

    shared = load_base(base)
    total = shared.num_parameters()
    typer.echo(f"{base}: {total:,} parameters")
    for spec in ckpt:
        model = load_guided(spec, shared)
        rows = getattr(model, "parameter_report", lambda: [])()
        trainable = sum(r["trainable"] for r in rows)
        detail = "; ".join(f"{r['method']}: {r['trainable']:,}" for r in rows) or "no guidance"
        typer.echo(f"  {spec:<28} {trainable:>10,}  {100 * trainable / total:.4f}%  ({detail})")

