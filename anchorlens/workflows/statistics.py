"""Stream a model's attention over examples into a tidy metrics frame, and certify the capture against eager."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import nullcontext

import pandas as pd

from anchorlens import runtime as rt
from anchorlens.analyses import default_reducers, metrics_frame, metrics_rows
from anchorlens.analyses.rows import Rows
from anchorlens.capture.certificate import CertifyOptions, certify, require_exact
from anchorlens.capture.collect import encode_batches, stream_statistics
from anchorlens.capture.options import CaptureOptions
from anchorlens.capture.reducer import Reducer
from anchorlens.capture.selection import Selection
from anchorlens.engine.plan import KERNEL
from anchorlens.errors import UsageError
from anchorlens.roles.table import RoleTable
from anchorlens.tasks.prompts import Prompts
from anchorlens.workflows.first_pass import first_pass
from anchorlens.workflows.inputs import Inputs


def model_reducers(model, roles: RoleTable, evidence: Mapping[str, Mapping] | None = None) -> list[Reducer]:
    """Fresh default reducers of a run of ``model`` (entropy also of its anchor's queries) counting ``roles``, plus
    the opt-in ``evidence`` reducers (name -> options)."""
    return default_reducers(model.entropy_anchor() or "capsule", roles=roles, extra=evidence or {})


def capture_statistics(
    model,
    inputs: Inputs,
    *,
    selection: Selection = Selection(),
    batch_size: int = 8,
    max_length: int | None = None,
    anchors: Sequence[str] | None = None,
    progress=None,
    prompts: Prompts | None = None,
    evidence: Mapping[str, Mapping] | None = None,
) -> pd.DataFrame:
    """Per-example metric rows (reducers + derived metrics) of ``model`` on ``inputs`` (rendered by ``prompts``, built
    from the inputs and the model's tokenizer when not given); ``evidence``: the opt-in evidence reducers to add
    (name -> options, :func:`~anchorlens.analyses.evidence.parse_evidence`)."""
    from anchorlens.methods import load_guided

    model = load_guided(model)  # a Base becomes GuidedModel(base); a GuidedModel passes
    anchors = tuple(anchors or model.anchors())
    prompts = prompts or inputs.prompts(model.base.tokenizer, max_length)
    rows = prompts.examples(inputs.examples)  # the examples, or a text task's windows
    first_pass(model, rows, prompts, batch_size=batch_size, max_length=max_length)  # every example, on every rank
    info = rt.dist_info()
    ids = list(range(len(rows)))
    if rt.initialized():  # torchrun / accelerate: this rank streams its shard, then ranks sum their states
        ids = rt.shard(ids, info.rank, info.world_size)
    reducers = model_reducers(model, prompts.roles, evidence)
    stream_statistics(
        model, _batches(model, rows, ids, prompts, batch_size, max_length), reducers, selection, progress=progress
    )
    rt.all_reduce_reducers(reducers)
    return metrics_frame(reducers, anchors=anchors)


def _batches(model, rows: Sequence, ids: Sequence[int], prompts: Prompts, batch_size: int, max_length: int | None):
    """Encoded batches of ``rows[ids]`` (example ids kept)."""
    return encode_batches(
        model, [rows[i] for i in ids], prompts, batch_size=batch_size, example_ids=list(ids), max_length=max_length
    )


def chunk_rows(
    model,
    rows: Sequence,
    ids: Sequence[int],
    prompts: Prompts,
    *,
    selection: Selection = Selection(),
    batch_size: int = 8,
    max_length: int | None = None,
    anchors: Sequence[str] | None = None,
    progress=None,
    evidence: Mapping[str, Mapping] | None = None,
    options: CaptureOptions = CaptureOptions(),
    plans: dict[str, str] | None = None,
) -> Rows:
    """Per-example metric rows of the examples ``rows[ids]`` as integer-coded :class:`~anchorlens.analyses.rows.Rows`
    (one chunk of a run: fresh reducers, so memory holds this chunk only; a shard is written from them without a
    frame); ``model`` a GuidedModel, ``rows`` rendered by ``prompts``; ``evidence``: the opt-in evidence reducers to
    add (name -> options); ``options``: how the capture computes (its ``plan``); ``plans``: filled with the plan each
    site took (site name -> ``kernel``, ``materialised`` or ``mixed``, :func:`~anchorlens.capture.collect.
    stream_statistics`)."""
    anchors = tuple(anchors or model.anchors())
    reducers = model_reducers(model, prompts.roles, evidence)
    batches = _batches(model, rows, ids, prompts, batch_size, max_length)
    stream_statistics(model, batches, reducers, selection, progress=progress, options=options, plans=plans)
    return metrics_rows(reducers, anchors=anchors)


def certify_capture(
    model,
    rows: Sequence,
    prompts: Prompts,
    *,
    selection: Selection = Selection(),
    max_length: int | None = None,
    options: CertifyOptions = CertifyOptions(),
    label: str = "the capture",
    capture: CaptureOptions = CaptureOptions(),
    evidence: Mapping[str, Mapping] | None = None,
) -> dict | None:
    """The manifest's ``exactness`` record of ``model``'s capture on the first rows (None when disabled).

    Both plans are checked: the materialised plan's probabilities, and the kernel plan's statistics as the run's
    reducers (:func:`model_reducers` with ``evidence``) ask for them, unless ``capture.plan`` is ``materialised``
    (:func:`~anchorlens.capture.certificate.certify`). InexactCaptureError (one line naming the plan and the layer)
    when either differs from eager beyond the dtype's threshold, unless ``options.allow_inexact``; UsageError (the
    engine's one line) when ``capture.plan`` is ``kernel`` and the kernel plan is refused.
    """
    if not options.enabled or not rows:
        return None
    count = min(options.examples, len(rows))
    batch = next(_batches(model, rows, range(count), prompts, count, max_length))
    knockouts = bool(getattr(model, "knockout_list", list)())
    reducers = model_reducers(model, prompts.roles, evidence)
    with model.knockouts_paused() if knockouts else nullcontext():
        certificate = certify(model, batch, selection, capture, reducers=reducers)
    if capture.plan == KERNEL and certificate.kernel.unavailable is not None:
        raise UsageError(certificate.kernel.unavailable)  # the run itself would stop at its first forward
    require_exact(certificate, label, options.allow_inexact)
    record = certificate.to_json()
    if knockouts:
        record["knockouts"] = "not applied while certifying (eager attention has none; each mode has its own test)"
    return record
