"""Commands that measure attention: demo, compare, figures, positions, capture, params.

Each command first refuses what it can refuse cheaply (an existing --out, a missing --data), then
reads and validates the data, and only then imports torch/transformers/matplotlib.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Annotated

import typer

from anchorlens.cli.app import app
from anchorlens.cli.options import (
    DEFAULT_FIGURE_SIZE,
    BatchOptions,
    Ckpts_,
    DataOptions,
    EvidenceOptions,
    ExactnessOptions,
    FigureOptions,
    FigureSize_,
    Inputs_,
    MeanMapOptions,
    ModelOptions,
    OutputOptions,
    PlanOptions,
    ScoringOptions,
    SelectionOptions,
    TruncatedDataOptions,
    ckpt_inputs,
    cli_command,
    input_dir,
)
from anchorlens.cli.values import at_least
from anchorlens.errors import UsageError
from anchorlens.progress import stage
from anchorlens.rundir import OutClaim

DEMO_OUT_HELP = (
    "Where the report and figure go (default: the demo folder in the anchorlens cache, "
    "$ANCHORLENS_CACHE/demo, replaced on every run; an --out you name is never replaced without --force)."
)


def demo_dir() -> Path:
    """The demo's default output folder: ``demo`` beside the model cache (``$ANCHORLENS_CACHE``, else ~/.cache/anchorlens)."""
    from anchorlens.models.embedded import cache_root

    return cache_root() / "demo"


def claim_demo_out(out: Path | None, force: bool, inputs: Inputs_ = ()) -> tuple[OutClaim, bool]:
    """Claim the demo's output folder before any work: (claim, whether a previous demo run there is replaced).

    The default folder belongs to the demo: its previous demo run is replaced, anything else in it
    (a file the user put there, another kind of run) is refused. A named ``--out`` follows the rules
    of every command (refused if it holds a run, unless ``--force``).
    """
    from anchorlens.rundir import run_kind, run_state

    if out is not None:
        claim = OutputOptions(out, force).claim("demo", inputs=inputs)
        assert claim is not None  # the demo is never run under torchrun
        return claim, False
    target = demo_dir()
    state = run_state(target)
    if state == "foreign":
        raise UsageError(
            f"{target} holds files the demo did not write, and the demo never deletes them: "
            "pass --out DIR for the demo's report (or move them)"
        )
    kind = run_kind(target) if state in ("finished", "unfinished") else None
    if kind not in (None, "demo"):
        raise UsageError(f"{target} holds a {kind} run, not the demo's; pass --out DIR for the demo's report")
    claim = OutputOptions(target, True).claim("demo", inputs=inputs)
    assert claim is not None
    return claim, state in ("finished", "unfinished")


@app.command()
@cli_command
def demo(
    model: ModelOptions,
    data: DataOptions,
    batch: BatchOptions,
    ckpt: Annotated[
        list[str] | None,
        typer.Option(
            "--ckpt",
            help="Checkpoints to compare (repeat; default: base and instance, the training-free anchor at "
            "position 0; e.g. add --ckpt prompt:n=20 for an untrained soft prompt).",
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help=DEMO_OUT_HELP)] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an earlier anchorlens run in a named --out.")] = False,
    figure_size: FigureSize_ = DEFAULT_FIGURE_SIZE,
) -> None:
    """Compare the base with an instance token on bundled RTE examples: where input attention goes, per layer."""
    if ckpt is not None and len(ckpt) < 2:
        raise UsageError("the demo compares at least two --ckpt (e.g. --ckpt base --ckpt instance)")
    claim, replacing = claim_demo_out(out, force, [*ckpt_inputs(ckpt or ()), model.base, *data.sources])  # first
    with claim:
        inputs = data.read()
        from anchorlens.reports.demo import FIGURE, PART_NOTE, finding, per_layer_table, side_by_side, write_demo
        from anchorlens.workflows.demo import DEMO_CHECKPOINTS, run_demo

        specs = list(ckpt or DEMO_CHECKPOINTS)

        where = f"{len(inputs.examples)} {inputs.task.name} examples ({inputs.source})"
        with stage(f"comparing {' and '.join(specs)} on {where}"):
            result = run_demo(
                specs,
                batch_size=batch.size(model.device),
                progress=True,
                **model.workflow_kwargs(),
                **data.workflow_kwargs(),
            )
        table = per_layer_table(result)
        from anchorlens.figures import figure_size as sized

        result.facts["figure_size"] = figure_size  # in the report's facts and the manifest
        with stage("writing report.html and the figure"), sized(figure_size):
            path = write_demo(result, table, claim)
    typer.echo(f"{model.base} on {where}")
    typer.echo(textwrap.fill(PART_NOTE, width=100))
    typer.echo(side_by_side(table, result.checkpoints))
    for name in result.checkpoints[1:]:
        typer.echo(finding(result, name))
    typer.echo(f"report: {path / 'report.html'}")
    typer.echo(f"figure: {path / FIGURE}" + ("  (the previous demo run there was replaced)" if replacing else ""))


@app.command()
@cli_command
def compare(
    ckpt: Ckpts_,
    model: ModelOptions,
    data: DataOptions,
    select: SelectionOptions,
    batch: BatchOptions,
    exactness: ExactnessOptions,
    output: OutputOptions = OutputOptions(Path("anchorlens-compare")),
    figures: FigureOptions = FigureOptions(),
    evidence: EvidenceOptions = EvidenceOptions(),
    mean_maps: MeanMapOptions = MeanMapOptions(),
    answers: ScoringOptions = ScoringOptions(),
    plan: PlanOptions = PlanOptions(),
    map_example: Annotated[
        int,
        typer.Option(
            "--map-example",
            parser=at_least(0),
            metavar="INDEX",
            help="Index of the example drawn in the attention-map figure.",
        ),
    ] = 0,
    chunk_size: Annotated[
        int,
        typer.Option(
            "--chunk-size",
            parser=at_least(1),
            metavar="N",
            help="Examples per chunk (memory holds one; under torchrun each rank saves its chunks in --out).",
        ),
    ] = 32,
) -> None:
    """Compare 2+ checkpoints on the same inputs; writes metrics, summary.md, figures/ and report.html."""
    if len(ckpt) < 2:
        raise UsageError("compare needs at least two --ckpt (e.g. --ckpt base --ckpt instance)")
    # exclusive, before minutes of capture (rank 0 under torchrun); never an --out touching what it reads
    claim = output.claim_resuming("compare", [*ckpt_inputs(ckpt), model.base, *data.sources])
    try:
        data.read()
        selection = select.selection()
        spec = evidence.spec()
        _compare(
            ckpt, model, data, selection, batch, claim, figures, map_example, exactness, spec, output.out, chunk_size,
            mean_maps.workflow_kwargs(), answers.scoring, plan,
        )  # fmt: skip
    finally:
        if claim is not None:
            claim.release()


def _compare(
    ckpt: list[str],
    model: ModelOptions,
    data: DataOptions,
    selection,
    batch: BatchOptions,
    claim: OutClaim | None,
    figures: FigureOptions,
    map_example: int,
    exactness: ExactnessOptions = ExactnessOptions(),
    evidence: dict | None = None,
    out: Path | None = None,
    chunk_size: int = 32,
    mean_maps: dict | None = None,
    scoring: str = "auto",
    plan: PlanOptions = PlanOptions(),
) -> None:
    """Run the comparison (sharded under torchrun: every rank's chunks go to --out) and let rank 0 write it into the
    claimed --out."""
    from anchorlens import runtime as rt
    from anchorlens.reports.comparison import effects_grid, evidence_grid, write_comparison
    from anchorlens.reports.tables import headline_grid, present_roles, to_text
    from anchorlens.workflows.compare import compare as run_compare

    started = rt.init_if_needed()  # under torchrun / accelerate launch: examples are sharded across ranks
    try:
        with stage(f"comparing {len(ckpt)} checkpoints", enabled=rt.is_main()):
            result = run_compare(
                ckpt,
                selection=selection,
                batch_size=batch.size(model.device),
                map_example=map_example,
                progress=rt.is_main(),
                certificate=exactness.certify(),
                evidence=evidence,
                scratch_dir=None if claim is None else claim.path.parent,  # the run's own disk, not /tmp
                shard_dir=claim if claim is not None else out,  # a rerun resumes
                chunk_size=chunk_size,
                **(mean_maps or {}),
                scoring=scoring,
                capture=plan.capture(),
                **model.workflow_kwargs(),
                **data.workflow_kwargs(),
            )
        if rt.is_main() and claim is not None:
            with stage("writing tables, figures and report.html"):
                write_comparison(result, claim, **figures.writer_kwargs())
            typer.echo(to_text(headline_grid(result.headline, result.checkpoints, present_roles(result.means))))
            effects = effects_grid(result)
            if not effects.empty:
                typer.echo(to_text(effects))
            shown = evidence_grid(result.evidence, result.checkpoints)
            if not shown.empty:
                typer.echo(to_text(shown))
            extra = ", evidence.csv" if not result.evidence.empty else ""
            drawn = "" if figures.no_figures else ", figures/"
            typer.echo(
                f"wrote {claim.path}/ (metrics.parquet, effects.parquet{extra}, summary.md{drawn}, report.html)",
                err=True,
            )
        # no barrier here: the other ranks are done once their shards are saved, and rank 0's statistics may
        # outlast a collective's timeout
    finally:
        rt.shutdown(started)


@app.command()
@cli_command
def figures(
    run_dir: Annotated[Path, typer.Argument(help="A directory written by `anchorlens compare`.")],
    out: Annotated[Path | None, typer.Option("--out", help="Where to write (default RUN_DIR/figures).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out.")] = False,
    figure_size: FigureSize_ = DEFAULT_FIGURE_SIZE,
) -> None:
    """Redraw every figure of a compare run from its saved metrics and maps (e.g. --figure-size column for a paper)."""
    run_dir = input_dir(run_dir, "the compare run")
    target = OutputOptions(out or run_dir / "figures", force)
    claim = target.claim("figures", inputs=[p for p in run_dir.iterdir() if p.name != "figures"])  # what it reads
    assert claim is not None  # figures is never run under torchrun
    with claim:
        from anchorlens.reports.comparison import redraw_figures

        with stage("drawing figures"):
            folder, count = redraw_figures(run_dir, claim, size=figure_size)
    typer.echo(f"wrote {count} figures ({figure_size} size) to {folder}/")


@app.command()
@cli_command
def positions(
    ckpt: Annotated[
        str,
        typer.Option(
            "--ckpt", help="Spec or checkpoint with a capsule or instance token (e.g. instance, capsule, runs/capsule)."
        ),
    ],
    model: ModelOptions,
    data: DataOptions,
    select: SelectionOptions,
    batch: BatchOptions,
    positions: Annotated[
        str,
        typer.Option("--positions", help="Comma-separated: first, after_structural, middle, last, or token indices."),
    ] = "first,middle,last",
    exactness: ExactnessOptions = ExactnessOptions(),
    output: OutputOptions = OutputOptions(Path("anchorlens-positions")),
    figures: FigureOptions = FigureOptions(),
    evidence: EvidenceOptions = EvidenceOptions(),
) -> None:
    """Sweep the capsule/instance position; writes metrics, positions.csv, summary.md and figures/ (and
    evidence.csv with --evidence)."""
    claim = output.claim("positions", inputs=[ckpt, model.base, *data.sources])
    assert claim is not None  # positions is never run under torchrun
    with claim:
        data.read()
        selection = select.selection()
        from anchorlens.reports.positions import position_grid, write_positions
        from anchorlens.workflows.positions import sweep_positions

        with stage(f"sweeping {ckpt} over positions {positions}"):
            sweep = sweep_positions(
                ckpt,
                positions,
                selection=selection,
                batch_size=batch.size(model.device),
                certificate=exactness.certify(),
                evidence=evidence.spec(),
                **model.workflow_kwargs(),
                **data.workflow_kwargs(),
            )
        with stage("writing tables and figures"):
            write_positions(sweep, claim, **figures.writer_kwargs())
    typer.echo(position_grid(sweep.summary, sweep.positions).to_string())
    typer.echo(f"wrote {output.out}/", err=True)


@app.command()
@cli_command
def capture(
    ckpt: Annotated[
        str, typer.Option("--ckpt", help="Checkpoint spec: base, instance, capsule, a checkpoint dir or a PEFT dir.")
    ],
    model: ModelOptions,
    data: TruncatedDataOptions,
    select: SelectionOptions,
    batch: BatchOptions,
    exactness: ExactnessOptions,
    output: OutputOptions = OutputOptions(Path("anchorlens-capture")),
    evidence: EvidenceOptions = EvidenceOptions(),
    plan: PlanOptions = PlanOptions(),
    chunk_size: Annotated[
        int, typer.Option("--chunk-size", parser=at_least(1), metavar="N", help="Examples per saved progress shard.")
    ] = 32,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="No progress bar.")] = False,
) -> None:
    """Stream attention statistics into OUT/metrics.parquet; sharded under torchrun, resumable after a kill.

    Re-running the same command resumes an interrupted run; --force replaces a finished run or
    discards unfinished progress.
    """
    output.check_inputs([ckpt, model.base, *data.sources])  # run_capture claims --out itself
    data.read()
    selection = select.selection()
    spec = evidence.spec()
    from anchorlens.runtime import is_main
    from anchorlens.workflows.capture_run import run_capture

    path = run_capture(
        ckpt,
        model.base,
        data.task,
        data.data,
        data.n,
        selection,
        batch.size(model.device),
        output.out,
        output.force,
        chunk_size=chunk_size,
        progress=not no_progress,
        dtype=model.dtype,
        max_length=data.max_length,
        device=model.device,
        allow_other_base=model.allow_other_base,
        certificate=exactness.certify(),
        evidence=spec,
        capture=plan.capture(),
        **data.input_kwargs(),
    )
    if is_main():
        typer.echo(f"wrote {path}/metrics.parquet", err=True)


@app.command()
@cli_command
def params(
    ckpt: Annotated[list[str], typer.Option("--ckpt", help="Checkpoint spec (repeat; NAME=SPEC shows it by NAME).")],
    model: ModelOptions,
) -> None:
    """Trainable parameters of each checkpoint spec and their share of the base."""
    from anchorlens.methods.spec import load_guided, split_alias

    shared = model.load()
    total = shared.num_parameters()
    typer.echo(f"{model.base}: {total:,} parameters")
    for text in ckpt:
        name, spec = split_alias(text)  # NAME=SPEC: shown by its name
        guided = load_guided(spec, base=shared, allow_other_base=model.allow_other_base)
        rows = guided.parameter_report()
        trainable = sum(r["trainable"] for r in rows)
        detail = "; ".join(f"{r['method']}: {r['trainable']:,}" for r in rows) or "no guidance"
        typer.echo(f"  {name or spec:<28} {trainable:>10,}  {100 * trainable / total:.4f}%  ({detail})")
