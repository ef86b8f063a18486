"""Commands that train and score: train, evaluate, sweep instance, sweep length."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from anchorlens.cli.app import app, sweep_app
from anchorlens.cli.options import Base_, Batch_, Data_, Force_, N_, Task_, parse_ints, usage_errors


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
    table = sweep_instance(ckpt, task, data, parse_ints(k, "--k"), parse_positions(positions), base=base, n=n,
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
        table = sweep_length(method, parse_ints(lengths, "--lengths"), task, data, eval_data, base=base, out=runs / "runs",
                             steps=steps, lr=lr, batch_size=batch_size, seed=seed, n=n, progress=False)
        facts = {"method": method, "task": task, "data": str(data or "bundled"), "steps": steps, "lr": lr, "seed": seed}
        write_sweep(table, out, kind="length", x="length", by=None, facts=facts, force=force)
        shutil.move(str(runs / "runs"), str(out / "runs"))
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    typer.echo(table.drop(columns=["spec"]).to_string(index=False, float_format=lambda v: f"{v:.3f}"))

