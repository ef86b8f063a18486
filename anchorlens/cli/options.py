"""Option groups shared by the commands, declared once as typed dataclasses (inseq's CLI-argument classes).

A command takes a few option objects instead of 10-17 loose keyword arguments::

    @app.command()
    @cli_command
    def compare(ckpt: Ckpts_, model: ModelOptions, data: DataOptions, output: OutputOptions = OutputOptions(Path("x"))):
        ...

:func:`cli_command` shows typer one flag per dataclass field (the field's ``Annotated`` option gives
the flag and its help; a default instance on the parameter gives per-command defaults) and
rebuilds the objects before calling the command. It also maps errors: a UsageError or an OS error
is one ``error: ...`` line and exit 2. Nothing here imports torch: the checks that refuse trivial
mistakes (existing ``--out``, missing ``--data``) run before the heavy imports.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import stat
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, get_type_hints

import typer

from anchorlens.atomic import os_errors
from anchorlens.cli.values import at_least, positive, whole_number
from anchorlens.errors import AnchorlensError, UsageError
from anchorlens.rundir import OutClaim

Inputs_ = Iterable[str | Path | None]  # what a command reads: checkpoint specs, --base, data files
DEFAULT_BASE = "smollm2-135m"  # models.embedded.EMBEDDED_SPEC, named here so --help needs no torch

Task_ = Annotated[
    str,
    typer.Option(
        "--task",
        help="Task: a built-in name (rte, cb, boolq, copa, wic, wsc, multirc, sst2, text; `anchorlens tasks` lists them), "
        "a task file (.toml) or an lm-evaluation-harness task (.yaml).",
    ),
]
Data_ = Annotated[
    str | None,
    typer.Option(
        "--data",
        help="Examples: a .jsonl/.json/.csv/.tsv/.parquet/.txt file, a datasets.save_to_disk directory (DIR@SPLIT), "
        "or a hub dataset hf:ORG/NAME[:CONFIG][@SPLIT] from the local HF cache (default: the bundled examples).",
    ),
]
FieldMap_ = Annotated[
    list[str] | None,
    typer.Option("--field-map", help="Rename data columns to task fields: FIELD=COLUMN (repeat, or comma-separate)."),
]
N_ = Annotated[
    int | None,
    typer.Option(
        "--n",
        "--limit",
        parser=at_least(1),
        metavar="N",
        help="Use the first N examples (--limit under torchrun, which claims --n).",
    ),
]
Ckpts_ = Annotated[
    list[str],
    typer.Option(
        "--ckpt",
        help="Checkpoint spec (repeat): base, instance, instance:k=2,pos=middle, "
        "capsule, a checkpoint dir, a PEFT adapter dir or hub id (prompt, prefix, LoRA, DoRA, IA3; "
        "LORA_DIR:merge=true merges it), or model=ORG/NAME or model=DIR (another base sharing the "
        "tokenizer), each composable with +: model=DIR+instance. NAME=SPEC names it in every table, figure and "
        "file: ko='instance+knockout:keys=instance,mode=renorm'.",
    ),
]


def ckpt_inputs(ckpts: Iterable[str]) -> list[str]:
    """What ``--ckpt`` values read, for the --out checks: each value, and what follows a leading ``NAME=`` (the
    spec of a named checkpoint; checked too when the text is not a name, which only adds refusals of real paths)."""
    return [part for c in ckpts for part in (c, c.partition("=")[2]) if part]


@dataclass(frozen=True)
class ModelOptions:
    """The base model and where it runs: every command that loads a base."""

    base: Annotated[
        str,
        typer.Option(
            "--base",
            help="Base model: smollm2-135m (embedded), a hub id ORG/NAME[@REVISION] (HF cache; offline with "
            "HF_HUB_OFFLINE=1), a local HF dir, or tiny-<family> (random, for tests).",
        ),
    ] = DEFAULT_BASE
    dtype: Annotated[
        str, typer.Option("--dtype", help="Weights dtype: float32, bfloat16 (bf16) or float16 (fp16).")
    ] = "float32"
    device: Annotated[
        str | None,
        typer.Option("--device", help="cpu (default), cuda:0, or auto (spread a large base over the node's GPUs)."),
    ] = None
    allow_other_base: Annotated[
        bool,
        typer.Option(
            "--allow-other-base",
            help="Load checkpoints trained on another base (other architecture or weights) anyway; the run records it.",
        ),
    ] = False

    @property
    def custom_placement(self) -> bool:
        """Whether --dtype or --device differ from the defaults."""
        return self.dtype != "float32" or self.device is not None

    def workflow_kwargs(self) -> dict[str, Any]:
        """``base``, ``dtype``, ``device`` and ``allow_other_base`` as workflow keywords."""
        return {
            "base": self.base,
            "dtype": self.dtype,
            "device": self.device,
            "allow_other_base": self.allow_other_base,
        }

    def load(self, base: str | None = None):
        """Load the base (``base`` overrides ``self.base``) with this dtype and device."""
        from anchorlens.models.loading import load_base

        return load_base(base or self.base, dtype=self.dtype, device=self.device)


OWN_BASE_HELP = "Base model (default: the checkpoint's own, else smollm2-135m)."


@dataclass(frozen=True)
class OwnBaseModelOptions(ModelOptions):
    """Model options where the base defaults to the checkpoint's own (evaluate, sweep instance)."""

    base: Annotated[str | None, typer.Option("--base", help=OWN_BASE_HELP)] = None  # type: ignore[assignment]

    def load_or_own(self):
        """The loaded base, or None (the checkpoint's own base) when --base is not given."""
        if self.base is not None:
            return self.load()
        if self.custom_placement:
            raise UsageError(
                "--dtype/--device need --base here (e.g. --base smollm2-135m); "
                "without it the checkpoint's own base is loaded in float32 on the CPU"
            )
        return None


def task_file_inputs(task: str, data: str | None) -> list[str]:
    """The task file ``--task`` names and, when ``data`` (--data) is None, the data file its ``data =`` key names:
    inputs an --out may not be or hold, as --data (``[]`` for a built-in task). Read with tomllib alone, before the
    heavy imports; a task file that does not parse gives its file only (the task reader then refuses it, in one
    line). A harness YAML's default data is a hub dataset, never a local file."""
    text = str(task).strip()
    path = Path(text).expanduser()
    if not (text.lower().endswith((".toml", ".yaml", ".yml")) or "/" in text) or not path.is_file():
        return []
    reads = [text]
    if data is None and path.suffix.lower() == ".toml":
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - Python 3.10
            import tomli as tomllib
        try:
            default = tomllib.loads(path.read_bytes().decode("utf-8-sig")).get("data")
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            default = None
        if isinstance(default, str):
            reads.append(default)
    return reads


@dataclass(frozen=True)
class DataOptions:
    """Which task and examples (the bundled set, a file, a saved dataset, a hub dataset), optionally the first N,
    and how they are prompted: a chat template, a system prompt, few-shot demonstrations."""

    task: Task_ = "rte"
    data: Data_ = None
    n: N_ = None
    field_map: FieldMap_ = None
    chat: Annotated[
        bool | None,
        typer.Option(
            "--chat/--no-chat",
            help="Render through the tokenizer's chat template (default: the task file's `chat`).",
            show_default=False,
        ),
    ] = None
    system: Annotated[str | None, typer.Option("--system", help="System prompt for --chat.")] = None
    chat_template: Annotated[
        str | None,
        typer.Option(
            "--chat-template",
            metavar="NAME",
            help="Which of the tokenizer's named chat templates (e.g. tool_use; default: the task file's, else "
            "'default').",
        ),
    ] = None
    chat_template_kwargs: Annotated[
        list[str] | None,
        typer.Option(
            "--chat-template-kwargs",
            metavar="KEY=VALUE",
            help="An argument of the chat template (repeatable), e.g. enable_thinking=false; VALUE is JSON "
            '(true, 3, "x") or text.',
        ),
    ] = None
    shots: Annotated[
        int | None, typer.Option("--shots", min=0, help="Few-shot demonstrations per example (default: the task's).")
    ] = None
    shots_from: Annotated[
        str | None,
        typer.Option("--shots-from", help="Where demonstrations come from (a data file; default: --data itself)."),
    ] = None
    shots_seed: Annotated[int, typer.Option("--shots-seed", help="Seed of the demonstrations drawn.")] = 0

    def check(self) -> None:
        """Cheap checks before any heavy import: a data file is a readable file (directories and hub ids are
        checked when read)."""
        for flag, value in (("--data", self.data), ("--shots-from", self.shots_from)):
            if value is not None and not str(value).startswith("hf:") and not Path(value).expanduser().is_dir():
                base, at, _split = str(value).rpartition("@")
                if not (at and Path(base).expanduser().is_dir()):
                    input_file(value, flag)

    @property
    def sources(self) -> tuple[str | None, ...]:
        """``--data``, ``--shots-from``, the task file and, without --data, the data its ``data =`` names: the
        files this command reads (an --out may not touch them)."""
        return self.data, self.shots_from, *task_file_inputs(self.task, self.data)

    def prompt(self):
        """The :class:`~anchorlens.tasks.prompts.PromptOptions` of these flags."""
        from anchorlens.roles.chat_template import ChatTemplateChoiceError, parse_kwargs
        from anchorlens.tasks.prompts import PromptOptions

        try:
            kwargs = parse_kwargs(self.chat_template_kwargs or ())
        except ChatTemplateChoiceError as err:
            raise UsageError(str(err)) from None
        return PromptOptions(
            chat=self.chat,
            system=self.system,
            shots=self.shots,
            shots_from=self.shots_from,
            seed=self.shots_seed,
            chat_template=self.chat_template,
            chat_template_kwargs=kwargs,
        )

    def input_kwargs(self) -> dict[str, Any]:
        """``field_map`` and ``prompt`` as workflow keywords (with ``task``/``data``/``n`` given separately)."""
        return {"field_map": self.field_map, "prompt": self.prompt()}

    def workflow_kwargs(self) -> dict[str, Any]:
        """``task``, ``data``, ``n``, ``field_map`` and ``prompt`` as workflow keywords."""
        return {"task": self.task, "data": self.data, "n": self.n, **self.input_kwargs()}

    def read(self, need_labels: bool = False):
        """Read and validate every example now (FILE:LINE errors); ``need_labels`` for evaluate/train."""
        self.check()
        from anchorlens.workflows.inputs import resolve_inputs

        return resolve_inputs(self.task, self.data, self.n, need_labels=need_labels, **self.input_kwargs())


@dataclass(frozen=True)
class TruncatedDataOptions(DataOptions):
    """Data options plus truncation of long inputs."""

    max_length: Annotated[
        int | None,
        typer.Option(
            "--max-length",
            parser=at_least(2),
            metavar="TOKENS",
            help="Truncate inputs (longest field first) "
            "to this many tokens (default: 384 for train/evaluate/sweeps, "
            "the base's context for capture).",
        ),
    ] = None


@dataclass(frozen=True)
class SelectionOptions:
    """Which layers and heads to capture."""

    layers: Annotated[str | None, typer.Option("--layers", help="Layers to capture, e.g. 0,5-8,-1 (default all).")] = (
        None
    )
    heads: Annotated[str | None, typer.Option("--heads", help="Heads to capture, e.g. 0-3 (default all).")] = None

    def selection(self):
        """The parsed :class:`~anchorlens.capture.selection.Selection`; UsageError naming the flag for bad syntax.
        Ranges stay as written until the model is loaded (``--layers 0-1000000000`` is checked against its layers,
        never expanded)."""
        from anchorlens.capture.selection import Selection, parse_ranges

        return Selection.written(
            layers=parse_ranges(self.layers, "--layers"), heads=parse_ranges(self.heads, "--heads")
        )


@dataclass(frozen=True)
class ExactnessOptions:
    """Whether the capture is certified against eager attention on the first examples, and what an inexact one does."""

    no_certificate: Annotated[
        bool,
        typer.Option(
            "--no-certificate",
            help="Skip checking the capture against eager attention on the first examples (for benchmarks).",
        ),
    ] = False
    allow_inexact: Annotated[
        bool,
        typer.Option(
            "--allow-inexact",
            help="Go on when the capture differs from eager beyond the threshold (the manifest records it).",
        ),
    ] = False

    def certify(self):
        """The :class:`~anchorlens.capture.certificate.CertifyOptions` of these flags."""
        from anchorlens.capture.certificate import CertifyOptions

        return CertifyOptions(enabled=not self.no_certificate, allow_inexact=self.allow_inexact)


# anchorlens.capture.options.PLANS, here so --help and the check need no torch (a test keeps them equal)
PLAN_NAMES: tuple[str, ...] = ("auto", "kernel", "materialised")


def plan_name(text: str) -> str:
    """A parser for ``--plan``: one of :data:`PLAN_NAMES` (any case); BadParameter naming them otherwise."""
    name = str(text).strip().lower()
    if name not in PLAN_NAMES:
        raise typer.BadParameter(f"{str(text)!r} is not a capture plan; use one of {', '.join(PLAN_NAMES)}")
    return name


@dataclass(frozen=True)
class PlanOptions:
    """How the capture computes the statistics: which of the engine's plans (``--plan``)."""

    capture_plan: Annotated[
        str,
        typer.Option(
            "--plan",
            parser=plan_name,
            metavar="auto|kernel|materialised",
            help="How statistics are computed: auto (the cheaper plan per site), kernel (flash kernel, no maps) or "
            "materialised (float32 probabilities).",
        ),
    ] = "auto"

    def capture(self):
        """The :class:`~anchorlens.capture.options.CaptureOptions` of this flag."""
        from anchorlens.capture.options import CaptureOptions

        return CaptureOptions(plan=self.capture_plan)


CPU_BATCH_SIZE = 8  # on CPU larger batches only add padding: time per example is flat from about 8
ACCELERATOR_BATCH_SIZE = 32  # an accelerator needs wide batches to be busy; the capture's budget bounds memory


@dataclass(frozen=True)
class BatchOptions:
    """How many examples go through one forward pass."""

    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size",
            parser=at_least(1),
            metavar="N",
            help=f"Examples per forward pass (default {CPU_BATCH_SIZE} on CPU, {ACCELERATOR_BATCH_SIZE} on a GPU).",
        ),
    ] = None

    def size(self, device: str | None) -> int:
        """``--batch-size``, or the default for ``device`` (``--device``; None is the CPU)."""
        if self.batch_size is not None:
            return self.batch_size
        return CPU_BATCH_SIZE if device in (None, "cpu") else ACCELERATOR_BATCH_SIZE


@dataclass(frozen=True)
class OutputOptions:
    """Where results go and whether an existing directory may be replaced."""

    out: Annotated[Path, typer.Option("--out", help="Output directory (refused if it exists, unless --force).")]
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Replace an existing anchorlens run in --out (never a folder anchorlens did not write)."
        ),
    ] = False

    def claim(self, kind: str, *, resume: bool = False, inputs: Inputs_ = ()) -> OutClaim | None:
        """Claim --out for this run before any work: one line when refused (see :func:`anchorlens.rundir.claim_out`).

        ``inputs``: what the command reads (checkpoint specs, --base, --data, --shots-from, --eval); an --out
        that is or holds one of them is refused. Under torchrun / accelerate launch only rank 0
        claims (it is the one that writes); other ranks get None.
        """
        from anchorlens.rundir import claim_out

        if os.environ.get("RANK", "0") != "0":  # set by torchrun / accelerate launch
            return None
        out = Path(self.out).expanduser()
        with os_errors(out, "cannot use --out"):
            return claim_out(out, kind=kind, force=self.force, resume=resume, inputs=inputs)

    def check_inputs(self, inputs: Inputs_) -> None:
        """Refuse an --out that is or holds one of ``inputs`` (for a command whose workflow claims)."""
        from anchorlens.rundir import check_inputs

        check_inputs(Path(self.out).expanduser(), inputs)

    def claim_resuming(self, kind: str, inputs: Inputs_ = ()) -> OutClaim | None:
        """:meth:`claim`, except that an unfinished ``kind`` run in --out (saved chunks of a killed torchrun run)
        is continued; a finished run is still refused without --force."""
        from anchorlens.rundir import run_kind, run_state

        out = Path(self.out).expanduser()
        claim = self.claim(kind, resume=run_state(out) == "unfinished" and run_kind(out) == kind, inputs=inputs)
        if claim is not None and claim.state == "finished" and not self.force:
            claim.release()
            raise UsageError(
                f"{claim.path} already exists and holds a finished run; pass --force to replace it or choose another --out"
            )
        return claim


# anchorlens.figures.FIGURE_SIZES' names, here so --help and the check need no matplotlib (a test keeps them equal)
FIGURE_SIZE_NAMES: tuple[str, ...] = ("screen", "column", "page")
DEFAULT_FIGURE_SIZE = "screen"


def figure_size_name(text: str) -> str:
    """A parser for ``--figure-size``: one of :data:`FIGURE_SIZE_NAMES` (any case); BadParameter naming them."""
    name = str(text).strip().lower()
    if name not in FIGURE_SIZE_NAMES:
        raise typer.BadParameter(
            f"{str(text)!r} is not a figure size; use screen (the report), column (at most 5.5 in wide) or page "
            "(at most 7 in wide)"
        )
    return name


FigureSize_ = Annotated[
    str,
    typer.Option(
        "--figure-size",
        parser=figure_size_name,
        metavar="screen|column|page",
        help="Size preset of the figures: screen (default, for the report), column (at most 5.5 in wide, text >= 6 pt "
        "at print size) or page (at most 7 in wide).",
    ),
]


@dataclass(frozen=True)
class FigureOptions:
    """Whether to draw figures (tables and metrics are always written), and at which size preset."""

    no_figures: Annotated[bool, typer.Option("--no-figures", help="Write tables and metrics only, no figures.")] = False
    figure_size: FigureSize_ = DEFAULT_FIGURE_SIZE

    def writer_kwargs(self) -> dict[str, Any]:
        """Keywords for the report writers: ``figures=False`` under --no-figures, ``size`` (the figure preset)."""
        return {"figures": not self.no_figures, "size": self.figure_size}


@dataclass(frozen=True)
class MeanMapOptions:
    """The StreamingLLM-style figure: which layers' maps are averaged over how many examples."""

    map_examples: Annotated[
        int,
        typer.Option(
            "--map-examples",
            parser=at_least(0),
            metavar="N",
            help="Examples the averaged attention maps (streaming_maps figure) are averaged over; 0: none.",
        ),
    ] = 64
    map_layers: Annotated[
        str | None,
        typer.Option(
            "--map-layers", help="Layers of the averaged attention maps, e.g. 0,1,15,-1 (default 0, 1, middle, last)."
        ),
    ] = None

    def workflow_kwargs(self) -> dict[str, Any]:
        """``map_examples`` and the parsed ``map_layers`` for :func:`~anchorlens.workflows.compare.compare` (ranges
        as written, checked against the model before any index is built)."""
        from anchorlens.capture.selection import parse_ranges

        return {"map_examples": self.map_examples, "map_layers": parse_ranges(self.map_layers, "--map-layers")}


# anchorlens.evaluation.verbalizers' AUTO and SCORINGS, here so --help and the check need no torch (a test keeps them equal)
SCORING_NAMES: tuple[str, ...] = ("auto", "sum", "first_token")


def scoring_name(text: str) -> str:
    """A parser for ``--scoring``: one of :data:`SCORING_NAMES` (any case, ``first-token`` for ``first_token``);
    BadParameter naming them otherwise."""
    name = str(text).strip().lower().replace("-", "_")
    if name not in SCORING_NAMES:
        raise typer.BadParameter(
            f"{str(text)!r} is not a scoring method; use auto (sum, or first_token where a guidance would see the "
            "appended answer), sum (the whole answer's log-likelihood: acc and acc_norm) or first_token (the first "
            "distinguishing token)"
        )
    return name


@dataclass(frozen=True)
class ScoringOptions:
    """How answers are scored: every command that ranks a task's labels (evaluate, compare's task effects)."""

    scoring: Annotated[
        str,
        typer.Option(
            "--scoring",
            parser=scoring_name,
            metavar="auto|sum|first_token",
            help="How labels are ranked: sum (the whole answer's log-likelihood, lm-evaluation-harness acc and "
            "acc_norm), first_token (the first distinguishing token's log-probability) or auto (sum, unless a "
            "guidance would see the appended answer: first_token).",
        ),
    ] = "auto"

    def workflow_kwargs(self) -> dict[str, Any]:
        """``scoring`` as a workflow keyword."""
        return {"scoring": self.scoring}


EVIDENCE_HELP = (
    "Opt-in evidence reducers beside the default statistics: all, or a comma list of value_mass (norm-based mass "
    "||A v W_O||), sink_battery (Gu et al. sink heads and rates), massive_activations (Sun et al.), each with "
    "options after a colon, e.g. sink_battery:eps=0.1/0.3/0.5,top=5 (repeat or comma-separate)."
)


@dataclass(frozen=True)
class EvidenceOptions:
    """Which opt-in evidence reducers run beside the defaults (``--evidence``), parsed in one place."""

    evidence: Annotated[list[str] | None, typer.Option("--evidence", metavar="SPEC", help=EVIDENCE_HELP)] = None

    def spec(self) -> dict[str, dict[str, Any]]:
        """name -> options of the evidence reducers asked for (empty without --evidence); UsageError for a bad spec."""
        if not self.evidence:
            return {}
        from anchorlens.analyses.evidence import parse_evidence

        return parse_evidence(self.evidence)


@dataclass(frozen=True)
class TrainingOptions:
    """Optimizer settings shared by train and sweep length (one default for both)."""

    steps: Annotated[
        int | None,
        typer.Option("--steps", parser=at_least(1), metavar="N", help="Optimizer steps (default 250 unless --epochs)."),
    ] = None
    lr: Annotated[
        float | None,
        typer.Option(
            "--lr",
            parser=positive,
            metavar="LR",
            help="Learning rate (positive; default: the training default, DEFAULT_LR of anchorlens.training).",
        ),
    ] = None
    seed: Annotated[
        int, typer.Option("--seed", parser=whole_number, metavar="SEED", help="Seed for init, split and data order.")
    ] = 0

    def train_kwargs(self) -> dict[str, Any]:
        """Keywords for the train workflow: the values given; unset ones keep the workflow's own defaults."""
        given = {"steps": self.steps, "lr": self.lr}
        return {"seed": self.seed, **{k: v for k, v in given.items() if v is not None}}


GROUPS: tuple[type, ...] = (
    ModelOptions,
    DataOptions,
    SelectionOptions,
    ExactnessOptions,
    BatchOptions,
    OutputOptions,
    FigureOptions,
    MeanMapOptions,
    EvidenceOptions,
    ScoringOptions,
    PlanOptions,
    TrainingOptions,
)


def _is_group(annotation: Any) -> bool:
    """Whether a parameter annotation is one of the option dataclasses."""
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation) and issubclass(annotation, GROUPS)


def _expand(fn: Callable) -> tuple[inspect.Signature, dict[str, tuple[type, list[str]]]]:
    """The flat signature typer sees, and parameter name -> (option class, its field names)."""
    hints = get_type_hints(fn, include_extras=True)
    params: list[inspect.Parameter] = []
    groups: dict[str, tuple[type, list[str]]] = {}
    for param in inspect.signature(fn).parameters.values():
        annotation = hints.get(param.name, param.annotation)
        if not _is_group(annotation):
            params.append(param.replace(annotation=annotation, kind=inspect.Parameter.KEYWORD_ONLY))
            continue
        field_hints = get_type_hints(annotation, include_extras=True)
        names = []
        for f in dataclasses.fields(annotation):
            if param.default is not inspect.Parameter.empty:
                default = getattr(param.default, f.name)
            elif f.default is not dataclasses.MISSING:
                default = f.default
            else:
                default = inspect.Parameter.empty
            params.append(
                inspect.Parameter(
                    f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=field_hints[f.name]
                )
            )
            names.append(f.name)
        groups[param.name] = (annotation, names)
    seen = [p.name for p in params]
    clash = {name for name in seen if seen.count(name) > 1}
    if clash:
        raise TypeError(f"{fn.__name__}: option names used twice: {sorted(clash)}")
    return inspect.Signature(params), groups


def fail(message: str) -> None:
    """Print ``error: message`` on stderr and exit with code 2."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def cli_command(fn: Callable) -> Callable:
    """Expand option-group parameters into flags for typer, rebuild them per call, and map errors.

    UsageError (every AnchorlensError) and OS errors are one ``error:`` line with exit 2; Ctrl-C is
    exit 130; anything else is an anchorlens bug: one ``internal error`` line, exit 1.
    """
    signature, groups = _expand(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind_partial(*args, **kwargs)
        bound.apply_defaults()  # a direct call (the root callback runs demo()) gets the flags' defaults
        args, kwargs = (), dict(bound.arguments)
        for name, (cls, names) in groups.items():
            kwargs[name] = cls(**{n: kwargs.pop(n) for n in names})
        try:
            return fn(*args, **kwargs)
        except AnchorlensError as err:
            fail(str(err))
        except OSError as err:
            fail(os_error_line(err))
        except KeyboardInterrupt:
            typer.secho("interrupted", err=True)
            raise typer.Exit(130) from None
        except (typer.Exit, SystemExit):
            raise
        except Exception as err:  # an anchorlens bug: one line, full traceback on request
            if os.environ.get("ANCHORLENS_DEBUG"):
                raise
            typer.secho(
                f"internal error: {type(err).__name__}: {err} (rerun with ANCHORLENS_DEBUG=1 for the traceback)",
                fg=typer.colors.RED,
                err=True,
            )
            raise typer.Exit(1) from None

    wrapper.__signature__ = signature  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
    del wrapper.__wrapped__  # typer must see the flat signature, not the grouped one
    return wrapper


def os_error_line(err: OSError) -> str:
    """One line naming the path of an OS error and why (the reasons of :func:`anchorlens.atomic.os_errors`)."""
    try:
        with os_errors(err.filename or "an output file", "cannot use"):
            raise err
    except UsageError as mapped:
        return str(mapped)
    return str(err)  # unreachable: os_errors always maps an OSError


def input_file(path: str | Path, flag: str) -> Path:
    """``path`` if it is a readable file; else one line naming the flag, the path and why (missing, a directory...)."""
    path = Path(path).expanduser()
    with os_errors(path, f"cannot read {flag}"):
        mode = path.stat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # opening a FIFO would wait for a writer forever
            raise UsageError(
                f"cannot read {flag} {path}: not a regular file (a named pipe or a device); write it to a file and "
                "pass that"
            )
        with open(path, "rb"):
            pass
    return path


def input_dir(path: str | Path, what: str) -> Path:
    """``path`` if it is a listable directory; else one line naming it and why."""
    path = Path(path).expanduser()
    with os_errors(path, f"cannot read {what}"):
        if not path.exists():
            raise FileNotFoundError(2, "No such file or directory", str(path))
        if not path.is_dir():
            raise NotADirectoryError(20, "Not a directory", str(path))
        os.listdir(path)
    return path


def one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Show warnings as ``warning: ...`` on stderr, without source lines."""
    print(f"warning: {message}", file=file or sys.stderr)


def parse_ints(text: str, what: str) -> list[int]:
    """``"0,1,2"`` -> [0, 1, 2]; UsageError naming the flag otherwise."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise UsageError(f"{what} is empty; give comma-separated integers")
    return values
