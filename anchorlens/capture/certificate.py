"""A certificate with every capture: the captured maps of a few examples checked against HF eager attention.

:func:`certify` runs the target twice on the first examples of a run: once with eager attention and
``output_attentions=True`` (transformers' own weights, the reference), once through the capture with the run's
selection and options. The largest |captured - eager| over real query rows, per captured (stack, layer), is the
certificate; learned sinks (gpt-oss) are checked as what eager's rows miss over the real keys. Above a dtype-aware
threshold the capture is not what the model computes: :func:`require_exact` stops the run with one line naming the
worst layer, unless the caller allows it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from anchorlens.capture.event import AttentionEvent
from anchorlens.capture.options import CaptureOptions
from anchorlens.capture.run import CaptureTarget, capture_batch
from anchorlens.capture.selection import Selection
from anchorlens.errors import UsageError
from anchorlens.roles.encoding import Encoded

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


@dataclass(frozen=True)
class Certificate:
    """What a capture's check against eager found: per captured layer, the largest difference over real queries.

    examples: how many examples were checked; threshold: the largest difference accepted for ``dtype``;
    seconds: what the check cost (both forwards); unavailable: why no reference exists, when eager returned none.
    """

    per_layer: tuple[LayerDiff, ...]
    examples: int
    threshold: float
    dtype: str
    seconds: float
    unavailable: str | None = None

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

    @property
    def exact(self) -> bool:
        """Whether every checked layer is within the threshold (vacuously False when nothing was checked)."""
        worst = self.max_abs_diff
        return worst is not None and worst <= self.threshold

    def to_json(self) -> dict[str, Any]:
        """The manifest's ``exactness`` record."""
        return {
            "reference": REFERENCE,
            "max_abs_diff": self.max_abs_diff,
            "threshold": self.threshold,
            "exact": self.exact,
            "examples": self.examples,
            "dtype": self.dtype,
            "seconds": round(self.seconds, 3),
            "per_layer": [{"stack": d.stack, "layer": d.layer, "max_abs_diff": d.max_abs_diff} for d in self.per_layer],
            **({"unavailable": self.unavailable} if self.unavailable else {}),
        }

    def summary(self) -> str:
        """One line for tables and reports: ``max |Δ| 3.0e-08 vs eager over 30 layers (2 examples)``."""
        if self.max_abs_diff is None:
            return f"not certified: {self.unavailable or 'no layer could be checked'}"
        verdict = "within" if self.exact else "ABOVE"
        return (
            f"max |Δ| {self.max_abs_diff:.1e} vs eager over {len(self.per_layer)} layers "
            f"({self.examples} examples; {verdict} the {self.dtype} threshold {self.threshold:.0e})"
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


class _CompareSink:
    """A sink that compares every event with the eager reference as it arrives (keeps one float per site)."""

    def __init__(self, reference: Mapping[str, Mapping[int, torch.Tensor]]) -> None:
        self.reference = reference
        self.diffs: dict[tuple[str, int], float | None] = {}

    def consume(self, event: AttentionEvent) -> None:
        """Fold one event's largest difference over real query rows into its site's."""
        key = (event.stack, event.layer)
        ref_site = self.reference.get(event.stack, {}).get(event.layer)
        if ref_site is None:
            self.diffs.setdefault(key, None)
            return
        q = slice(event.query_start, event.query_start + event.shape[2])
        ref = ref_site.index_select(1, event.heads.to(ref_site.device))[:, :, q].float().to(event.device)
        captured = event.full_probs()
        rows = event.layout.q.valid[:, None, :, None].to(captured.device)
        if ref.shape != captured.shape:
            diff = float("inf")  # the capture saw another geometry than the model computed
        elif not captured.numel():
            diff = 0.0
        elif event.learned_sink is None:
            diff = float(((captured - ref).abs() * rows).max())
        else:
            diff = _learned_sink_diff(captured, event.learned_sink, ref, rows)
        previous = self.diffs.get(key)
        self.diffs[key] = diff if previous is None else max(previous, diff)


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


def certify(
    target: CaptureTarget,
    batch: Encoded,
    selection: Selection = Selection(),
    options: CaptureOptions = CaptureOptions(),
) -> Certificate:
    """Check the capture of ``batch`` (a few examples) against eager attention at every selected site."""
    started = time.perf_counter()
    dtype = next(target.model.parameters()).dtype
    reference, gaps = _eager_reference(target, batch)
    sink = _CompareSink(reference)
    capture_batch(target, batch, sink, selection, need_logits=False, options=options)
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
    )


def require_exact(certificate: Certificate, label: str, allow_inexact: bool = False) -> None:
    """Raise InexactCaptureError (one line, the worst layer and the fix) when ``certificate`` is above threshold, or
    when some captured layer could not be checked (eager returned no weights for it)."""
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
    raise InexactCaptureError(
        f"{label}: the captured attention differs from eager by {worst.max_abs_diff:.2e} at {worst.stack} layer "
        f"{worst.layer} (threshold {certificate.threshold:.0e} for {certificate.dtype}): the numbers would not be "
        "what the model computes; report this model type, or pass --allow-inexact to keep them anyway"
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
