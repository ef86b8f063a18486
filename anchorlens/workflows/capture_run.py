"""``run_capture``: stream a model's attention statistics into OUT, resumable and distributed.

OUT/metrics.parquet holds the tidy metric rows and OUT/manifest.json the provenance; the manifest
is written last and marks the run finished. Until then OUT/.progress holds each finished chunk's
metric rows (:mod:`anchorlens.runtime.shards`), written as the chunk is done, so memory holds one
chunk whatever the number of examples and re-running the same command resumes. Under
``torchrun``/``accelerate launch`` chunks are split across ranks, each rank writes its own, and
rank 0 concatenates them into OUT (no exchange of per-example data); chunking is global, so
progress saved with one world size resumes with another.

Each chunk's commit marker also records the plan the engine took at each attention site while computing it
(:mod:`anchorlens.engine.plan`); rank 0 merges them into the manifest's ``capture_plan`` (the plan asked for, and per
site ``kernel``, ``materialised`` or ``mixed``), so chunks resumed from disk or computed by other ranks count. The plan
is not part of the run key: both plans give the same numbers to float rounding, and a run resumes under another one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from anchorlens.analyses import metrics_rows
from anchorlens.analyses.evidence import evidence_record
from anchorlens.capture.certificate import CertifyOptions
from anchorlens.capture.collect import encode_batches, stream_statistics
from anchorlens.capture.options import CaptureOptions
from anchorlens.capture.run import check_selection
from anchorlens.capture.selection import Selection
from anchorlens.capture.sinks import merge_plans
from anchorlens.errors import UsageError
from anchorlens.methods.spec import load_guided
from anchorlens.progress import stage
from anchorlens.rundir import MANIFEST, OutClaim, claim_out, examples_digest, manifest, run_state
from anchorlens.runtime import distributed as rt
from anchorlens.runtime.shards import Progress, chunk_indices, concat_shards, run_chunks
from anchorlens.tasks.prompts import PromptOptions, Prompts
from anchorlens.workflows.first_pass import first_pass
from anchorlens.workflows.inputs import Inputs, resolve_inputs
from anchorlens.workflows.statistics import certify_capture, model_reducers

METRICS_FILE = "metrics.parquet"
MANIFEST_FILE = MANIFEST
FINISHED = "OUT already holds a finished run; pass --force to replace it"


def is_finished(out: Path) -> bool:
    """Whether ``out`` holds a finished run (its manifest is the commit marker)."""
    return run_state(out) == "finished"


def claim_capture(out: Path, force: bool) -> OutClaim:
    """Claim OUT (rank 0): an unfinished capture is resumed, a finished one is replaced only with ``force``."""
    claim = claim_out(out, kind="capture", force=force, resume=True)
    if claim.state == "finished" and not force:
        claim.release()
        raise UsageError(FINISHED.replace("OUT", str(out), 1))
    return claim


def prepare_out(claim: OutClaim, run_key: str, force: bool, facts: dict) -> Progress:
    """Make OUT ready (rank 0): cleared under ``force``, another run's progress refused naming what differs (its
    chat template, system prompt, data...) before anything is written, the key recorded."""
    stored = Progress.stored_key(claim.path)
    if stored is not None and stored != run_key and not force:
        changed = describe_changes(Progress.stored_facts(claim.path), facts)
        raise UsageError(
            f"{claim.path} holds an unfinished run of a different command, whose results would differ ({changed}); "
            "rerun the original command to resume it, or pass --force to discard it"
        )
    claim.start_in_place({"run_key": run_key})
    progress = Progress(claim.path, run_key)
    progress.start(facts)
    return progress


_FACT_NAMES = {
    "chat_template": "the chat template",
    "demonstrations": "the few-shot demonstrations",
    "prompt": "the prompt options",
    "base_fingerprint": "the base model's weights",
    "data_digest": "the data",
    "task_source": "the task",
    "guidance_digest": "the checkpoint's guidance",
}


def _short(value: Any, limit: int = 60) -> str:
    """A recorded value in a message: JSON, or a string quoted, cut to ``limit`` characters."""
    text = json.dumps(value, sort_keys=True, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _changed_fields(key: str, old: Any, new: Any) -> list[str]:
    """What differs between two recorded values of ``key`` (a dict's differing entries by name)."""
    if key == "chat_template" and isinstance(old, dict) and isinstance(new, dict):
        parts = []
        if old.get("sha256") != new.get("sha256"):
            parts.append(f"text sha256 {str(old.get('sha256'))[:12]} -> {str(new.get('sha256'))[:12]}")
        for sub in ("source", "name", "kwargs"):
            if old.get(sub) != new.get(sub):  # a source is a path: never cut
                limit = 1000 if sub == "source" else 60
                parts.append(f"{sub} {_short(old.get(sub), limit)} -> {_short(new.get(sub), limit)}")
        return [f"the chat template: {', '.join(parts)}"] if parts else []
    if isinstance(old, dict) and isinstance(new, dict):
        subs = sorted(k for k in {*old, *new} if old.get(k) != new.get(k))
        what = _FACT_NAMES.get(key, key)
        return [f"{what}: " + ", ".join(f"{k} {_short(old.get(k))} -> {_short(new.get(k))}" for k in subs)]
    return [f"{_FACT_NAMES.get(key, key)}: {_short(old)} -> {_short(new)}"]


def describe_changes(stored: dict | None, facts: dict) -> str:
    """The facts that differ between an unfinished run's record and this run's, in words (one line)."""
    if stored is None or set(stored) <= {"run_key"}:
        return f"run key {stored.get('run_key') if stored else None}, this one's differs; that run recorded no more"
    new = json.loads(json.dumps(facts, sort_keys=True, default=str))  # the form the record was written in
    parts: list[str] = []
    for key in sorted({*new, *stored} - {"run_key"}):
        if key not in stored:
            parts.append(f"{_FACT_NAMES.get(key, key)}: not recorded by that run")
        elif stored.get(key) != new.get(key):
            parts.extend(_changed_fields(key, stored.get(key), new.get(key)))
    if len(parts) > 4:
        parts = [*parts[:4], f"and {len(parts) - 4} more"]
    return "; ".join(parts) if parts else "run key differs"


def guidance_digest(model) -> str | None:
    """SHA-256 (first 16 hex) of a guided model's guidance tensors; None for a bare base."""
    state_fn = getattr(model, "guidance_state_dict", None)
    if state_fn is None:
        return None
    h = hashlib.sha256()
    for name, t in sorted(state_fn().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def run_identity(
    ckpt: str,
    model,
    inputs: Inputs,
    selection: Selection,
    reducers: Sequence,
    *,
    prompts: Prompts,
    rows: Sequence,
    batch_size: int,
    chunk_size: int,
    max_length: int | None,
    dtype: str | None,
    seed: int,
) -> tuple[str, dict]:
    """(run key, facts) of ``model`` (a GuidedModel: its base and anchors count): everything that changes the result,
    hashed (the chat template, the few-shot draw and its pool's digest included); OUT path and world size
    excluded."""
    base = model.base
    facts = {
        "spec": ckpt,
        "guidance_digest": guidance_digest(model),
        "base": base.spec,
        "base_fingerprint": base.fingerprint(),
        "dtype": dtype or "float32",
        **token_facts(inputs, prompts),
        "n_examples": len(rows),
        "selection": dataclasses.asdict(selection),
        "reducers": [{"name": r.name, "options": r.state_options()} for r in reducers],
        "anchors": list(model.anchors()),
        "batch_size": batch_size,
        "chunk_size": chunk_size,
        "max_length": max_length,
        "seed": seed,
    }
    return facts_key(facts), facts


def token_facts(inputs: Inputs, prompts: Prompts) -> dict[str, Any]:
    """What shapes a run's tokens: the task (name, file and its sha256), the prompt options, the chat template (text
    sha256, source, arguments), the data's digest and the few-shot draw (when there are shots)."""
    return {
        "task": inputs.task.name,
        "task_source": inputs.task.describe_source(),
        "prompt": prompts.options.describe(),
        "chat_template": prompts.chat_template(),
        "data_digest": examples_digest(inputs.examples),
        **({"demonstrations": demos} if (demos := prompts.demonstrations()) is not None else {}),
    }


def facts_key(facts: dict) -> str:
    """A run key: SHA-256 (first 16 hex) of ``facts`` as canonical JSON."""
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


PLANS_FACT = "plans"  # a chunk marker's record of the plan each site took (site name -> plan)


def saved_plans(progress: Progress, chunks: Sequence[tuple[int, Sequence[int]]]) -> dict[str, str]:
    """The plan each attention site took over the saved ``chunks`` (site name -> ``kernel``, ``materialised`` or
    ``mixed`` where chunks differ), merged from their commit markers (a marker of an older version records none)."""
    plans: dict[str, str] = {}
    for chunk, _ids in chunks:
        recorded = (progress.marker(chunk) or {}).get(PLANS_FACT)
        if isinstance(recorded, dict):
            merge_plans(plans, {str(site): str(plan) for site, plan in recorded.items()})
    return plans


def _finish(claim: OutClaim, chunks: Sequence, facts: dict, base, progress: Progress, asked: str) -> None:
    """Rank 0: stream the chunks' rows into metrics.parquet, then write manifest.json (the commit marker, with the
    ``capture_plan`` of every chunk, ``asked``: the plan option), then drop .progress."""
    rows = concat_shards(progress, chunks, claim.path / METRICS_FILE)
    plan = {"asked": asked, "sites": saved_plans(progress, chunks)}
    claim.finish_in_place(manifest("capture", base_model=base, rows=rows, **facts, capture_plan=plan))
    progress.clear()


def run_capture(
    ckpt: str,
    base: str,
    task: str,
    data: str | Path | None,
    n: int | None,
    selection: Selection,
    batch_size: int,
    out: Path,
    force: bool,
    chunk_size: int = 32,
    progress: bool = True,
    *,
    field_map: Any = None,
    prompt: PromptOptions | None = None,
    max_length: int | None = None,
    dtype: str | None = None,
    seed: int = 0,
    backend: str | None = None,
    device: str | None = None,
    allow_other_base: bool = False,
    on_chunk_saved: Callable[[int], None] | None = None,
    certificate: CertifyOptions = CertifyOptions(),
    evidence: Mapping[str, Mapping] | None = None,
    capture: CaptureOptions = CaptureOptions(),
) -> Path:
    """Capture ``ckpt`` over ``base`` on a task's examples into OUT (sharded across ranks, resumable).

    OUT is claimed by rank 0 before anything is computed and held until the end. on_chunk_saved(chunk)
    runs after each chunk's progress is committed (see :func:`~anchorlens.runtime.shards.run_chunks`).
    ``certificate``: the capture is checked against eager on the first examples before any chunk (the manifest's
    ``exactness``); an inexact capture stops the run unless allowed. ``evidence``: opt-in evidence reducers added to
    the defaults (name -> options, :func:`~anchorlens.analyses.evidence.parse_evidence`); their rows go to
    metrics.parquet and the manifest's ``evidence`` records which ran, with their options. ``capture``: how the
    capture computes (its ``plan``: ``auto``, ``kernel`` or ``materialised``); the manifest's ``capture_plan`` records
    it and the plan each site took. A forced ``kernel`` plan the reducers or the model rule out is one UsageError.
    """
    if batch_size < 1 or chunk_size < 1:
        raise UsageError(f"--batch-size and --chunk-size must be at least 1 (got {batch_size}, {chunk_size})")
    started = rt.init_if_needed(backend)
    claim: OutClaim | None = None
    try:
        info = rt.dist_info()
        out = Path(out).expanduser()
        claim = rt.agree(lambda: claim_capture(out, force) if rt.is_main() else None)
        inputs = resolve_inputs(task, data, n, field_map=field_map, prompt=prompt)
        if device is None and rt.device().type == "cuda":
            device = str(rt.device())
        from anchorlens.models.loading import load_base

        torch.manual_seed(seed)
        model = load_guided(ckpt, load_base(base, dtype=dtype, device=device), allow_other_base=allow_other_base)
        check_selection(model, selection)  # out-of-range --layers/--heads: one line before any work
        base_obj = model.base
        anchors = model.anchors()
        prompts = inputs.prompts(base_obj.tokenizer, max_length)
        rows = prompts.examples(inputs.examples)  # the examples, or a text task's windows
        done = first_pass(model, rows, prompts, batch_size=batch_size, max_length=max_length)  # mode=mean knockouts

        def make_reducers() -> list:
            return model_reducers(model, prompts.roles, evidence)

        reducers = make_reducers()
        key, facts = run_identity(
            ckpt,
            model,
            inputs,
            selection,
            reducers,
            prompts=prompts,
            rows=rows,
            batch_size=batch_size,
            chunk_size=chunk_size,
            max_length=max_length,
            dtype=dtype,
            seed=seed,
        )
        rt.check_same_on_every_rank(
            f"run key {key}, --out {out.resolve()}",
            "their run (the arguments that change the result, or --out)",
            "launch every rank with the same command",
        )
        exactness = certify_capture(
            model,
            rows,
            prompts,
            selection=selection,
            max_length=max_length,
            options=certificate,
            label=ckpt,
            capture=capture,
            evidence=evidence,
        )
        facts_out = {
            **facts,
            "run_key": key,
            "data": inputs.source,
            "data_facts": dict(inputs.data_facts),
            "roles": prompts.roles.to_json(),
            "world_size": info.world_size,
            "launcher": info.launcher,
            "evidence": evidence_record(reducers),
            **({"exactness": exactness} if exactness is not None else {}),
            **({"first_pass": done} if done else {}),
        }
        store = rt.agree(lambda: prepare_out(claim, key, force, facts) if claim is not None else None)
        rt.barrier()
        store = store or Progress(out, key)

        chunks = list(enumerate(chunk_indices(len(rows), chunk_size)))
        mine = rt.shard(chunks, info.rank, info.world_size)

        chunk_plans: dict[str, str] = {}  # the plan each site took in the chunk being computed

        def compute(ids):
            examples = [rows[i] for i in ids]
            batches = encode_batches(
                model, examples, prompts, batch_size=batch_size, example_ids=ids, max_length=max_length
            )
            reducers = make_reducers()
            chunk_plans.clear()
            stream_statistics(model, batches, reducers, selection, options=capture, plans=chunk_plans)
            return metrics_rows(reducers, anchors=anchors)  # written to the shard as they are: no frame is built

        bar = stage("capture", sum(len(ids) for _, ids in mine), enabled=progress and rt.is_main())
        written = [0]

        def advance(n: int, resumed: bool, new_rows: int) -> None:
            written[0] += new_rows
            bar.update(n, rows=written[0], resumed=resumed)

        with bar:
            rt.agree(
                lambda: run_chunks(
                    mine, compute, store, advance, on_chunk_saved, lambda: {PLANS_FACT: dict(chunk_plans)}
                )
            )
        rt.barrier()  # every rank's chunks are on disk before rank 0 concatenates them
        rt.agree(
            lambda: _finish(claim, chunks, facts_out, base_obj, store, capture.plan) if claim is not None else None
        )
        rt.barrier()
        return out
    except BaseException:
        if claim is not None:
            claim.discard_if_empty()  # a run stopped before its first chunk leaves no OUT behind
        raise
    finally:
        if claim is not None:
            claim.release()
        rt.shutdown(started)
