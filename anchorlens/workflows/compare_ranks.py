"""``compare``'s chunk files in --out: every rank (one, or many under torchrun) writes its own, rank 0 streams them.

The examples are cut into the same chunks as in one process (:func:`~anchorlens.runtime.shards.chunk_indices`).
For each checkpoint, each rank computes its share of the chunks (strided, :func:`~anchorlens.runtime.distributed.
shard`) exactly as one process does (:func:`~anchorlens.workflows.statistics.chunk_rows`: fresh reducers per
chunk, the same batches) and saves each chunk's metric rows as a shard of the capture command's progress store
(:class:`~anchorlens.runtime.shards.Progress`, ``OUT/.progress/shard-XXXXX.arrow`` + its ``.json`` commit marker).
After a barrier, rank 0 reads the shards back one at a time, in chunk order, and hands them to compare's
:class:`~anchorlens.workflows.compare_summaries.Summaries` as the one-process path hands its chunks: the statistics,
``metrics.parquet`` and every table are the same. Nothing of the per-example data crosses ranks in memory (no
all-reduce, no gather); memory holds one chunk.

Task effects (:func:`~anchorlens.evaluation.effects.example_effects`) go the same way: ranges of whole batches (so
every forward sees the batch it sees in one process) are split across ranks, saved as shards, and rank 0 reads
them back in order (a few records per example and checkpoint, held as in one process).

Shard numbers: checkpoint ``i``'s chunk ``c`` is shard ``i * n_chunks + c``; effect range ``e`` is shard
``n_checkpoints * n_chunks + e``. The store's run key hashes every checkpoint's capture identity (the capture
command's :func:`~anchorlens.workflows.capture_run.run_identity`), so ranks launched with different arguments are
refused in one line, and a rerun of the same command (after a rank was killed) recomputes only the shards no rank
committed: OUT stays an unfinished ``compare`` run until rank 0 replaces it with the finished one. Chunking is
global, so saved shards resume with another number of ranks.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from anchorlens.analyses.frames import conform
from anchorlens.analyses.rows import Rows
from anchorlens.capture.options import CaptureOptions
from anchorlens.capture.selection import Selection
from anchorlens.errors import UsageError
from anchorlens.evaluation.effects import EFFECT_COLUMNS, TEXT_BATCH, example_effects
from anchorlens.rundir import RUN_MARKER, OutClaim, claim_out
from anchorlens.runtime import distributed as rt
from anchorlens.runtime.shards import Progress, chunk_indices, require_done, run_chunks
from anchorlens.tasks import Task
from anchorlens.tasks.prompts import Prompts
from anchorlens.workflows.capture_run import PLANS_FACT, prepare_out, run_identity, saved_plans
from anchorlens.workflows.inputs import Inputs
from anchorlens.workflows.statistics import chunk_rows, model_reducers

Chunks = list[tuple[int, list[int]]]


def distributed() -> bool:
    """Whether this process is one of several ranks of a started process group."""
    return rt.initialized() and rt.dist_info().world_size > 1


def effect_span(batch_size: int, chunk_size: int) -> int:
    """Examples per task-effects shard: about ``chunk_size``, a whole number of the effects' batches (labelled
    tasks batch by ``batch_size``, text tasks by at most ``TEXT_BATCH``), so each forward sees one process's batch."""
    step = math.lcm(batch_size, max(1, min(batch_size, TEXT_BATCH)))
    return step * max(1, math.ceil(chunk_size / step))


class RankRun:
    """One distributed compare's shards in OUT/.progress: what each rank computes and what rank 0 reads back."""

    def __init__(
        self,
        store: Progress,
        n_examples: int,
        n_checkpoints: int,
        *,
        chunk_size: int,
        batch_size: int,
        claim: OutClaim | None = None,
        owned: bool = False,
        scoring: str | None = None,
    ) -> None:
        """``claim``: rank 0's claim on OUT; ``owned``: taken here (Python API), so released once read back;
        ``scoring``: how the task effects rank answers (``sum``/``first_token``; None: ``auto``)."""
        self.store = store
        self.chunks = chunk_indices(n_examples, chunk_size)
        self.spans = chunk_indices(n_examples, effect_span(batch_size, chunk_size))
        self.n_checkpoints = n_checkpoints
        self.batch_size = batch_size
        self.claim, self.owned = claim, owned
        self.scoring = scoring or "auto"
        info = rt.dist_info()
        self.rank, self.world = info.rank, info.world_size

    def _numbered(self, first: int, parts: Sequence[list[int]]) -> Chunks:
        """``(shard number, example ids)`` of ``parts``, numbered from ``first``."""
        return [(first + i, ids) for i, ids in enumerate(parts)]

    def _compute(self, shards: Chunks, compute, bar=None, marker_facts=None) -> None:
        """This rank's share of ``shards`` (those not committed yet), then a barrier: every shard is on disk.
        ``marker_facts()``: what each computed shard's commit marker records beside its rows."""
        mine = rt.shard(shards, self.rank, self.world)

        def advance(n: int, resumed: bool, rows: int) -> None:
            if bar is not None and resumed:
                bar.update(n, resumed=True)

        rt.agree(lambda: run_chunks(mine, compute, self.store, advance, marker_facts=marker_facts))
        rt.barrier()

    def _read(self, shards: Chunks) -> Iterator[pd.DataFrame]:
        """Rank 0: every shard, in order, as read from disk (one in memory at a time); missing ones: one line."""
        require_done(self.store, shards)
        for shard, _ids in shards:
            yield self.store.read(shard).to_pandas()

    def frames(
        self,
        index: int,
        model,
        rows: Sequence,
        prompts: Prompts,
        *,
        selection: Selection,
        max_length: int | None,
        evidence: Mapping[str, Mapping] | None,
        bar=None,
        options: CaptureOptions = CaptureOptions(),
        plans: dict[str, str] | None = None,
    ) -> Iterator[pd.DataFrame]:
        """Checkpoint ``index``'s chunk frames: computed by every rank into shards; yielded (in example order,
        read back from disk) on rank 0 only. ``options``: how the capture computes (its plan); ``plans``: filled on
        rank 0 with the plan each site took over every shard of the checkpoint (from the shards' markers, so shards
        other ranks or an earlier run computed count)."""
        shards = self._numbered(index * len(self.chunks), self.chunks)
        chunk_plans: dict[str, str] = {}  # the plan each site took in the shard being computed

        def compute(ids: Sequence[int]) -> Rows:
            chunk_plans.clear()
            return chunk_rows(
                model, rows, ids, prompts, selection=selection, batch_size=self.batch_size, max_length=max_length,
                progress=bar, evidence=evidence, options=options, plans=chunk_plans,
            )  # fmt: skip

        self._compute(shards, compute, bar, lambda: {PLANS_FACT: dict(chunk_plans)})
        if self.rank == 0:
            if plans is not None:
                plans.update(saved_plans(self.store, shards))
            for frame in self._read(shards):
                yield conform(frame)

    def effects(
        self,
        models: Mapping[str, Any],
        rows: Sequence,
        task: Task,
        prompts: Prompts,
        *,
        max_length: int | None,
    ) -> pd.DataFrame:
        """Per-example task effects (``example_effects``' frame): every rank computes its ranges into shards; rank 0
        returns them all in one process's order, the other ranks an empty frame."""
        shards = self._numbered(self.n_checkpoints * len(self.chunks), self.spans)

        def compute(ids: Sequence[int]) -> pd.DataFrame:
            part = [rows[i] for i in ids]
            frame = example_effects(
                models, part, task, prompts, batch_size=self.batch_size, max_length=max_length, window=len(part),
                scoring=self.scoring,
            )  # fmt: skip
            return frame.assign(example=frame["example"].astype("int64") + ids[0])

        self._compute(shards, compute)
        if self.rank != 0:
            return pd.DataFrame(columns=list(EFFECT_COLUMNS))
        parts = list(self._read(shards))
        out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=list(EFFECT_COLUMNS))
        out = out.astype({"checkpoint": object, "metric": object, "example": "int64", "value": "float64"})
        self.close()
        return out

    def close(self) -> None:
        """Rank 0, a claim taken here (Python API): drop the shards and release OUT (the caller writes it next)."""
        if self.claim is not None and self.owned:
            self.store.clear()
            (self.claim.path / RUN_MARKER).unlink(missing_ok=True)
            if not any(self.claim.path.iterdir()):
                self.claim.path.rmdir()
            self.claim.release()


def open_ranks(
    where: str | Path | OutClaim | None,
    ckpts: Sequence[str],
    models: Mapping[str, Any],
    inputs: Inputs,
    prompts: Prompts,
    rows: Sequence,
    selection: Selection,
    evidence: Mapping[str, Mapping] | None,
    *,
    batch_size: int,
    chunk_size: int,
    max_length: int | None,
    dtype: str | None,
    scoring: str | None = None,
) -> RankRun | None:
    """Compare's shard store in ``where`` (the run's --out; rank 0 passes its claim on it), or None when ``where`` is
    None in one process (chunks go straight to the statistics, nothing resumes). With a store, one process saves its
    chunks as a rank of one does, so a killed run rerun with the same arguments computes only the unsaved chunks.
    Ranks holding different arguments or --out are refused in one line on every rank. ``scoring``: the task
    effects' (resolved) scoring, part of the run key and its facts."""
    if where is None and not distributed():
        return None
    if where is None:
        raise UsageError(
            "compare under torchrun needs a folder every rank can write its chunks to: pass shard_dir= (the CLI "
            "passes --out)"
        )
    claim: OutClaim | None = None
    if isinstance(where, OutClaim):
        claim, out = where, where.path
    else:
        out = Path(where).expanduser().absolute()
    identities = []
    for spec, model in zip(ckpts, models.values()):
        identities.append(
            run_identity(
                spec,
                model,
                inputs,
                selection,
                model_reducers(model, prompts.roles, evidence),
                prompts=prompts,
                rows=rows,
                batch_size=batch_size,
                chunk_size=chunk_size,
                max_length=max_length,
                dtype=dtype,
                seed=0,
            )  # fmt: skip
        )
    key = hashlib.sha256(json.dumps(["compare", [k for k, _ in identities], scoring]).encode()).hexdigest()[:16]
    rt.check_same_on_every_rank(
        f"run key {key}, --out {out}",
        "their run (the arguments that change the result, or --out)",
        "launch every rank with the same command",
    )
    owned = False

    def prepare() -> Progress | None:
        nonlocal claim, owned
        if not rt.is_main():
            return None
        if claim is None:
            claim, owned = claim_out(out, kind="compare", resume=True), True
            if claim.state == "finished":
                claim.release()
                raise UsageError(f"{out} already holds a finished run; choose another folder")
        facts = {"kind": "compare", "checkpoints": [f for _, f in identities], "scoring": scoring}
        return prepare_out(claim, key, claim.force, facts)

    store = rt.agree(prepare)
    rt.barrier()
    return RankRun(
        store or Progress(out, key),
        len(rows),
        len(models),
        chunk_size=chunk_size,
        batch_size=batch_size,
        claim=claim,
        owned=owned,
        scoring=scoring,
    )
