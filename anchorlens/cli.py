"""The ``anchorlens`` command line: thin typer commands over the workflows and reports."""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from anchorlens.errors import UsageError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=False,
    invoke_without_command=True,
    help="Measure attention anchors (instance tokens, CaPT capsules, soft prompts) in language models.",
    pretty_exceptions_enable=False,
)

Base_ = Annotated[str, typer.Option("--base", help="Base model: smollm2-135m (embedded), tiny-llama/-qwen2/-gpt2/-bert/-t5, or a local HF dir.")]
Task_ = Annotated[str, typer.Option("--task", help="SuperGLUE task: rte, cb, boolq, copa, wic, wsc, multirc.")]
Data_ = Annotated[Optional[Path], typer.Option("--data", help="SuperGLUE jsonl file (default: the bundled examples).")]
N_ = Annotated[Optional[int], typer.Option("--n", "--limit", help="Use the first N examples (--limit under torchrun, which claims --n).")]
Layers_ = Annotated[Optional[str], typer.Option("--layers", help="Layers to capture, e.g. 0,5-8,-1 (default all).")]
Heads_ = Annotated[Optional[str], typer.Option("--heads", help="Heads to capture, e.g. 0-3 (default all).")]
Batch_ = Annotated[int, typer.Option("--batch-size", min=1, help="Examples per forward pass.")]
Dtype_ = Annotated[str, typer.Option("--dtype", help="float32 or bfloat16.")]
Force_ = Annotated[bool, typer.Option("--force", help="Replace an existing output directory.")]
Device_ = Annotated[Optional[str], typer.Option("--device", help="cpu (default), cuda:0, or auto (spread a large base over the node's GPUs).")]


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def usage_errors(fn: Callable) -> Callable:
    """Turn UsageError (and missing files) into a one-line message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UsageError as err:
            _fail(str(err))
        except FileNotFoundError as err:
            _fail(f"{err.filename}: no such file or directory")
        except KeyboardInterrupt:
            typer.secho("interrupted", err=True)
            raise typer.Exit(130)
        except (typer.Exit, SystemExit):
            raise
        except Exception as err:  # an anchorlens bug: one line, full traceback on request
            if os.environ.get("ANCHORLENS_DEBUG"):
                raise
            typer.secho(f"internal error: {type(err).__name__}: {err} (rerun with ANCHORLENS_DEBUG=1 for the traceback)",
                        fg=typer.colors.RED, err=True)
            raise typer.Exit(1)

    return wrapper


def _selection(layers: str | None, heads: str | None):
    from anchorlens.capture.selection import Selection, parse_layers

    try:
        return Selection(layers=parse_layers(layers), heads=parse_layers(heads))
    except ValueError:
        raise UsageError(f"cannot parse --layers {layers!r} / --heads {heads!r}; use forms like 0,2,5-8,-1") from None


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Show warnings as ``warning: ...`` on stderr, without source lines."""
    print(f"warning: {message}", file=file or sys.stderr)


@app.callback()
def root(ctx: typer.Context) -> None:
    """Without a command: run the demo on the embedded SmolLM2 and the bundled RTE examples."""
    import warnings

    warnings.showwarning = _one_line_warning
    if ctx.invoked_subcommand is None:
        demo()


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


Ckpts_ = Annotated[list[str], typer.Option("--ckpt", help="Checkpoint spec (repeat): base, instance, instance:k=2,pos=middle, capsule, a checkpoint dir or a PEFT dir.")]


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
    from anchorlens.reports.comparison import write_comparison
    from anchorlens.rundir import check_writable
    from anchorlens.reports.tables import headline_grid, to_text
    from anchorlens.workflows.compare import compare as run_compare

    from anchorlens import runtime as rt

    check_writable(out, force)  # fail before minutes of capture, not after
    started = rt.init_if_needed()  # under torchrun / accelerate launch: examples are sharded across ranks
    try:
        result = run_compare(ckpt, base=base, task=task, data=data, n=n, selection=_selection(layers, heads),
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
    sweep = sweep_positions(ckpt, positions, base=base, task=task, data=data, n=n, selection=_selection(layers, heads),
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

    path = run_capture(ckpt, base, task, data, n, _selection(layers, heads), batch_size, out, force,
                       chunk_size=chunk_size, progress=not no_progress, dtype=dtype, max_length=max_length,
                       device=device)
    from anchorlens.runtime import is_main

    if is_main():
        typer.echo(f"wrote {path}/metrics.parquet", err=True)


def _ints(text: str, what: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{what} must be comma-separated integers, got {text!r}") from None


@app.command()
@usage_errors
def train(
    method: Annotated[str, typer.Option("--method", help="prompt (n=100), prompt:n=20, deep-prompt:n=10, capsule, capsule:fusion=prepend ...")],
    out: Annotated[Path, typer.Option("--out", help="Run directory (checkpoints/, final/, history.csv, summary.json).")],
    task: Task_ = "rte",
    data: Data_ = None,
    eval_data: Annotated[Optional[Path], typer.Option("--eval", help="Eval jsonl (default: a seeded 10% split of --data).")] = None,
    base: Base_ = "smollm2-135m",
    steps: Annotated[Optional[int], typer.Option("--steps", min=1, help="Optimizer steps (default 250 unless --epochs).")] = None,
    epochs: Annotated[Optional[float], typer.Option("--epochs", min=0.0, help="Epochs over the training split.")] = None,
    lr: Annotated[float, typer.Option("--lr", help="Learning rate.")] = 1e-2,
    batch_size: Batch_ = 8,
    grad_accum: Annotated[int, typer.Option("--grad-accum", min=1, help="Gradient accumulation steps.")] = 1,
    optimizer: Annotated[str, typer.Option("--optimizer", help="adamw or adafactor.")] = "adamw",
    seed: Annotated[int, typer.Option("--seed", help="Seed for init, split and data order.")] = 0,
    eval_every: Annotated[int, typer.Option("--eval-every", min=1, help="Evaluate (and checkpoint) every K steps.")] = 50,
    patience: Annotated[Optional[int], typer.Option("--patience", help="Early-stopping patience in evaluations.")] = 5,
    n: N_ = None,
    max_length: Annotated[int, typer.Option("--max-length", min=16, help="Truncate inputs (longest field first) to this many tokens.")] = 384,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the latest checkpoint in --out.")] = False,
    force: Force_ = False,
) -> None:
    """Train guidance parameters only (the base stays frozen); resumable; writes a checkpoint dir."""
    from anchorlens.workflows.train import train as run_train

    run = run_train(method, task, data, eval_data, base=base, steps=steps, epochs=epochs, lr=lr, batch_size=batch_size,
                    grad_accum=grad_accum, optimizer=optimizer, seed=seed, out=out, resume=resume, force=force,
                    eval_every=eval_every, patience=patience, n=n, max_length=max_length)
    s = run.summary
    typer.echo(f"{method}: {s['num_trainable']:,} trainable parameters, {s['steps']} steps, "
               f"{s['time_per_step_s']:.3f} s/step, best eval accuracy {s['best_eval_accuracy']:.3f}; checkpoint {out}/final")


@app.command()
@usage_errors
def evaluate(
    ckpt: Annotated[str, typer.Option("--ckpt", help="Checkpoint spec (base, instance, a checkpoint dir, a PEFT dir...).")],
    out: Annotated[Optional[Path], typer.Option("--out", help="Write predictions.csv and metrics.json here.")] = None,
    task: Task_ = "rte",
    data: Data_ = None,
    n: N_ = None,
    base: Annotated[Optional[str], typer.Option("--base", help="Base model (default: the checkpoint's own, else smollm2-135m).")] = None,
    batch_size: Batch_ = 8,
    force: Force_ = False,
) -> None:
    """Accuracy (and the task's metrics) of a checkpoint; per-example predictions saved with --out."""
    from anchorlens.workflows.evaluate import evaluate as run_evaluate

    if out is not None:
        from anchorlens.rundir import check_writable

        check_writable(out, force)
    result = run_evaluate(ckpt, task, data, n, base, batch_size=batch_size, out=out, force=force, progress=True)
    m = result.metrics
    lo, hi = m["accuracy_ci95"]
    extra = "  ".join(f"{k}={m[k]:.3f}" for k in ("macro_f1", "f1a", "em") if k in m)
    typer.echo(f"{ckpt} on {m['task']}: accuracy {m['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] (n={m['num_examples']}) {extra}".rstrip())


@app.command()
@usage_errors
def params(
    ckpt: Annotated[list[str], typer.Option("--ckpt", help="Checkpoint spec (repeat).")],
    base: Base_ = "smollm2-135m",
) -> None:
    """Trainable parameters of each checkpoint spec and their share of the base."""
    from anchorlens.models.loading import load_base
    from anchorlens.workflows.models import load_model

    shared = load_base(base)
    total = shared.num_parameters()
    typer.echo(f"{base}: {total:,} parameters")
    for spec in ckpt:
        model = load_model(spec, shared)
        rows = getattr(model, "parameter_report", lambda: [])()
        trainable = sum(r["trainable"] for r in rows)
        detail = "; ".join(f"{r['method']}: {r['trainable']:,}" for r in rows) or "no guidance"
        typer.echo(f"  {spec:<28} {trainable:>10,}  {100 * trainable / total:.4f}%  ({detail})")


sweep_app = typer.Typer(help="Reproduce the paper's sweeps: instance tokens (count x position) and prompt length.")
app.add_typer(sweep_app, name="sweep")


@sweep_app.command("instance")
@usage_errors
def sweep_instance_cmd(
    ckpt: Annotated[str, typer.Option("--ckpt", help="Spec to add instance tokens to (base, a prompt-tuned checkpoint...).")] = "base",
    k: Annotated[str, typer.Option("--k", help="Numbers of instance tokens, e.g. 0,1,2,4.")] = "0,1,2,4",
    positions: Annotated[str, typer.Option("--positions", help="Positions, e.g. first,last.")] = "first,last",
    out: Annotated[Path, typer.Option("--out", help="Output directory.")] = Path("anchorlens-sweep-instance"),
    task: Task_ = "rte",
    data: Data_ = None,
    n: N_ = None,
    base: Annotated[Optional[str], typer.Option("--base", help="Base model (default: the checkpoint's own, else smollm2-135m).")] = None,
    batch_size: Batch_ = 8,
    force: Force_ = False,
) -> None:
    """Training-free instance tokens: accuracy and anchor metrics per (k, position) (paper Fig. 2)."""
    from anchorlens.rundir import check_writable
    from anchorlens.reports.sweeps import write_sweep
    from anchorlens.workflows.positions import parse_positions
    from anchorlens.workflows.sweeps import sweep_instance

    check_writable(out, force)
    table = sweep_instance(ckpt, task, data, _ints(k, "--k"), parse_positions(positions), base=base, n=n,
                           batch_size=batch_size, anchors=True)
    facts = {"spec": ckpt, "task": task, "data": str(data or "bundled"), "examples": int(table["n"].iloc[0])}
    write_sweep(table, out, kind="instance", x="k", by="position", facts=facts, force=force,
                extra_metrics=("anchor_mass", "anchor_structural", "first_token_mass"))
    typer.echo(table.drop(columns=["spec"]).to_string(index=False, float_format=lambda v: f"{v:.3f}"))


@sweep_app.command("length")
@usage_errors
def sweep_length_cmd(
    method: Annotated[str, typer.Option("--method", help="prompt or deep-prompt.")] = "prompt",
    lengths: Annotated[str, typer.Option("--lengths", help="Prompt lengths, e.g. 1,5,20,100.")] = "1,5,20,100",
    out: Annotated[Path, typer.Option("--out", help="Output directory (one training run per length inside).")] = Path("anchorlens-sweep-length"),
    task: Task_ = "rte",
    data: Data_ = None,
    eval_data: Annotated[Optional[Path], typer.Option("--eval", help="Eval jsonl (default: a seeded 10% split).")] = None,
    base: Base_ = "smollm2-135m",
    steps: Annotated[int, typer.Option("--steps", min=1, help="Steps per length.")] = 100,
    lr: Annotated[float, typer.Option("--lr", help="Learning rate.")] = 1e-2,
    batch_size: Batch_ = 8,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    n: N_ = None,
    force: Force_ = False,
) -> None:
    """Train one soft prompt per length; accuracy, parameters and time per step vs length."""
    import shutil
    import tempfile

    from anchorlens.rundir import check_writable
    from anchorlens.reports.sweeps import write_sweep
    from anchorlens.workflows.sweeps import sweep_length

    check_writable(out, force)
    runs = Path(tempfile.mkdtemp(prefix="anchorlens-sweep-"))
    try:
        table = sweep_length(method, _ints(lengths, "--lengths"), task, data, eval_data, base=base, out=runs / "runs",
                             steps=steps, lr=lr, batch_size=batch_size, seed=seed, n=n, progress=False)
        facts = {"method": method, "task": task, "data": str(data or "bundled"), "steps": steps, "lr": lr, "seed": seed}
        write_sweep(table, out, kind="length", x="length", by=None, facts=facts, force=force)
        shutil.move(str(runs / "runs"), str(out / "runs"))
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    typer.echo(table.drop(columns=["spec"]).to_string(index=False, float_format=lambda v: f"{v:.3f}"))


def main() -> None:
    """Console-script entry point."""
    app(prog_name="anchorlens")


if __name__ == "__main__":
    sys.exit(main())
