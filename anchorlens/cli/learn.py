"""Commands that train and score: train, evaluate, sweep instance, sweep length."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from anchorlens.cli.app import app, sweep_app
from anchorlens.cli.options import (
    BatchOptions,
    FigureOptions,
    ModelOptions,
    OutputOptions,
    OwnBaseModelOptions,
    ScoringOptions,
    TrainingOptions,
    TruncatedDataOptions,
    cli_command,
    input_file,
    parse_ints,
)
from anchorlens.cli.values import at_least, non_negative
from anchorlens.progress import stage

DEFAULT_MAX_LENGTH = 384  # evaluation.DEFAULT_MAX_LENGTH, named here so argument checks need no torch

Eval_ = Annotated[Path | None, typer.Option("--eval", help="Eval jsonl (default: a seeded 10% split of --data).")]


def _max_length(data: TruncatedDataOptions) -> int:
    """--max-length, or the training/evaluation default."""
    return DEFAULT_MAX_LENGTH if data.max_length is None else data.max_length


def _check_eval(eval_data: Path | None, data: TruncatedDataOptions) -> None:
    """Read --eval now (labels required) so a bad file fails before the model loads."""
    if eval_data is not None:
        from anchorlens.workflows.inputs import resolve_inputs

        resolve_inputs(data.task, input_file(eval_data, "--eval"), need_labels=True, **data.input_kwargs())


@app.command()
@cli_command
def train(
    method: Annotated[
        str,
        typer.Option(
            "--method", help="prompt (n=100), prompt:n=20, deep-prompt:n=10, capsule, capsule:fusion=prepend ..."
        ),
    ],
    output: OutputOptions,
    model: ModelOptions,
    data: TruncatedDataOptions,
    batch: BatchOptions,
    training: TrainingOptions,
    eval_data: Eval_ = None,
    epochs: Annotated[
        float | None,
        typer.Option("--epochs", parser=non_negative, metavar="EPOCHS", help="Epochs over the training split."),
    ] = None,
    grad_accum: Annotated[
        int, typer.Option("--grad-accum", parser=at_least(1), metavar="STEPS", help="Gradient accumulation steps.")
    ] = 1,
    optimizer: Annotated[str, typer.Option("--optimizer", help="adamw or adafactor.")] = "adamw",
    eval_every: Annotated[
        int,
        typer.Option(
            "--eval-every", parser=at_least(1), metavar="STEPS", help="Evaluate (and checkpoint) every K steps."
        ),
    ] = 50,
    patience: Annotated[
        int | None,
        typer.Option("--patience", parser=at_least(1), metavar="EVALS", help="Early-stopping patience in evaluations."),
    ] = 5,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the latest checkpoint in --out.")] = False,
    group_by_length: Annotated[
        bool,
        typer.Option(
            "--group-by-length",
            help="Batch examples of similar token length (less padding, ~2x faster on RTE; order still seeded).",
        ),
    ] = False,
) -> None:
    """Train guidance parameters only (the base stays frozen); resumable; writes a checkpoint dir."""
    claim = output.claim("train", resume=resume, inputs=[model.base, *data.sources, eval_data])
    assert claim is not None  # train is never run under torchrun
    with claim:
        data.read(need_labels=True)
        _check_eval(eval_data, data)
        from anchorlens.workflows.train import train as run_train

        with stage(f"loading {model.base}"):
            base = model.load()
        run = run_train(
            method,
            data.task,
            data.data,
            eval_data,
            base=base,
            epochs=epochs,
            batch_size=batch.size(model.device),
            grad_accum=grad_accum,
            optimizer=optimizer,
            out=claim,
            resume=resume,
            force=output.force,
            eval_every=eval_every,
            patience=patience,
            group_by_length=group_by_length,
            n=data.n,
            max_length=_max_length(data),
            **data.input_kwargs(),
            **training.train_kwargs(),
        )
    s = run.summary
    typer.echo(
        f"{method}: {s['num_trainable']:,} trainable parameters, {s['steps']} steps, "
        f"{s['time_per_step_s']:.3f} s/step, best eval accuracy {s['best_eval_accuracy']:.3f}; "
        f"checkpoint {output.out}/final"
    )


@app.command()
@cli_command
def evaluate(
    ckpt: Annotated[
        str, typer.Option("--ckpt", help="Checkpoint spec (base, instance, a checkpoint dir, a PEFT dir...).")
    ],
    model: OwnBaseModelOptions,
    data: TruncatedDataOptions,
    batch: BatchOptions,
    output: OutputOptions = OutputOptions(None),  # type: ignore[arg-type]  # no --out: print only
    answers: ScoringOptions = ScoringOptions(),
) -> None:
    """Accuracy (and the task's metrics) of a checkpoint; per-example predictions saved with --out."""
    reads = [ckpt, model.base, *data.sources]
    claim = output.claim("evaluate", inputs=reads) if output.out is not None else None
    try:
        data.read(need_labels=True)
        from anchorlens.workflows.evaluate import evaluate as run_evaluate

        base = model.load_or_own()
        result = run_evaluate(
            ckpt,
            data.task,
            data.data,
            data.n,
            base,
            batch_size=batch.size(model.device),
            max_length=_max_length(data),
            out=claim,
            force=output.force,
            progress=True,
            allow_other_base=model.allow_other_base,
            **answers.workflow_kwargs(),
            **data.input_kwargs(),
        )
    finally:
        if claim is not None:
            claim.release()
    typer.echo(evaluation_line(ckpt, result.metrics))


def evaluation_line(ckpt: str, m: dict) -> str:
    """evaluate's summary: accuracy with its CI, acc_norm with its CI when the whole answers were scored (sum), the
    number of examples, the label NLL and the task's own metrics, and the scoring used."""
    lo, hi = m["accuracy_ci95"]
    norm = ""
    if m.get("scoring") == "sum" and "acc_norm" in m:
        norm_lo, norm_hi = m.get("acc_norm_ci95", (float("nan"), float("nan")))
        norm = f"  acc_norm {m['acc_norm']:.3f} [{norm_lo:.3f}, {norm_hi:.3f}]"
    extra = [f"{k}={m[k]:.3f}" for k in ("macro_f1", "f1a", "em") if k in m]
    if "label_nll" in m:
        nll_lo, nll_hi = m["label_nll_ci95"]
        extra.insert(0, f"label NLL {m['label_nll']:.3f} [{nll_lo:.3f}, {nll_hi:.3f}]")
    if m.get("scoring"):
        extra.append(f"scoring {m['scoring']}")
    return (
        f"{ckpt} on {m['task']}: accuracy {m['accuracy']:.3f} [{lo:.3f}, {hi:.3f}]{norm} "
        f"(n={m['num_examples']}) {'  '.join(extra)}".rstrip()
    )


@sweep_app.command("instance")
@cli_command
def sweep_instance_cmd(
    model: OwnBaseModelOptions,
    data: TruncatedDataOptions,
    batch: BatchOptions,
    ckpt: Annotated[
        str,
        typer.Option(
            "--ckpt",
            help="Prompt-tuned checkpoint to add instance tokens to (paper Finding "
            "II adds them to a prompt-tuned model, e.g. runs/prompt/final); "
            "'base' measures them on the bare base.",
        ),
    ],
    k: Annotated[str, typer.Option("--k", help="Numbers of instance tokens, e.g. 0,1,2,4.")] = "0,1,2,4",
    positions: Annotated[str, typer.Option("--positions", help="Positions, e.g. first,last.")] = "first,last",
    output: OutputOptions = OutputOptions(Path("anchorlens-sweep-instance")),
    figures: FigureOptions = FigureOptions(),
) -> None:
    """Training-free instance tokens added to a prompt-tuned checkpoint: accuracy and anchor metrics per (k, position) (paper Finding II, Fig. 2)."""
    counts = parse_ints(k, "--k")
    claim = output.claim("sweep-instance", inputs=[ckpt, model.base, *data.sources])
    assert claim is not None  # sweeps are never run under torchrun
    with claim:
        data.read(need_labels=True)
        from anchorlens.reports.sweeps import write_sweep
        from anchorlens.workflows.positions import parse_positions
        from anchorlens.workflows.sweeps import sweep_instance

        where = parse_positions(positions)
        base = model.load_or_own()
        with stage(f"sweeping {len(counts)} counts x {len(where)} positions"):
            table = sweep_instance(
                ckpt,
                data.task,
                data.data,
                counts,
                where,
                base=base,
                n=data.n,
                batch_size=batch.size(model.device),
                max_length=_max_length(data),
                anchors=True,
                **data.input_kwargs(),
            )
        facts = {
            "spec": ckpt,
            "task": data.task,
            "data": str(data.data or "bundled"),
            "examples": int(table["n"].iloc[0]),
        }
        with stage("writing tables and figures"):
            write_sweep(
                table,
                claim,
                kind="instance",
                x="k",
                by="position",
                facts=facts,
                extra_metrics=("anchor_mass", "anchor_structural", "sink_mass"),
                **figures.writer_kwargs(),
            )
    typer.echo(table.drop(columns=["spec"]).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    typer.echo(f"wrote {output.out}/", err=True)


@sweep_app.command("knockout")
@cli_command
def sweep_knockout_cmd(
    model: OwnBaseModelOptions,
    data: TruncatedDataOptions,
    batch: BatchOptions,
    ckpt: Annotated[
        str, typer.Option("--ckpt", help="The model whose anchor is knocked out, e.g. instance or runs/capsule/final.")
    ],
    keys: Annotated[
        str, typer.Option("--keys", help="Keys knocked out: a role (instance, capsule, ...), first or pos=N.")
    ] = "instance",
    window: Annotated[
        int, typer.Option("--window", parser=at_least(1), metavar="LAYERS", help="Layers knocked out together.")
    ] = 1,
    mode: Annotated[
        str, typer.Option("--mode", help="renorm, zero, value or mean (see the knockout spec).")
    ] = "renorm",
    output: OutputOptions = OutputOptions(Path("anchorlens-sweep-knockout")),
    figures: FigureOptions = FigureOptions(),
) -> None:
    """Knock the anchor's keys out one layer (or --window layers) at a time: ΔNLL and Δaccuracy per layer with CIs."""
    claim = output.claim("sweep-knockout", inputs=[ckpt, model.base, *data.sources])
    assert claim is not None  # sweeps are never run under torchrun
    with claim:
        data.read()
        from anchorlens.reports.sweeps import write_sweep
        from anchorlens.workflows.sweeps import sweep_knockout

        base = model.load_or_own()
        with stage(f"knocking {keys} out of {ckpt}, {window} layer(s) at a time"):
            table = sweep_knockout(
                ckpt,
                keys,
                data.task,
                data.data,
                window=window,
                mode=mode,
                base=base,
                n=data.n,
                batch_size=batch.size(model.device),
                max_length=_max_length(data),
                **data.input_kwargs(),
            )
        facts = {"spec": ckpt, "keys": keys, "mode": mode, "window": window, "task": data.task}
        facts.update(data=str(data.data or "bundled"), examples=int(table["n"].iloc[0]))
        with stage("writing tables and figures"):
            write_sweep(
                table,
                claim,
                kind="knockout",
                x="layer",
                by=None,
                facts=facts,
                curves=(("d_nll", "d_nll_lo", "d_nll_hi"), ("d_accuracy", "d_accuracy_lo", "d_accuracy_hi")),
                extra_metrics=("kl",),
                **figures.writer_kwargs(),
            )
    typer.echo(table.drop(columns=["spec"]).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    typer.echo(f"wrote {output.out}/", err=True)


@sweep_app.command("length")
@cli_command
def sweep_length_cmd(
    model: ModelOptions,
    data: TruncatedDataOptions,
    batch: BatchOptions,
    training: TrainingOptions,
    method: Annotated[str, typer.Option("--method", help="prompt or deep-prompt.")] = "prompt",
    lengths: Annotated[str, typer.Option("--lengths", help="Prompt lengths, e.g. 1,5,20,100.")] = "1,5,20,100",
    eval_data: Eval_ = None,
    output: OutputOptions = OutputOptions(Path("anchorlens-sweep-length")),
    figures: FigureOptions = FigureOptions(),
) -> None:
    """Train one soft prompt per length; accuracy, parameters and time per step vs length."""
    sizes = parse_ints(lengths, "--lengths")
    claim = output.claim("sweep-length", inputs=[model.base, *data.sources, eval_data])
    assert claim is not None  # sweeps are never run under torchrun
    with claim, claim.scratch() as scratch:
        data.read(need_labels=True)
        _check_eval(eval_data, data)
        from anchorlens.reports.sweeps import write_sweep
        from anchorlens.workflows.sweeps import sweep_length

        with stage(f"loading {model.base}"):
            base = model.load()
        with stage(f"training {len(sizes)} prompt lengths", total=None):
            table = sweep_length(
                method,
                sizes,
                data.task,
                data.data,
                eval_data,
                base=base,
                out=scratch / "runs",
                batch_size=batch.size(model.device),
                n=data.n,
                max_length=_max_length(data),
                progress=False,
                **data.input_kwargs(),
                **training.train_kwargs(),
            )
        facts = {
            "method": method,
            "task": data.task,
            "data": str(data.data or "bundled"),
            "steps": int(table["steps"].iloc[0]),
            "lr": training.lr or "default",
            "seed": training.seed,
        }
        with stage("writing tables and figures"):
            write_sweep(
                table,
                claim,
                kind="length",
                x="length",
                by=None,
                facts=facts,
                runs=scratch / "runs",
                **figures.writer_kwargs(),
            )
    typer.echo(table.drop(columns=["spec"]).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    typer.echo(f"wrote {output.out}/", err=True)
