"""Paired comparison of checkpoints measured on the same examples."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from anchorlens.analyses.frames import ALL, ROW_KEYS
from anchorlens.analyses.stats import benjamini_hochberg, paired_differences, paired_summary, summarize

HEADLINE_METRICS: tuple[str, ...] = ("anchor_mass", "structural_attention", "island_score", "entropy")
_STAT_COLUMNS = ["n", "mean_baseline", "mean_checkpoint", "diff", "ci_lo", "ci_hi", "p_value", "q_value", "significant"]
_HEADLINE_COLUMNS = ["metric", "stack", "checkpoint", "query_role", "key_role", "n", "mean", "ci_lo", "ci_hi",
                     "diff", "diff_lo", "diff_hi", "p_value", "q_value"]


def _add_q_values(df: pd.DataFrame, alpha: float, family: Sequence[str]) -> pd.DataFrame:
    """Add ``q_value`` (BH-adjusted p) and ``significant`` (q <= alpha), BH run per ``family`` group."""
    df = df.copy()
    df["q_value"], df["significant"] = np.nan, False
    groups = df.groupby(list(family), sort=False, dropna=False).indices.values() if family else [np.arange(len(df))]
    for idx in groups:
        rejected, adjusted = benjamini_hochberg(df["p_value"].to_numpy()[idx], alpha)
        df.iloc[idx, df.columns.get_loc("q_value")] = adjusted
        df.iloc[idx, df.columns.get_loc("significant")] = rejected
    return df


def compare_frames(
    frames: Mapping[str, pd.DataFrame],
    baseline: str,
    *,
    on: Sequence[str] | None = None,
    n_boot: int = 2000,
    n_perm: int = 10000,
    ci: float = 0.95,
    alpha: float = 0.05,
    seed: int = 0,
    family: Sequence[str] = (),
) -> pd.DataFrame:
    """Per checkpoint and (metric, stack, layer, head, query_role, key_role) cell: paired difference
    checkpoint - baseline over the examples both frames hold.

    Columns: checkpoint, baseline, the cell keys, n, mean_baseline, mean_checkpoint, diff (mean paired
    difference), ci_lo/ci_hi (bootstrap CI), p_value (sign-flip test), q_value (Benjamini-Hochberg
    over all rows, or within each ``family`` group, e.g. ``["checkpoint"]``), significant.
    Rows pair on ``on`` (default: every tidy key column present), so cells whose roles differ
    between checkpoints (anchor_mass of capsule vs soft_prompt) do not pair.
    """
    if baseline not in frames:
        raise KeyError(f"baseline {baseline!r} not among {list(frames)}")
    base = frames[baseline]
    if on is None:
        on = [c for c in ROW_KEYS if c in base.columns]
    first = ("metric", "stack", "layer", "head", "query_role", "key_role")
    cell = [c for c in first if c in on] + [c for c in on if c not in first and c != "example"]
    parts = []
    for name, df in frames.items():
        if name == baseline:
            continue
        diffs = paired_differences(df, base, on=on)
        s = paired_summary(diffs, cell, n_boot=n_boot, n_perm=n_perm, ci=ci, seed=seed)
        s = s.rename(columns={"mean_a": "mean_checkpoint", "mean_b": "mean_baseline"})
        s.insert(0, "checkpoint", name)
        s.insert(1, "baseline", baseline)
        parts.append(s)
    columns = ["checkpoint", "baseline", *cell, *_STAT_COLUMNS]
    if not parts or all(p.empty for p in parts):
        return pd.DataFrame(columns=columns)
    out = pd.concat([p for p in parts if not p.empty], ignore_index=True)
    out = _add_q_values(out, alpha, family)
    return out[columns]


def headline_rows(df: pd.DataFrame, metric: str, roles: tuple[str | None, str | None] | None = None) -> pd.DataFrame:
    """Rows of ``metric`` used for a headline number: per-head rows (head >= 0, else the head -1
    rows) of one (query_role, key_role) pair, from ``roles`` or else the only pair, or else the
    ``"all"`` query role's only pair; ValueError when still ambiguous."""
    sub = df[df["metric"] == metric]
    if sub.empty:
        return sub
    sub = sub[sub["head"] >= 0] if (sub["head"] >= 0).any() else sub
    if roles is not None:
        q, k = roles
        if q is not None:
            sub = sub[sub["query_role"] == q]
        if k is not None:
            sub = sub[sub["key_role"] == k]
    pairs = sub[["query_role", "key_role"]].drop_duplicates()
    if len(pairs) > 1:
        pairs = pairs[pairs["query_role"] == ALL]
        if len(pairs) != 1:
            found = sorted(map(tuple, sub[["query_role", "key_role"]].drop_duplicates().to_numpy()))
            raise ValueError(f"metric {metric!r} has several role pairs {found}; pass roles={{{metric!r}: (q, k)}}")
        sub = sub[(sub["query_role"] == ALL) & (sub["key_role"] == pairs["key_role"].iloc[0])]
    return sub


def _per_example(frames: Mapping[str, pd.DataFrame], metrics: Sequence[str],
                 roles: Mapping[str, tuple[str | None, str | None]]) -> pd.DataFrame:
    """Per checkpoint, metric, stack, example: mean value over layers and heads (+ roles used)."""
    parts = []
    for name, df in frames.items():
        for metric in metrics:
            sub = headline_rows(df, metric, roles.get(metric))
            if sub.empty:
                continue
            per = sub.groupby(["stack", "example"], sort=True)["value"].mean().reset_index()
            per["checkpoint"], per["metric"] = name, metric
            per["query_role"], per["key_role"] = sub["query_role"].iloc[0], sub["key_role"].iloc[0]
            parts.append(per)
    cols = ["checkpoint", "metric", "stack", "example", "value", "query_role", "key_role"]
    return pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)


def headline_table(
    frames: Mapping[str, pd.DataFrame],
    metrics: Sequence[str] = HEADLINE_METRICS,
    *,
    roles: Mapping[str, tuple[str | None, str | None]] | None = None,
    n_boot: int = 2000,
    n_perm: int = 10000,
    ci: float = 0.95,
    alpha: float = 0.05,
    seed: int = 0,
) -> pd.DataFrame:
    """Metric x checkpoint table: mean over examples (each example's value averaged over layers and
    heads, per stack) with bootstrap CI, and the paired difference vs the first checkpoint of
    ``frames`` (diff, diff_lo, diff_hi, sign-flip p_value, BH q_value over the table's diff rows).

    ``roles`` maps a metric to the (query_role, key_role) rows to use (see :func:`headline_rows`).
    """
    roles = dict(roles or {})
    per = _per_example(frames, metrics, roles)
    if per.empty:
        return pd.DataFrame(columns=_HEADLINE_COLUMNS)
    table = summarize(per, ["metric", "stack", "checkpoint"], n_boot=n_boot, ci=ci, seed=seed)
    used = per.drop_duplicates(["metric", "stack", "checkpoint"])[["metric", "stack", "checkpoint",
                                                                     "query_role", "key_role"]]
    table = table.merge(used, on=["metric", "stack", "checkpoint"], how="left")
    names = list(frames)
    first = per[per["checkpoint"] == names[0]]
    diffs = []
    for name in names[1:]:
        d = paired_differences(per[per["checkpoint"] == name], first, on=["metric", "stack", "example"])
        s = paired_summary(d, ["metric", "stack"], n_boot=n_boot, n_perm=n_perm, ci=ci, seed=seed)
        s["checkpoint"] = name
        diffs.append(s[["metric", "stack", "checkpoint", "diff", "ci_lo", "ci_hi", "p_value"]]
                     .rename(columns={"ci_lo": "diff_lo", "ci_hi": "diff_hi"}))
    diff_cols = ["metric", "stack", "checkpoint", "diff", "diff_lo", "diff_hi", "p_value"]
    diffs = pd.concat(diffs, ignore_index=True) if diffs else pd.DataFrame(columns=diff_cols)
    if not diffs.empty:
        diffs["q_value"] = benjamini_hochberg(diffs["p_value"].to_numpy(dtype=np.float64), alpha)[1]
    else:
        diffs["q_value"] = pd.Series(dtype=np.float64)
    table = table.merge(diffs, on=["metric", "stack", "checkpoint"], how="left")
    order = {m: i for i, m in enumerate(metrics)}
    rank = {c: i for i, c in enumerate(names)}
    table = table.assign(_m=table["metric"].map(order), _c=table["checkpoint"].map(rank))
    table = table.sort_values(["_m", "stack", "_c"]).drop(columns=["_m", "_c"]).reset_index(drop=True)
    return table[_HEADLINE_COLUMNS]
