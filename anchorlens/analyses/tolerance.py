"""How far apart two numbers can be and still be the same number: the rounding tolerance of each measurement.

A paired difference is **rounding** (reported as 0, no p or q value, left out of the Benjamini-Hochberg family)
when every example's |checkpoint − baseline| is at most the tolerance of its kind of measurement in the run's
weights dtype; a group of values is **fixed** (its interval has no width worth printing) when its range over the
examples is within the same tolerance. The rule uses the largest per-example |Δ|, not the mean |Δ|: a change
confined to a few examples (one example moved by 0.05 among a thousand) is a finding, and the mean |Δ| would call
it rounding. Since a mean of differences each within ``tol`` is within ``tol`` too, the rule also holds for every
average a table shows (over layers, heads or examples).

===============================================  =======  =======  =======  ========
measurement (kind)                               float64  float32  float16  bfloat16
===============================================  =======  =======  =======  ========
attention probability or mass (``attention``)    1e-12    1e-5     2e-2     5e-2
normalized attention entropy (``entropy``)       1e-12    1e-5     2e-2     5e-2
label or text NLL, nats (``nll``)                1e-5     1e-4     2e-2     5e-2
KL at the answer, nats (``kl``)                  1e-6     1e-6     2e-4     1.25e-3
accuracy, 0/1 per example (``accuracy``)         0        0        0        0
===============================================  =======  =======  =======  ========

Why these values:

- ``attention``: in half precision, the capture certificate's threshold
  (:data:`anchorlens.capture.certificate.THRESHOLDS`): the weights round to the dtype and two forwards of one
  model drift that far apart, so the certificate accepts it as the same attention. In full precision rounding is
  far below the certificate's threshold (kept loose for long inputs): float32 1e-5, about 100 machine epsilons
  and 10x the largest difference measured between two computations of one attention map (README: every family
  within 1.1e-6 of eager; SmolLM2 with a renorm knockout that gives back the base in layers 0-4: every
  per-example |Δ| ≤ 4.1e-7 there on 8 RTE examples, while the smallest real change, a head that keeps 0.99999
  on the sink, moves 2e-5); float64 1e-12, still 1e4 times under its threshold. Masses are sums of
  probabilities in [0, 1]; the role ratios (guidance absorption) are larger than 1, where an absolute tolerance
  is the stricter reading.
- ``entropy``: the normalized entropy is in [0, 1] and relative rounding ε of every probability moves it by at
  most about ε (H + 1 / log K), so the attention tolerance holds.
- ``nll``: the certificate's threshold: logits come out of the whole stack of layers (the README holds two equal
  computations' logits within 1e-5 on tiny bases; a 30-layer base drifts further) and log-probabilities are
  computed in float32 (``log_softmax(logits.float())``), so even a float64 model's NLL rounds at 1e-5 (≈ 64 ε32 for
  logits up to ~50).
- ``kl``: KL is second order in the logit difference δ (KL ≈ Var(δ) / 2), so logits within the NLL tolerance t
  give KL ≤ t² / 2; its float32 sum over the vocabulary adds ~1e-6 (a knockout that gives back the base gives
  KL ~1e-8).
- ``accuracy``: a 0/1 outcome per example has no rounding: an example changed or it did not (0 discordant
  examples is the only "zero difference"). Its intervals are Wilson / Newcombe score intervals, never a
  bootstrap that collapses to a point at small n (:mod:`anchorlens.analyses.stats`).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

DEFAULT_DTYPE = "float32"
_ALIASES = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}
_KL_FLOOR = 1e-6  # float32 summation of KL over the vocabulary

# the certificate's thresholds (anchorlens.capture.certificate.THRESHOLDS) by dtype name; a test keeps them equal
CERTIFICATE: dict[str, float] = {"float64": 1e-8, "float32": 1e-4, "float16": 2e-2, "bfloat16": 5e-2}
# rounding of attention: the certificate's threshold in half precision, far under it in full precision
ATTENTION: dict[str, float] = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-2, "bfloat16": 5e-2}
_NLL = {d: max(t, 1e-5) for d, t in CERTIFICATE.items()}  # log-softmax in float32: 1e-5 at least
TOLERANCES: dict[str, dict[str, float]] = {
    "attention": dict(ATTENTION),
    "entropy": dict(ATTENTION),
    "nll": _NLL,
    "kl": {d: max(t**2 / 2, _KL_FLOOR) for d, t in _NLL.items()},
    "accuracy": dict.fromkeys(ATTENTION, 0.0),
}
# tidy metric (paired.csv, headline.csv) or task effect (task_effects.csv) -> kind of measurement
_KIND_OF_METRIC = {"entropy": "entropy", "correct": "accuracy", "accuracy": "accuracy", "nll": "nll", "kl": "kl"}


def dtype_name(dtype: object | None) -> str:
    """``float32``, ``bfloat16``, ... for a dtype name, alias (bf16, fp16) or torch dtype; None: float32."""
    if dtype is None:
        return DEFAULT_DTYPE
    name = str(dtype).removeprefix("torch.").lower()
    name = _ALIASES.get(name, name)
    if name not in ATTENTION:
        raise ValueError(f"no rounding tolerance for dtype {dtype!r}; use one of {', '.join(ATTENTION)}")
    return name


def kind_of(metric: str) -> str:
    """The kind of measurement of a tidy metric or task effect: entropy, nll, kl, accuracy, else attention."""
    return _KIND_OF_METRIC.get(str(metric), "attention")


def tolerance(kind: str, dtype: object | None = None) -> float:
    """The rounding tolerance of a kind of measurement (see the module table) in ``dtype`` (default float32)."""
    if kind not in TOLERANCES:
        raise ValueError(f"unknown kind of measurement {kind!r}; one of {', '.join(TOLERANCES)}")
    return TOLERANCES[kind][dtype_name(dtype)]


def metric_tolerances(metrics: Iterable[str], dtype: object | None = None) -> np.ndarray:
    """Tolerance [len(metrics)] float64 of each tidy metric / task effect name."""
    return np.array([tolerance(kind_of(m), dtype) for m in metrics], dtype=np.float64)


def rounding_phrase(dtype: object | None = None) -> str:
    """``float32 rounding``: how a table names a difference within the tolerance."""
    return f"{dtype_name(dtype)} rounding"
