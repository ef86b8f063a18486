"""A certificate with every capture: the captured maps of a few examples checked against HF eager attention.

:func:`certify` runs the target twice on the first examples of a run: once with eager attention and
``output_attentions=True`` (transformers' own weights, the reference), once through the capture with the run's
selection and options. The largest |captured - eager| over real query rows, per captured (stack, layer), is the
certificate; learned sinks (gpt-oss) are checked as what eager's rows miss over the real keys. Above a dtype-aware
threshold the capture is not what the model computes: :func:`require_exact` stops the run with one line naming the
worst layer, unless the caller allows it.

Given the run's reducers, the certificate also checks the kernel plan (:mod:`anchorlens.engine.kernel`), which computes
no probabilities: a second capture of the same batch under ``plan="kernel"`` asks for the columns the reducers ask for,
and its statistics are compared with the same eager maps (:class:`_KernelCompareSink`: the key sums ``P @ C`` and the
sums ``sum_j p log p`` over the score columns). Where the kernel plan is refused (soft-capping, float16 inputs...), the
record says why instead (``unavailable``); where the reducers read what it lacks (the maps themselves), that it does not
apply (``not_applicable``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from anchorlens.capture.event import AttentionEvent
from anchorlens.capture.options import CaptureOptions
from anchorlens.capture.reducer import Reducer
from anchorlens.capture.run import CaptureTarget, capture_batch
from anchorlens.capture.selection import Selection
from anchorlens.capture.sinks import StreamSink
from anchorlens.engine.plan import KERNEL, MATERIALISED
from anchorlens.engine.quantities import KERNEL_QUANTITIES, KEY_SUMS, RECEIVED, SCORE_SUMS, VALUE_SUMS
from anchorlens.errors import UsageError
from anchorlens.roles.encoding import Encoded
from anchorlens.roles.layout import Layout

REFERENCE = "eager"
CERTIFIED_EXAMPLES = 2  # examples a run checks: one forward each way, a few seconds on a CPU at SmolLM2's size
# Largest |captured - eager| accepted per weights dtype. float32 agrees to ~1e-6 (rounding of two softmax orders);
# in half precision eager rounds its weights to the dtype and the two forwards' hidden states drift apart.
THRESHOLDS: dict[torch.dtype, float] = {
    torch.float64: 1e-8,
    torch.float32: 1e-4,
    torch.float16: 2e-2,
    torch.bfloat16: 5e-2,
}


class InexactCaptureError(UsageError):
    """The captured maps differ from eager attention by more than the dtype's threshold."""


@dataclass(frozen=True)
class LayerDiff:
    """The largest |captured - eager| at one captured site (``max_abs_diff`` None: eager returned no weights)."""

    stack: str
    layer: int
    max_abs_diff: float | None


class _PerLayer:
    """The largest difference over the ``per_layer`` diffs of a check (a mixin of :class:`PlanCheck` and
    :class:`Certificate`)."""

    per_layer: tuple[LayerDiff, ...]

    @property
    def max_abs_diff(self) -> float | None:
        """The largest difference over every checked layer (None when nothing could be checked)."""
        diffs = [d.max_abs_diff for d in self.per_layer if d.max_abs_diff is not None]
        return max(diffs) if diffs else None

    @property
    def worst(self) -> LayerDiff | None:
        """The layer with the largest difference."""
        checked = [d for d in self.per_layer if d.max_abs_diff is not None]
        return max(checked, key=lambda d: d.max_abs_diff or 0.0) if checked else None

    def layers_json(self) -> list[dict[str, Any]]:
        """``per_layer`` as the manifest records it."""
        return [{"stack": d.stack, "layer": d.layer, "max_abs_diff": d.max_abs_diff} for d in self.per_layer]


@dataclass(frozen=True)
class PlanCheck(_PerLayer):
    """The kernel plan's part of a certificate: its statistics against eager's maps, per captured layer.

    per_layer: the largest |captured - eager| over the compared quantities at each site; compared: which quantities
    (``key_sums``: P @ C over the key columns the reducers ask for; ``score_sums``: sum_j p log p over their score
    columns, from the captured score sums and log normaliser; ``received``: the mass each key receives, per valid
    query; ``value_sums``: the key sums weighted by the value norms); unavailable: the one line the forced kernel plan was
    refused with (the module or the inputs rule it out); not_applicable: why it was not run (the reducers read what
    the kernel plan does not compute, none were given, or the run asks for the materialised plan).
    """

    per_layer: tuple[LayerDiff, ...] = ()
    compared: tuple[str, ...] = ()
    unavailable: str | None = None
    not_applicable: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The record's ``plans["kernel"]``."""
        return {
            "max_abs_diff": self.max_abs_diff,
            "per_layer": self.layers_json(),
            "compared": list(self.compared),
            **({"unavailable": self.unavailable} if self.unavailable else {}),
            **({"not_applicable": self.not_applicable} if self.not_applicable else {}),
        }


NOT_GIVEN = PlanCheck(not_applicable="the certificate was given no reducers")


@dataclass(frozen=True)
class Certificate(_PerLayer):
    """What a capture's check against eager found: per captured layer, the largest difference over real queries.

    per_layer: the materialised plan's probabilities against eager's maps (its ``max_abs_diff`` and ``worst``);
    examples: how many examples were checked;
    threshold: the largest difference accepted for ``dtype`` (for either plan); seconds: what the check cost (every
    forward); unavailable: why no reference exists, when eager returned none; kernel: the kernel plan's statistics
    against the same maps (:class:`PlanCheck`).
    """

    per_layer: tuple[LayerDiff, ...]
    examples: int
    threshold: float
    dtype: str
    seconds: float
    unavailable: str | None = None
    kernel: PlanCheck = NOT_GIVEN

    @property
    def kernel_exact(self) -> bool:
        """Whether the kernel plan is within the threshold where it was checked (True where it was not)."""
        worst = self.kernel.max_abs_diff
        return worst is None or worst <= self.threshold

    @property
    def exact(self) -> bool:
        """Whether every checked layer of both plans is within the threshold (vacuously False when the materialised
        plan could check nothing)."""
        worst = self.max_abs_diff
        return worst is not None and worst <= self.threshold and self.kernel_exact

    def to_json(self) -> dict[str, Any]:
        """The manifest's ``exactness`` record: the materialised plan's at the top (as before the kernel plan was
        checked), ``exact`` over both, and each plan's under ``plans``."""
        materialised = {
            "max_abs_diff": self.max_abs_diff,
            "per_layer": self.layers_json(),
            "compared": ["probs"],
            **({"unavailable": self.unavailable} if self.unavailable else {}),
        }
        return {
            "reference": REFERENCE,
            "max_abs_diff": self.max_abs_diff,
            "threshold": self.threshold,
            "exact": self.exact,
            "examples": self.examples,
            "dtype": self.dtype,
            "seconds": round(self.seconds, 3),
            "per_layer": materialised["per_layer"],
            **({"unavailable": self.unavailable} if self.unavailable else {}),
            "plans": {MATERIALISED: materialised, KERNEL: self.kernel.to_json()},
        }

    def summary(self) -> str:
        """One line for tables and reports: ``max |Δ| 3.0e-08 vs eager over 30 layers (2 examples; ...); kernel plan
        max |Δ| 2.0e-07``."""
        if self.max_abs_diff is None:
            return f"not certified: {self.unavailable or 'no layer could be checked'}"
        verdict = "within" if self.exact else "ABOVE"
        kernel = self.kernel.max_abs_diff
        return (
            f"max |Δ| {self.max_abs_diff:.1e} vs eager over {len(self.per_layer)} layers "
            f"({self.examples} examples; {verdict} the {self.dtype} threshold {self.threshold:.0e})"
            + (f"; kernel plan max |Δ| {kernel:.1e}" if kernel is not None else "")
        )


def threshold_for(dtype: torch.dtype) -> float:
    """The largest accepted |captured - eager| for weights of ``dtype``."""
    return THRESHOLDS.get(dtype, THRESHOLDS[torch.float32])


def eager_reference(target: CaptureTarget, batch: Encoded) -> dict[str, dict[int, torch.Tensor]]:
    """HF eager ``output_attentions`` of ``target`` on ``batch``: per stack, layer -> [B, H, Q, K].

    Eager returns one map per softmax-attention layer in order; they are keyed by the layers of the target's sites
    (hybrid models have blocks without softmax attention). A stack eager returns no weights for, or another number
    of maps than the target has sites, is left out.
    """
    return _eager_reference(target, batch)[0]


def _eager_reference(
    target: CaptureTarget, batch: Encoded
) -> tuple[dict[str, dict[int, torch.Tensor]], dict[str, str]]:
    """:func:`eager_reference`, and for each stack left out although eager returned maps for it, why (how many
    maps for how many sites: ALBERT-like layers sharing one module return one map per call, for one site)."""
    model: Any = target.model
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = target.forward(batch.to(target.device), output_attentions=True)
    finally:
        model.set_attn_implementation(before)
    stacks = tuple(target.adapter.stacks())
    if "cross" in stacks or {"encoder", "decoder"} <= set(stacks):
        maps = {"encoder": out.encoder_attentions, "decoder": out.decoder_attentions, "cross": out.cross_attentions}
    else:
        maps = {stacks[0]: out.attentions}
    layers: dict[str, list[int]] = {}
    for site, _ in target.sites():
        layers.setdefault(site.stack, []).append(site.layer)
    reference: dict[str, dict[int, torch.Tensor]] = {}
    gaps: dict[str, str] = {}
    for stack, tensors in maps.items():
        found = [t for t in (tensors or ()) if t is not None]
        sites = len(layers.get(stack, ()))
        if found and len(found) == sites:
            reference[stack] = dict(zip(layers[stack], found, strict=True))
        elif found and sites:
            gaps[stack] = (
                f"eager attention returned {len(found)} maps for the {stack} stack but the capture found "
                f"{sites} attention site{'s' if sites != 1 else ''} there"
            )
    return reference, gaps


class _SiteDiffs:
    """Folds each event's largest difference from the eager reference into its site's (one float per site; None
    for a site eager returned no map for)."""

    def __init__(self, reference: Mapping[str, Mapping[int, torch.Tensor]]) -> None:
        self.reference = reference
        self.diffs: dict[tuple[str, int], float | None] = {}

    def consume(self, event: AttentionEvent) -> None:
        """Fold one event's largest difference (:meth:`difference`) into its site's."""
        key = (event.stack, event.layer)
        ref_site = self.reference.get(event.stack, {}).get(event.layer)
        if ref_site is None:
            self.diffs.setdefault(key, None)
            return
        diff = self.difference(event, ref_site)
        previous = self.diffs.get(key)
        self.diffs[key] = diff if previous is None else max(previous, diff)

    def difference(self, event: AttentionEvent, ref_site: torch.Tensor) -> float:
        """The largest difference of ``event`` from eager's map of its site, ``ref_site`` [B, H_all, Q, K]."""
        raise NotImplementedError


class _CompareSink(_SiteDiffs):
    """A sink that compares every event's probabilities with the eager reference as it arrives."""

    def difference(self, event: AttentionEvent, ref_site: torch.Tensor) -> float:
        """The largest |captured - eager| over the event's real query rows."""
        q = slice(event.query_start, event.query_start + event.shape[2])
        ref = ref_site.index_select(1, event.heads.to(ref_site.device))[:, :, q].float().to(event.device)
        captured = event.full_probs()
        rows = event.layout.q.valid[:, None, :, None].to(captured.device)
        if ref.shape != captured.shape:
            return float("inf")  # the capture saw another geometry than the model computed
        if not captured.numel():
            return 0.0
        if event.learned_sink is None:
            return float(((captured - ref).abs() * rows).max())
        return _learned_sink_diff(captured, event.learned_sink, ref, rows)


def _learned_sink_diff(captured: torch.Tensor, sink: torch.Tensor, ref: torch.Tensor, rows: torch.Tensor) -> float:
    """Largest difference at a site with a learned sink, in the convention of eager's weights.

    captured [B, H, q, K] (rows sum to 1 - sink), sink [B, H, q], ref [B, H, q, K], rows [B, 1, q, 1]. gpt-oss's eager
    weights include the sink (rows sum to 1 - sink: compared as they are, the sink against what the rows miss);
    Granite SWA's are over the real keys only (the sink scales the output): compared renormalized.
    """
    missing = 1 - ref.sum(-1)
    if float((missing.abs() * rows[..., 0]).max()) > 1e-4:
        return max(float(((captured - ref).abs() * rows).max()), float(((sink - missing).abs() * rows[..., 0]).max()))
    real = captured / (1 - sink).clamp_min(torch.finfo(captured.dtype).tiny).unsqueeze(-1)
    return float(((real - ref).abs() * rows).max())


class _KernelCompareSink(_SiteDiffs):
    """A sink that compares the kernel plan's statistics with the eager reference as they arrive (one float per site).

    It asks for what the run's reducers ask for (``reads``, ``readers``, ``wants_value_norms``, ``key_columns``,
    ``score_columns`` and ``column_parts`` are a :class:`~anchorlens.capture.sinks.StreamSink`'s of them: the very
    column tensors the run's reducers return), so the engine computes what it computes in the run, and updates none
    of them.
    """

    def __init__(self, reference: Mapping[str, Mapping[int, torch.Tensor]], reducers: Sequence[Reducer]) -> None:
        super().__init__(reference)
        self.stream = StreamSink(reducers)
        self.compared: set[str] = set()

    @property
    def reads(self) -> frozenset[str]:
        """What the run's reducers read."""
        return self.stream.reads

    def readers(self, quantity: str) -> list[str]:
        """The names of the run's reducers that read ``quantity``."""
        return self.stream.readers(quantity)

    @property
    def wants_value_norms(self) -> bool:
        """Whether the run's reducers read the value norms (then the engine computes them, and the value sums)."""
        return self.stream.wants_value_norms

    def key_columns(self, layout: Layout, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """[B, K, C] the reducers' key columns (:meth:`StreamSink.key_columns`)."""
        return self.stream.key_columns(layout, device, dtype)

    def score_columns(self, layout: Layout, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """[B, K, S] the reducers' score columns (:meth:`StreamSink.score_columns`)."""
        return self.stream.score_columns(layout, device, dtype)

    def column_parts(self, columns: torch.Tensor | None) -> tuple[tuple[torch.Tensor, int], ...]:
        """The reducers' own column tensors joined into ``columns`` (:meth:`StreamSink.column_parts`)."""
        return self.stream.column_parts(columns)

    def difference(self, event: AttentionEvent, ref_site: torch.Tensor) -> float:
        """The largest difference of the event's statistics over real query rows that see a key
        (:func:`_kernel_diff`)."""
        return _kernel_diff(event, ref_site, self.compared)


def _kernel_diff(event: AttentionEvent, ref_site: torch.Tensor, compared: set[str]) -> float:
    """The largest difference of one kernel-plan event's statistics from eager's map ``ref_site`` [B, H_all, Q, K].

    With P_ref [B, H, q, K'] eager's rows of the event's heads and queries over the K' keys it covers: ``key_sums``
    [B, H, q, C] against P_ref @ C (C: the event's ``key_columns`` [B, K, C] over those keys), and for the score
    columns W [B, K, S] the captured ``score_sums - log_norm * (P_ref @ W)`` against sum_j P_ref log P_ref W
    (0 log 0 = 0), over the valid query rows that see at least one key; ``received`` [B, H, K'] against the column
    sums of P_ref over the valid queries, per valid query (the sink battery's alpha); ``value_sums`` against
    P_ref @ (n^h * C) with the event's value norms n. Adds the names of the quantities compared to
    ``compared``; inf when the event's geometry differs from eager's."""
    b, h, q_len, k_len = event.shape
    q = slice(event.query_start, event.query_start + q_len)
    ref = ref_site.index_select(1, event.heads.to(ref_site.device))[:, :, q].float().to(event.device)
    if ref.shape[:3] != (b, h, q_len) or ref.shape[3] < k_len:
        return float("inf")  # the capture saw another geometry than the model computed
    sees = event.visible_mask().any(-1).expand(b, h, q_len)
    rows = (sees & event.layout.q.valid[:, None, :].to(sees.device)).unsqueeze(-1)  # [B, H, q, 1]
    if not bool(rows.any()):
        return 0.0
    if bool((ref[..., k_len:] * rows).any()):
        return float("inf")  # eager's real rows attend to keys the event says they do not see
    ref = ref[..., :k_len]
    diff = 0.0
    if event.key_sums is not None and event.key_columns is not None:
        columns = event.key_columns[:, :k_len].to(ref.dtype)
        expected = torch.matmul(ref, columns.unsqueeze(1))  # [B, H, q, C]
        diff = max(diff, float(((event.key_sums - expected).abs() * rows).max()))
        compared.add(KEY_SUMS)
    if event.score_sums is not None and event.score_columns is not None and event.log_norm is not None:
        weights = event.score_columns[:, :k_len].to(ref.dtype).unsqueeze(1)  # [B, 1, K', S]
        mass = torch.matmul(ref, weights)  # [B, H, q, S]
        # a query that sees no key has a very negative log normaliser: masked, never multiplied in
        log_norm = torch.where(rows, event.log_norm, 0.0)
        captured = event.score_sums - log_norm * mass
        expected = torch.matmul(torch.xlogy(ref, ref), weights)
        diff = max(diff, float(((captured - expected).abs() * rows).max()))
        compared.add(SCORE_SUMS)
    if event.value_sums is not None and event.key_columns is not None and event.value_norms is not None:
        norms = event.value_norms[..., :k_len, None].to(ref.dtype)  # [B, H, K', 1]
        expected = torch.matmul(ref, event.key_columns[:, None, :k_len].to(ref.dtype) * norms)  # [B, H, q, C]
        diff = max(diff, float(((event.value_sums - expected).abs() * rows).max()))
        compared.add(VALUE_SUMS)
    if event.received is not None:
        valid = event.layout.q.valid.to(ref.device).to(ref.dtype)  # [B, q]
        expected = torch.matmul(valid[:, None, None, :], ref).squeeze(2)  # [B, H, K']
        per_query = (event.received - expected).abs() / valid.sum(1).clamp_min(1.0)[:, None, None]
        diff = max(diff, float(per_query.max()))
        compared.add(RECEIVED)
    return diff


def certify(
    target: CaptureTarget,
    batch: Encoded,
    selection: Selection = Selection(),
    options: CaptureOptions = CaptureOptions(),
    reducers: Sequence[Reducer] | None = None,
) -> Certificate:
    """Check the capture of ``batch`` (a few examples) against eager attention at every selected site.

    The probabilities are checked under the materialised plan (whatever ``options.plan``). With ``reducers`` (fresh
    ones of the run: they are not updated), the kernel plan's statistics are checked too (:class:`PlanCheck`), unless
    ``options.plan`` is ``"materialised"`` (the run never takes the kernel plan) or the reducers read what the
    kernel plan does not compute."""
    started = time.perf_counter()
    dtype = next(target.model.parameters()).dtype
    reference, gaps = _eager_reference(target, batch)
    sink = _CompareSink(reference)
    capture_batch(target, batch, sink, selection, need_logits=False, options=replace(options, plan="materialised"))
    per_layer = tuple(LayerDiff(stack, layer, diff) for (stack, layer), diff in sorted(sink.diffs.items()))
    unavailable = None
    missing = sorted({d.stack for d in per_layer if d.max_abs_diff is None})
    if not reference and not gaps:
        unavailable = "eager attention returned no weights for this model"
    elif missing or not reference:
        unavailable = "; ".join(
            gaps.get(stack, f"eager attention returned no weights for the {stack} stack")
            for stack in (missing or sorted(gaps))
        )
    return Certificate(
        per_layer=per_layer,
        examples=batch.batch_size,
        threshold=threshold_for(dtype),
        dtype=str(dtype).removeprefix("torch."),
        seconds=time.perf_counter() - started,
        unavailable=unavailable,
        kernel=_check_kernel(target, batch, selection, options, reducers, reference),
    )


def _check_kernel(
    target: CaptureTarget,
    batch: Encoded,
    selection: Selection,
    options: CaptureOptions,
    reducers: Sequence[Reducer] | None,
    reference: Mapping[str, Mapping[int, torch.Tensor]],
) -> PlanCheck:
    """The kernel plan's :class:`PlanCheck` of ``batch`` (module docstring)."""
    if reducers is None:
        return NOT_GIVEN
    if options.plan == MATERIALISED:
        return PlanCheck(not_applicable="the run computes every site with the materialised plan")
    sink = _KernelCompareSink(reference, reducers)
    lacking = sorted(sink.reads - KERNEL_QUANTITIES)
    if lacking:
        who = ", ".join(sink.readers(lacking[0])) or "the reducers"
        return PlanCheck(not_applicable=f"{who} reads {lacking[0]}, which the kernel plan does not compute")
    try:
        capture_batch(target, batch, sink, selection, need_logits=False, options=replace(options, plan="kernel"))
    except UsageError as refused:  # the module or the inputs rule the kernel plan out: one line naming why
        return PlanCheck(unavailable=str(refused))
    per_layer = tuple(LayerDiff(stack, layer, diff) for (stack, layer), diff in sorted(sink.diffs.items()))
    return PlanCheck(per_layer=per_layer, compared=tuple(sorted(sink.compared)))


def require_exact(certificate: Certificate, label: str, allow_inexact: bool = False) -> None:
    """Raise InexactCaptureError (one line, the plan, the worst layer and the fix) when either checked plan of
    ``certificate`` is above threshold, or when some captured layer could not be checked (eager returned no weights
    for it)."""
    if allow_inexact:
        return
    if certificate.unavailable is not None:
        raise InexactCaptureError(
            f"{label}: the capture cannot be certified ({certificate.unavailable}); pass --allow-inexact to go on "
            "with numbers nothing has checked"
        )
    worst = certificate.worst
    if worst is None or certificate.exact:
        return
    plan, what = MATERIALISED, "the captured attention differs"
    if worst.max_abs_diff is not None and worst.max_abs_diff <= certificate.threshold:
        kernel = certificate.kernel.worst
        assert kernel is not None, "an inexact certificate has a layer above threshold"
        plan, what, worst = KERNEL, "the statistics differ", kernel
    raise InexactCaptureError(
        f"{label}: under the {plan} plan {what} from eager by {worst.max_abs_diff:.2e} at {worst.stack} "
        f"layer {worst.layer} (threshold {certificate.threshold:.0e} for {certificate.dtype}): the numbers would not "
        "be what the model computes; report this model type, or pass --allow-inexact to keep them anyway"
    )


@dataclass(frozen=True)
class CertifyOptions:
    """Whether a run certifies its capture, on how many examples, and whether an inexact one may go on."""

    enabled: bool = True
    allow_inexact: bool = False
    examples: int = CERTIFIED_EXAMPLES

    def __post_init__(self) -> None:
        if self.examples < 1:
            raise UsageError(f"a certificate needs at least one example (got {self.examples})")
