"""Statistics over examples: percentile bootstrap CIs, sign-flip paired tests, Benjamini-Hochberg.

Every group of n values is resampled with the same seeded draws, a function of (seed, n) only, so
results do not depend on group order and ``bootstrap_ci(v)`` equals the ``summarize`` row of a
group holding ``v`` in that order. Groups of equal size are resampled together as one matrix
product: bootstrap means = values [G, n] @ resample counts [n, n_boot] / n. Non-finite values are
dropped before anything is computed.

Rounding is not a finding: ``paired_summary(..., tolerance=)`` marks a group whose every |diff| is within the
measurement's tolerance (:mod:`anchorlens.analyses.tolerance`) and gives it no p-value, so
:func:`benjamini_hochberg` leaves it out of the family. Paired 0/1 outcomes (accuracy) take score intervals,
:func:`wilson_interval` and :func:`newcombe_paired_interval`, which keep their width at small n.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from statistics import NormalDist

import numpy as np
import pandas as pd

from anchorlens.analyses.frames import ROW_KEYS

_CHUNK = 1 << 20  # elements per temporary block (8 MiB of float64: transients do not grow with the number of examples)


_CACHE_LIMIT = _CHUNK  # resample / sign matrices up to this many elements (8 MiB) are built once and reused; larger
# ones are streamed in blocks: a cached matrix is [draws, n], so any larger limit makes memory grow with n up to it


@functools.lru_cache(maxsize=2)
def _cached(kind: str, n: int, draws: int, seed: int) -> np.ndarray:
    """One whole [draws, n] matrix of ``_blocks(kind, ...)``, kept for reuse (read-only)."""
    out = np.concatenate(list(_blocks(kind, n, draws, seed)))
    out.setflags(write=False)
    return out


def _blocks(kind: str, n: int, draws: int, seed: int) -> Iterator[np.ndarray]:
    """Blocks [c, n] float64: bootstrap multiplicities (``"boot"``, rows sum to n) or random +-1
    signs (``"sign"``), ``draws`` rows in all, a function of (seed, n) only."""
    rng = np.random.default_rng([seed, n] if kind == "boot" else [seed, n, 1])
    step = max(1, _CHUNK // max(n, 1))
    for start in range(0, draws, step):
        c = min(step, draws - start)
        if kind == "boot":
            idx = rng.integers(0, n, size=(c, n)) + (np.arange(c) * n)[:, None]
            yield np.bincount(idx.ravel(), minlength=c * n).reshape(c, n).astype(np.float64)
        else:
            yield rng.integers(0, 2, size=(c, n)) * 2.0 - 1.0


def _matrices(kind: str, n: int, draws: int, seed: int) -> Iterator[np.ndarray]:
    """The draws of ``_blocks``: one cached matrix when small enough (reused across every cell and
    call), else streamed in blocks so memory stays bounded."""
    if n * draws <= _CACHE_LIMIT:
        yield _cached(kind, n, draws, seed)
    else:
        yield from _blocks(kind, n, draws, seed)


def _bootstrap_rows(values: np.ndarray, n_boot: int, ci: float, seed: int) -> tuple[np.ndarray, ...]:
    """Percentile bootstrap of the mean of each row of values [G, n] -> (mean, lo, hi), each [G].

    One resample matrix (multiplicities [n_boot, n]) serves every row: bootstrap means =
    values @ counts.T / n, rows in chunks so the [rows, n_boot] block stays small.
    """
    g, n = values.shape
    mean = values.mean(1)
    lo, hi = np.empty(g), np.empty(g)
    alpha = (1.0 - ci) / 2.0
    rows = max(1, _CHUNK // max(n_boot, 1))
    boots = np.empty((min(g, rows), n_boot))
    for start in range(0, g, rows):
        block = values[start : start + rows]
        out = boots[: len(block)]
        col = 0
        for counts in _matrices("boot", n, n_boot, seed):
            np.matmul(block, counts.T, out=out[:, col : col + len(counts)])
            col += len(counts)
        out /= n
        lo[start : start + rows], hi[start : start + rows] = np.quantile(out, [alpha, 1.0 - alpha], axis=1)
    const = np.ptp(values, axis=1) == 0
    mean[const] = lo[const] = hi[const] = values[const, 0]
    return mean, lo, hi


def _sign_patterns(n: int, n_perm: int, seed: int) -> tuple[Iterator[np.ndarray], bool]:
    """Blocks [c, n] of +-1 signs: all 2**n patterns when 2**n <= n_perm (exact), else n_perm random."""
    exact = n < 63 and 2**n <= n_perm

    def blocks() -> Iterator[np.ndarray]:
        step = max(1, _CHUNK // max(n, 1))
        total, bits = 2**n, np.arange(n)
        for start in range(0, total, step):
            codes = np.arange(start, min(total, start + step))[:, None]
            yield ((codes >> bits) & 1) * 2.0 - 1.0

    return (blocks() if exact else _matrices("sign", n, n_perm, seed)), exact


def _sign_flip_rows(diffs: np.ndarray, n_perm: int, seed: int) -> np.ndarray:
    """Two-sided sign-flip p-value of mean(diff) = 0 for each row of diffs [G, n] -> [G].

    Statistic |mean|; exact enumeration when 2**n <= n_perm (p = #{|T*| >= |T|} / 2**n), else
    Monte Carlo with p = (1 + #{|T*| >= |T|}) / (1 + n_perm). Ties count as extreme. One sign
    matrix serves every row (rows in chunks).
    """
    g, n = diffs.shape
    observed = np.abs(diffs.mean(1))
    tol = 1e-12 * np.maximum(1.0, np.abs(diffs).max(1, initial=0.0))
    extreme = np.zeros(g)
    rows = max(1, _CHUNK // max(n_perm, 1))
    total, exact = 0, False
    for start in range(0, g, rows):
        block, threshold = diffs[start : start + rows], (observed - tol)[start : start + rows, None]
        blocks, exact = _sign_patterns(n, n_perm, seed)
        total = 0
        for signs in blocks:
            stats = np.abs(block @ signs.T) / n  # [rows, c]
            extreme[start : start + rows] += (stats >= threshold).sum(1)
            total += len(signs)
    return extreme / total if exact else (extreme + 1.0) / (total + 1.0)


def _finite(values) -> np.ndarray:
    """1-D float64 array of the finite entries of ``values``."""
    v = np.asarray(values, dtype=np.float64).ravel()
    return v[np.isfinite(v)]


def bootstrap_ci(values, n_boot: int = 2000, ci: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """(mean, lo, hi): percentile bootstrap CI of the mean of ``values`` [n]; NaNs for no values.

    Constant input gives lo = hi = mean exactly.
    """
    v = _finite(values)
    if v.size == 0:
        return (float("nan"),) * 3
    mean, lo, hi = _bootstrap_rows(v[None, :], n_boot, ci, seed)
    return float(mean[0]), float(lo[0]), float(hi[0])


def sign_flip_test(diffs, n_perm: int = 10000, seed: int = 0) -> float:
    """Two-sided paired sign-flip permutation p-value for mean(diffs) = 0 (NaN for no values)."""
    d = _finite(diffs)
    if d.size == 0:
        return float("nan")
    return float(_sign_flip_rows(d[None, :], n_perm, seed)[0])


def _groups(df: pd.DataFrame, by: Sequence[str]) -> tuple[pd.DataFrame, np.ndarray]:
    """(one row per group with the ``by`` columns, group code of each row of df)."""
    if not by:
        return pd.DataFrame(index=[0]), np.zeros(len(df), dtype=np.int64)
    grouped = df.groupby(list(by), sort=True, dropna=False)
    keys = grouped.size().reset_index()[list(by)]
    return keys, grouped.ngroup().to_numpy()


def _by_size(codes: np.ndarray, values: np.ndarray, n_groups: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(group ids [G_n], values [G_n, n]) for every group size n present."""
    order = np.argsort(codes, kind="stable")
    sorted_values = values[order]
    sizes = np.bincount(codes, minlength=n_groups)
    starts = np.cumsum(sizes) - sizes
    for n in np.unique(sizes[sizes > 0]):
        ids = np.nonzero(sizes == n)[0]
        yield ids, sorted_values[starts[ids][:, None] + np.arange(n)]


def summarize(
    df: pd.DataFrame,
    by: Sequence[str] | str,
    value: str = "value",
    n_boot: int = 2000,
    ci: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per ``by`` group: mean, ci_lo, ci_hi (percentile bootstrap over the rows), n."""
    by = [by] if isinstance(by, str) else list(by)
    d = df[np.isfinite(df[value].to_numpy(dtype=np.float64))]
    out, codes = _groups(d, by)
    g = len(out) if len(d) else 0
    out = out.iloc[:g].reset_index(drop=True)
    mean, lo, hi, n = (np.full(g, np.nan) for _ in range(4))
    vals = d[value].to_numpy(dtype=np.float64)
    for ids, mat in _by_size(codes, vals, g):
        mean[ids], lo[ids], hi[ids] = _bootstrap_rows(mat, n_boot, ci, seed)
        n[ids] = mat.shape[1]
    out["mean"], out["ci_lo"], out["ci_hi"], out["n"] = mean, lo, hi, n.astype(np.int64)
    return out


def paired_differences(
    df_a: pd.DataFrame,
    df_b: pd.DataFrame,
    on: Sequence[str] | None = None,
    value: str = "value",
) -> pd.DataFrame:
    """Inner join of two frames on ``on`` (default: example, site, head, metric, roles present):
    columns on + value_a, value_b, diff = value_a - value_b. Rows only in one frame are dropped."""
    if on is None:
        on = [c for c in ROW_KEYS if c in df_a.columns and c in df_b.columns]
    on = list(on)
    a = df_a[on + [value]].rename(columns={value: "value_a"})
    b = df_b[on + [value]].rename(columns={value: "value_b"})
    for name, side in (("df_a", a), ("df_b", b)):
        if side.duplicated(on).any():
            raise ValueError(f"{name} has several rows per {on}; add the distinguishing columns to 'on'")
    out = a.merge(b, on=on, how="inner")
    out["diff"] = out["value_a"] - out["value_b"]
    return out


def paired_summary(
    diffs: pd.DataFrame,
    by: Sequence[str] | str,
    diff: str = "diff",
    n_boot: int = 2000,
    n_perm: int = 10000,
    ci: float = 0.95,
    seed: int = 0,
    tolerance: float | str | None = None,
) -> pd.DataFrame:
    """Per ``by`` group of paired rows: n, mean_a, mean_b (when present), diff (mean), ci_lo, ci_hi
    (bootstrap CI of the mean difference), p_value (two-sided sign-flip test), max_abs_diff (largest |diff|).

    ``tolerance`` (a number, or the name of a column of per-row tolerances; :mod:`anchorlens.analyses.tolerance`)
    adds ``tolerance`` and ``within_tolerance``: every |diff| of the group within it, the difference is rounding,
    and its p_value is NaN (no test: :func:`benjamini_hochberg` leaves it out of the family).
    """
    by = [by] if isinstance(by, str) else list(by)
    d = diffs[np.isfinite(diffs[diff].to_numpy(dtype=np.float64))]
    out, codes = _groups(d, by)
    g = len(out) if len(d) else 0
    out = out.iloc[:g].reset_index(drop=True)
    mean, lo, hi, p, n = (np.full(g, np.nan) for _ in range(5))
    vals = d[diff].to_numpy(dtype=np.float64)
    for ids, mat in _by_size(codes, vals, g):
        mean[ids], lo[ids], hi[ids] = _bootstrap_rows(mat, n_boot, ci, seed)
        p[ids] = _sign_flip_rows(mat, n_perm, seed)
        n[ids] = mat.shape[1]
    out["n"] = n.astype(np.int64)
    for side in ("value_a", "value_b"):
        if side in d.columns and g:
            out["mean_" + side[-1]] = np.bincount(codes, weights=d[side].to_numpy(np.float64), minlength=g) / n
    out["diff"], out["ci_lo"], out["ci_hi"], out["p_value"] = mean, lo, hi, p
    out["max_abs_diff"] = _group_max(codes, np.abs(vals), g)
    if tolerance is not None:
        tol = (
            _group_max(codes, d[tolerance].to_numpy(np.float64), g)
            if isinstance(tolerance, str)
            else np.full(g, float(tolerance))
        )
        within = not_a_finding(out["max_abs_diff"].to_numpy(np.float64), mean, tol)
        out["tolerance"], out["within_tolerance"] = tol, within
        out.loc[within, "p_value"] = np.nan
    return out


def _group_max(codes: np.ndarray, values: np.ndarray, n_groups: int) -> np.ndarray:
    """Largest value [n_groups] of each group code's rows (NaN for a group without rows)."""
    out = np.full(n_groups, -np.inf)
    np.maximum.at(out, codes, values)
    out[np.isneginf(out)] = np.nan
    return out


def not_a_finding(max_abs_diff, diff, tolerance) -> np.ndarray:
    """Whether each paired difference [G] reads as zero: every per-example |Δ| is rounding (:func:`rounding_only`),
    or the mean difference itself is smaller than the measurement resolves (|Δ| ≤ ``tolerance``: a shift that
    small is no finding at this dtype's precision, however consistent its sign). False where nothing was paired."""
    d = np.abs(np.asarray(diff, dtype=np.float64))
    with np.errstate(invalid="ignore"):
        below = np.isfinite(d) & (d <= np.asarray(tolerance, dtype=np.float64))
    return rounding_only(max_abs_diff, tolerance) | below


def rounding_only(max_abs_diff, tolerance) -> np.ndarray:
    """Whether each difference is rounding: its largest per-example |Δ| [G] is within ``tolerance`` (scalar or [G]);
    False where nothing was paired (NaN)."""
    m = np.asarray(max_abs_diff, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.isfinite(m) & (m <= np.asarray(tolerance, dtype=np.float64))


def _z(ci: float) -> float:
    """The two-sided standard normal quantile of a ``ci`` interval (1.959964 for 0.95)."""
    return NormalDist().inv_cdf(0.5 + ci / 2.0)


def wilson_interval(successes: int, n: int, ci: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``successes`` / ``n``: (lo, hi), NaNs for n = 0.

    Honest at small n and at 0 or n successes (8 of 8 right: [0.676, 1]), where a bootstrap of 0/1 outcomes
    collapses to a point. lo, hi = (p + z²/2n ∓ z sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n).
    """
    if n <= 0:
        return float("nan"), float("nan")
    z, p = _z(ci), successes / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    scale = 1 + z * z / n
    lo = 0.0 if successes <= 0 else max(0.0, (centre - half) / scale)
    hi = 1.0 if successes >= n else min(1.0, (centre + half) / scale)
    return lo, hi


def paired_counts(correct_a, correct_b) -> tuple[int, int, int, int]:
    """(both right, only a right, only b right, both wrong) of paired 0/1 outcomes [n]; NaN pairs dropped."""
    a = np.asarray(correct_a, dtype=np.float64).ravel()
    b = np.asarray(correct_b, dtype=np.float64).ravel()
    ok = np.isfinite(a) & np.isfinite(b)
    ra, rb = a[ok] > 0.5, b[ok] > 0.5
    return int((ra & rb).sum()), int((ra & ~rb).sum()), int((~ra & rb).sum()), int((~ra & ~rb).sum())


def newcombe_paired_interval(correct_a, correct_b, ci: float = 0.95) -> tuple[float, float]:
    """Newcombe's score interval (1998, method 10) of the paired difference of proportions mean(a) - mean(b) over
    paired 0/1 outcomes [n] (NaN pairs dropped): (lo, hi), NaNs for no pair.

    Built from the two Wilson intervals and the phi correlation of the pairs (with Newcombe's continuity correction
    of phi's numerator AD - BC: less n/2 above n/2, 0 between 0 and n/2; Fagerland, Lydersen & Laake 2014), it has
    width even when no example changed (4 of 8 right on both sides: [-0.202, +0.202]; 8 of 8: [-0.324, +0.324]):
    at small n "no example changed" is not certainty.
    """
    both, only_a, only_b, neither = paired_counts(correct_a, correct_b)
    n = both + only_a + only_b + neither
    if n == 0:
        return float("nan"), float("nan")
    p1, p2 = (both + only_a) / n, (both + only_b) / n
    l1, u1 = wilson_interval(both + only_a, n, ci)
    l2, u2 = wilson_interval(both + only_b, n, ci)
    margins = (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    cross: float = both * neither - only_a * only_b
    cross = cross - n / 2 if cross > n / 2 else min(cross, 0)  # Newcombe's correction of phi (else, with no example
    # changed and p = 1/2, phi = 1 and the interval collapses to a point)
    phi = cross / math.sqrt(margins) if margins > 0 else 0.0
    lower = (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2
    upper = (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2
    theta = p1 - p2
    return max(-1.0, theta - math.sqrt(max(lower, 0.0))), min(1.0, theta + math.sqrt(max(upper, 0.0)))


def paired_array_stats(diff: np.ndarray, n_boot: int, n_perm: int, ci: float, seed: int) -> tuple[np.ndarray, ...]:
    """(n, mean, lo, hi, p) per row of diff [c, E] over its finite entries (example order kept): the
    bootstrap CI and sign-flip p-value of the mean; rows with equal counts share one resample matrix."""
    ok = np.isfinite(diff)
    n = ok.sum(1)
    mean, lo, hi, p = (np.full(len(diff), np.nan) for _ in range(4))
    for k in np.unique(n[n > 0]):
        rows = np.nonzero(n == k)[0]
        sub = diff[rows]
        if k < diff.shape[1]:  # compact the finite entries, keeping example order
            order = np.argsort(~np.isfinite(sub), axis=1, kind="stable")[:, :k]
            sub = np.take_along_axis(sub, order, axis=1)
        mean[rows], lo[rows], hi[rows] = _bootstrap_rows(sub, n_boot, ci, seed)
        p[rows] = _sign_flip_rows(sub, n_perm, seed)
    return n, mean, lo, hi, p


def benjamini_hochberg(pvalues, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """(rejected [m] bool, adjusted [m] float): BH step-up FDR control; NaN p-values are skipped
    (adjusted NaN, not rejected) and do not count in m."""
    # scipy.stats.false_discovery_control / statsmodels' multipletests(method="fdr_bh") compute the
    # same adjusted p-values, but neither is a dependency of anchorlens (and both refuse NaNs), so
    # the few lines of the step-up stay here; tests check them against hand-computed values.
    p = np.asarray(pvalues, dtype=np.float64).ravel()
    adjusted = np.full(p.shape, np.nan)
    ok = np.nonzero(np.isfinite(p))[0]
    m = ok.size
    if m:
        order = np.argsort(p[ok], kind="stable")
        ranked = p[ok][order] * m / np.arange(1, m + 1)
        stepped = np.minimum.accumulate(ranked[::-1])[::-1].clip(max=1.0)
        adjusted[ok[order]] = stepped
    rejected = np.zeros(p.shape, dtype=bool)
    rejected[ok] = adjusted[ok] <= alpha
    return rejected, adjusted


def mcnemar_test(correct_a, correct_b) -> float:
    """Two-sided exact McNemar p-value for paired binary outcomes [n] (NaN pairs dropped): a binomial test of the
    discordant pairs (a right, b wrong vs a wrong, b right) at 1/2; 1.0 when no pair is discordant."""
    a = np.asarray(correct_a, dtype=np.float64).ravel()
    b = np.asarray(correct_b, dtype=np.float64).ravel()
    ok = np.isfinite(a) & np.isfinite(b)
    right_a, right_b = a[ok] > 0.5, b[ok] > 0.5
    only_a, only_b = int((right_a & ~right_b).sum()), int((~right_a & right_b).sum())
    n = only_a + only_b
    if n == 0:
        return 1.0
    k = min(only_a, only_b)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return float(min(1.0, 2.0 * tail))
