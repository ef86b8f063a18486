"""Compare checkpoints on the same examples: metrics, paired differences, headline table, maps."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from anchorlens.analyses.defaults import default_reducers
from anchorlens.analyses.evidence import evidence_record, parse_evidence
from anchorlens.analyses.headline import anchor_metrics, run_headline
from anchorlens.analyses.mean_maps import MeanMaps
from anchorlens.analyses.tolerance import dtype_name
from anchorlens.capture.certificate import CertifyOptions
from anchorlens.capture.collect import PromptRenderer, collect_maps, encode_batches
from anchorlens.capture.maps import AttentionMaps
from anchorlens.capture.options import CaptureOptions
from anchorlens.capture.run import check_selection
from anchorlens.capture.selection import IndexRanges, Selection
from anchorlens.errors import UsageError
from anchorlens.evaluation.effects import effects_table, example_effects
from anchorlens.heap import release_free_memory
from anchorlens.methods.spec import ALIAS, RESERVED_ALIASES, split_alias
from anchorlens.models.loading import load_base
from anchorlens.progress import stage
from anchorlens.rundir import OutClaim
from anchorlens.runtime.shards import chunk_indices
from anchorlens.tasks.prompts import PromptOptions
from anchorlens.workflows.compare_ranks import effect_span, open_ranks
from anchorlens.workflows.compare_summaries import Summaries
from anchorlens.workflows.inputs import Inputs, resolve_inputs
from anchorlens.workflows.mean_maps import MAP_EXAMPLES, checkpoint_mean_maps
from anchorlens.workflows.metrics_file import read_metrics
from anchorlens.workflows.multibase import load_models, multibase_facts, run_base_spec
from anchorlens.workflows.statistics import certify_capture, chunk_rows


@dataclass
class Comparison:
    """Everything ``compare`` measured; reports and figures are built from it.

    The per-example rows live on disk (``metrics_file``, the run's ``metrics.parquet``); :attr:`metrics` reads
    them on first use. Reports and figures read only the bounded summaries: ``means`` (every cell's mean over
    examples, per checkpoint) and ``curves`` (the layer curves' means with bootstrap CIs over examples).
    """

    checkpoints: list[str]
    inputs: Inputs | None  # None for a comparison read back from its run directory
    headline: pd.DataFrame
    paired: pd.DataFrame
    maps: dict[str, AttentionMaps] = field(default_factory=dict)
    facts: dict = field(default_factory=dict)
    means: pd.DataFrame = field(default_factory=pd.DataFrame)
    curves: pd.DataFrame = field(default_factory=pd.DataFrame)
    metrics_file: Path | None = None
    frame: pd.DataFrame | None = field(default=None, repr=False)
    scratch: Any = field(default=None, repr=False)  # keeps a temporary metrics_file alive with the comparison
    effects: pd.DataFrame = field(default_factory=pd.DataFrame)  # task effects table (see effects_table)
    effect_rows: pd.DataFrame = field(default_factory=pd.DataFrame)  # per example: checkpoint, example, metric, value
    evidence: pd.DataFrame = field(default_factory=pd.DataFrame)  # evidence.csv (analyses.evidence_table); empty: off
    mean_maps: dict[str, MeanMaps] = field(default_factory=dict)  # name -> chosen layers' maps averaged over examples

    @property
    def metrics(self) -> pd.DataFrame:
        """Every per-example metric row with its ``checkpoint`` (read from ``metrics_file`` on first use: at
        dataset scale this is the one large object; reports never need it)."""
        if self.frame is None:
            if self.metrics_file is None:
                raise ValueError("this comparison holds no per-example rows")
            self.frame = read_metrics(self.metrics_file)
        return self.frame


def checkpoint_names(specs: Sequence[str]) -> list[str]:
    """Short unique display names: the shortest path suffix that tells directories apart, else the spec."""
    parts = [Path(s).expanduser().resolve().parts if Path(s).expanduser().is_dir() else (s,) for s in specs]
    depth = [1] * len(specs)
    while True:
        names = ["/".join(p[-d:]) for p, d in zip(parts, depth)]
        clashes = {n for n in names if names.count(n) > 1}
        grow = [i for i, n in enumerate(names) if n in clashes and depth[i] < len(parts[i])]
        if not grow:
            break
        for i in grow:
            depth[i] += 1
    out: list[str] = []
    for name in names:  # identical specs given twice
        unique, k = name, 2
        while unique in out:
            unique, k = f"{name}#{k}", k + 1
        out.append(unique)
    return out


def named_checkpoints(ckpts: Sequence[str] | Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(display names, specs) of the checkpoints, in order.

    ``ckpts``: specs, each optionally ``NAME=SPEC`` (:func:`~anchorlens.methods.spec.split_alias`), or a mapping
    name -> spec. A checkpoint without a name gets :func:`checkpoint_names`' short name of its spec. A name given
    twice, or one that is another checkpoint's spec name (``--ckpt instance --ckpt instance=base``), is one
    UsageError: every table, figure, legend and file stem says which checkpoint it shows by this name.
    """
    pairs: list[tuple[str | None, str]]
    if isinstance(ckpts, Mapping):
        pairs = [(str(name), str(spec)) for name, spec in ckpts.items()]
        for name in map(str, ckpts):
            if not ALIAS.fullmatch(name) or name.lower() in RESERVED_ALIASES:
                raise UsageError(
                    f"checkpoint name {name!r} is not a name: use letters, digits, '_', '.', '-' "
                    "(starting with a letter or '_'), and not 'model'"
                )
    else:
        if isinstance(ckpts, str):
            raise UsageError(f"give the checkpoints as a list of specs (e.g. ['base', {ckpts!r}]), not one string")
        pairs = [split_alias(str(c)) for c in ckpts]
    specs = [spec for _, spec in pairs]
    defaults = checkpoint_names(specs)
    names = [alias or default for (alias, _), default in zip(pairs, defaults)]
    for i, (alias, spec) in enumerate(pairs):
        if alias is None:
            continue
        other = next((j for j, d in enumerate(defaults) if j != i and d == alias), None)
        if other is not None:
            raise UsageError(
                f"the name {alias!r} of --ckpt {alias}={spec} is also the checkpoint {specs[other]!r}; "
                "choose another name"
            )
        if names.count(alias) > 1:
            raise UsageError(f"two checkpoints are named {alias!r}; give each --ckpt NAME=SPEC its own name")
    return names, specs


def compare(
    ckpts: Sequence[str] | Mapping[str, str],
    *,
    base: str = "smollm2-135m",
    task: str = "rte",
    data: str | Path | None = None,
    n: int | None = None,
    selection: Selection = Selection(),
    batch_size: int = 8,
    map_example: int = 0,
    dtype: str | None = None,
    device: str | None = None,
    progress: bool = False,
    n_boot: int = 2000,
    allow_other_base: bool = False,
    field_map: Any = None,
    prompt: PromptOptions | None = None,
    max_length: int | None = None,
    certificate: CertifyOptions = CertifyOptions(),
    chunk_size: int = 32,
    evidence: str | Sequence[str] | Mapping[str, Mapping] | None = None,
    scratch_dir: str | Path | None = None,
    shard_dir: str | Path | OutClaim | None = None,
    map_examples: int = MAP_EXAMPLES,
    map_layers: Sequence[int] | None = None,
    scoring: str = "auto",
    capture: CaptureOptions = CaptureOptions(),
) -> Comparison:
    """Measure every checkpoint on the same inputs and one base; the first checkpoint is the paired baseline.

    ``ckpts``: specs (``NAME=SPEC`` names one: ``"ko=instance+knockout:keys=instance,mode=renorm"``) or a mapping
    name -> spec (:func:`named_checkpoints`); the names label every table, figure and file, and
    ``facts["checkpoint_specs"]`` maps each name to its full spec.

    ``allow_other_base``: load checkpoints trained on another base anyway (recorded in ``facts["other_base"]``);
    ``field_map``/``prompt``: column renames and prompt options (chat, system prompt, few-shot) of the inputs;
    ``max_length``: a text task's window (and every input's truncation); ``chunk_size``: examples per chunk (memory
    holds one chunk's rows; every per-example row goes to disk as its chunk finishes); ``certificate``: each
    checkpoint's capture is checked against eager on the first examples first (``facts["exactness"]``), an inexact
    one refused. ``evidence``: opt-in evidence reducers (``"all"``, ``"value_mass,sink_battery:eps=0.1/0.3"`` or
    name -> options, :func:`~anchorlens.analyses.evidence.parse_evidence`): their rows go to metrics.parquet, and
    ``evidence`` (evidence.csv: weight vs norm mass, sink rates, massive activations) is filled; never in ``paired``.
    ``scratch_dir``: where the per-example spill lives while the statistics run (about 24 bytes × paired cells ×
    examples × checkpoints; default the system's temp dir).
    ``shard_dir``: where each chunk's rows are saved as it finishes (the run's --out, or a claim on it;
    :mod:`~anchorlens.workflows.compare_ranks`), so the same call after a kill computes only the unsaved chunks;
    required under torchrun, where each rank saves its own and only rank 0's result holds the statistics.
    ``scoring``: how the task effects rank a labelled task's answers (``sum``, ``first_token`` or ``auto``, one for
    every checkpoint: :func:`~anchorlens.evaluation.scoring.resolve_scoring`); ``facts["scoring"]`` records the one
    used (None for a task without labels).
    ``map_examples``/``map_layers``: the StreamingLLM-style maps (``mean_maps``) average the chosen layers (default:
    0, 1, the middle and the last) over the first ``map_examples`` examples; 0 computes none.
    ``capture``: how the statistics' capture computes (its ``plan``: ``auto``, ``kernel`` or ``materialised``; the
    maps always materialise); ``facts["capture_plan"]`` records the plan asked for and, per checkpoint, the plan each
    site took (``kernel``, ``materialised`` or ``mixed``). A forced ``kernel`` plan some checkpoint's reducers or
    model rule out is one UsageError, before any statistics.
    """
    if len(ckpts) < 2:
        raise UsageError("compare needs at least two --ckpt (e.g. --ckpt base --ckpt instance)")
    given, specs = named_checkpoints(ckpts)
    extra = parse_evidence(evidence)
    inputs = resolve_inputs(task, data, n, field_map=field_map, prompt=prompt)
    shared = load_base(run_base_spec(specs, base), dtype=dtype, device=device)  # the first checkpoint's model=, or base
    prompts = inputs.prompts(shared.tokenizer, max_length)
    rows = prompts.examples(inputs.examples)
    if not 0 <= map_example < len(rows):
        raise UsageError(f"--map-example {map_example} is out of range: {len(rows)} examples")
    if map_examples < 0:
        raise UsageError(f"--map-examples {map_examples}: give 0 (no averaged maps) or a number of examples")
    models, used = load_models(
        specs,
        given,
        shared,
        base,
        prompts=prompts,
        rows=rows,
        max_length=max_length,
        dtype=dtype,
        device=device,
        allow_other_base=allow_other_base,
        batch_size=batch_size,
    )
    ranked = effects_scoring(scoring, models, shared, inputs)
    for model in models.values():
        check_selection(model, selection)
        if map_layers is not None:
            check_selection(model, Selection(layers=as_written(map_layers)))  # before any capture, not after it
        model.check_roles(prompts.roles)
        validate_positions(model, rows, prompts, batch_size)
    exactness = {
        name: certify_capture(
            model,
            rows,
            prompts,
            selection=selection,
            max_length=max_length,
            options=certificate,
            label=name,
            capture=capture,
            evidence=extra,
        )
        for name, model in models.items()
    }
    names = list(models)
    evidence_anchors = {name: [a for a in models[name].anchors() if a != "first_token"] for name in names}
    anchors = dict.fromkeys(a for own in evidence_anchors.values() for a in own)  # every checkpoint's, in order
    # the run's own roles (scaffold, system, demo...) in the decomposition, then the flow between its template fields
    added = run_headline(prompts.roles.extra, prompts.roles.fields)
    with Summaries(
        len(rows),
        added + tuple(m for a in anchors for m in anchor_metrics(a)),
        evidence_anchors=evidence_anchors if extra else None,
        scratch_dir=scratch_dir,
        knocked_out={name: [ko.config.keys for ko in getattr(models[name], "knockout_list", list)()] for name in names},
    ) as summaries:  # on any error its metrics writer is dropped, never left to fail again at exit
        ranks = open_ranks(shard_dir, specs, models, inputs, prompts, rows, selection, extra, batch_size=batch_size,
                           chunk_size=chunk_size, max_length=max_length, dtype=dtype, scoring=ranked)  # fmt: skip
        maps, params = {}, {}
        plans: dict[str, dict[str, str]] = {name: {} for name in names}  # checkpoint -> site -> plan taken
        clock = time.perf_counter()
        for index, (name, model) in enumerate(models.items()):
            with stage(f"capture {name}", len(rows), enabled=progress) as bar:
                frames = (
                    ranks.frames(
                        index,
                        model,
                        rows,
                        prompts,
                        selection=selection,
                        max_length=max_length,
                        evidence=extra,
                        bar=bar,
                        options=capture,
                        plans=plans[name],
                    )  # fmt: skip
                    if ranks is not None
                    else _chunk_frames(
                        model,
                        rows,
                        prompts,
                        selection,
                        batch_size,
                        max_length,
                        chunk_size,
                        bar,
                        extra,
                        options=capture,
                        plans=plans[name],
                    )
                )
                for df in frames:
                    summaries.add(name, df)
                    bar.update(0, rows=summaries.writer.rows)
                    del df
                    release_free_memory()  # the chunk's frame and arrays: pages back to the OS, not a growing heap
            one = [rows[map_example]]
            batch = encode_batches(model, one, prompts, batch_size=1, example_ids=[map_example], max_length=max_length)
            maps[name] = collect_maps(model, batch, selection, max_examples=1)[0]
            params[name] = int(getattr(model, "num_trainable", lambda: 0)())
        seconds = {"capture": time.perf_counter() - clock}
        clock = time.perf_counter()
        effect_rows = (
            ranks.effects(models, rows, inputs.task, prompts, max_length=max_length)
            if ranks is not None
            else example_effects(
                models,
                rows,
                inputs.task,
                prompts,
                batch_size=batch_size,
                max_length=max_length,
                window=effect_span(batch_size, chunk_size),  # the ranks' shards: the same batches either way
                scoring=ranked or "auto",
            )
        )
        if ranks is not None and ranks.rank != 0:  # rank 0 holds every example's rows and computes the statistics
            return Comparison(names, inputs, headline=pd.DataFrame(), paired=pd.DataFrame(), maps=maps)
        seconds["task_effects"] = time.perf_counter() - clock
        clock = time.perf_counter()
        mean_maps = (
            checkpoint_mean_maps(
                models,
                rows,
                prompts,
                layers=map_layers,
                max_examples=map_examples,
                batch_size=batch_size,
                max_length=max_length,
            )  # fmt: skip
            if map_examples
            else {}
        )
        seconds["mean_maps"] = time.perf_counter() - clock
        clock = time.perf_counter()
        effects = effects_table(effect_rows, names, labelled=inputs.task.has_labels, n_boot=n_boot, dtype=dtype)
        release_free_memory()  # each phase's freed arrays back to the OS before the next one allocates its own
        statistics = summaries.result(names, n_boot, dtype)
        seconds["statistics"] = time.perf_counter() - clock
    facts = {
        "base": shared.spec,
        "base_fingerprint": shared.fingerprint(),
        "base_provenance": shared.provenance(),
        "base_parameters": shared.num_parameters(),
        "trainable_parameters": params,
        "task": inputs.task.name,
        "source": inputs.source,
        "examples": len(rows),
        "map_example": map_example,
        "map_examples": min(map_examples, len(rows)),
        "dtype": dtype_name(dtype),  # the rounding tolerance of every paired test is this dtype's
        "checkpoint_specs": dict(zip(names, specs)),  # each name (--ckpt NAME=SPEC, or the spec's own) -> its spec
        "roles": prompts.roles.to_json(),
        "scoring": ranked,  # how the task effects ranked the answers: sum or first_token (None: no labels)
        "capture_plan": {"asked": capture.plan, "checkpoints": plans},  # the statistics' plan at each site
        "seconds": {k: round(v, 3) for k, v in seconds.items()},  # capture (every checkpoint), task effects, statistics
        **({"evidence": evidence_record(default_reducers(roles=prompts.roles, extra=extra))} if extra else {}),
        **inputs.facts(prompts),
        **multibase_facts(shared, used, models),
    }
    if certificate.enabled:
        facts["exactness"] = exactness
    other = {name: model.meta["other_base"] for name, model in models.items() if model.meta.get("other_base")}
    if other:
        facts["other_base"] = other
    return Comparison(
        names,
        inputs,
        maps=maps,
        facts=facts,
        effects=effects,
        effect_rows=effect_rows,
        mean_maps=mean_maps,
        **statistics,
    )


def as_written(layers: Sequence[int]) -> tuple[int, ...]:
    """``layers`` for a :class:`Selection`: ranges as written (``--map-layers``) kept unexpanded for its check
    against the model, other indices as a tuple."""
    return layers if isinstance(layers, IndexRanges) else tuple(layers)  # type: ignore[return-value]


def effects_scoring(scoring: str, models: Mapping[str, Any], base: Any, inputs: Inputs) -> str | None:
    """The scoring the task effects use (``sum`` or ``first_token``, one for every checkpoint), None for a task
    without labels; UsageError (one line) for an unknown ``scoring``, before any capture."""
    from anchorlens.evaluation.scoring import resolve_scoring
    from anchorlens.workflows.evaluate import check_scoring

    check_scoring(scoring)
    if not inputs.task.has_labels:
        return None
    return resolve_scoring(scoring, models.values(), base.tokenizer, inputs.task)


def _chunk_frames(
    model, rows, prompts, selection, batch_size, max_length, chunk_size, bar, evidence=None, *,
    options: CaptureOptions = CaptureOptions(), plans: dict[str, str] | None = None,
):  # fmt: skip
    """Each chunk's metric rows of ``model``, kept nowhere (memory holds one chunk; with a ``shard_dir``,
    :meth:`~anchorlens.workflows.compare_ranks.RankRun.frames` gives the same chunks, saved); ``options``: how the
    capture computes; ``plans``: filled with the plan each site took over every chunk."""
    for ids in chunk_indices(len(rows), chunk_size):
        yield chunk_rows(
            model, rows, ids, prompts, selection=selection, batch_size=batch_size, max_length=max_length, progress=bar,
            evidence=evidence, options=options, plans=plans,
        ).frame()  # fmt: skip


def validate_positions(model, rows: Sequence[dict], prompts: PromptRenderer, batch_size: int) -> None:
    """Plan every batch's inserted positions before any capture, so bad positions fail in seconds."""
    if not hasattr(model, "plan"):
        return
    for batch in encode_batches(model, rows, prompts, batch_size=batch_size):
        model.plan(batch)
