"""Filtering and summarising tidy metric frames before plotting (raw ``value`` rows or summaries)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

# Two-sided 95% Student-t quantiles by degrees of freedom (no scipy dependency).
_T975 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
    10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
    18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980,
}


def t975(dof: int) -> float:
    """Approximate two-sided 95% t quantile (table, conservative between entries)."""
    if dof <= 0:
        return float("nan")
    if dof > 120:
        return 1.96
    return _T975[max(k for k in _T975 if k <= dof)]


def is_summary(df: pd.DataFrame) -> bool:
    """True for a summary frame (``mean`` column), False for raw tidy rows (``value``)."""
    if "mean" in df.columns:
        return True
    if "value" in df.columns:
        return False
    raise ValueError(f"expected a 'value' (raw) or 'mean' (summary) column; got {list(df.columns)}")


def filter_eq(df: pd.DataFrame, column: str, wanted: object, what: str | None = None) -> pd.DataFrame:
    """Rows where ``column == wanted`` (or in a list); ValueError listing the available values."""
    if wanted is None or column not in df.columns:
        return df
    wanted_list = list(wanted) if isinstance(wanted, (list, tuple, set)) else [wanted]
    out = df[df[column].isin(wanted_list)]
    if out.empty:
        have = sorted(map(str, df[column].dropna().unique()))
        raise ValueError(f"no rows with {what or column} in {wanted_list}; available: {', '.join(have)}")
    return out


def pick_head(df: pd.DataFrame, head: int | None) -> pd.DataFrame:
    """Keep head ``head`` (default -1 = mean over heads) when present; error if heads stay mixed."""
    if head is None or "head" not in df.columns:
        return df
    if (df["head"] == head).any():
        return df[df["head"] == head]
    if df["head"].nunique() <= 1:
        return df
    raise ValueError(
        f"no rows with head == {head} and several heads present; pass head=<index> "
        f"(available: {sorted(df['head'].unique().tolist())})"
    )


def require_single(df: pd.DataFrame, columns: Sequence[str], context: str) -> None:
    """Raise when one of ``columns`` still holds several values (the user must choose one)."""
    for col in columns:
        if col in df.columns:
            vals = df[col].dropna().unique()
            if len(vals) > 1:
                shown = ", ".join(sorted(map(str, vals))[:8])
                raise ValueError(f"{context}: several {col} values ({shown}); pass {col}=... to choose one")


def summarize(df: pd.DataFrame, by: Sequence[str], per_example: Sequence[str] = ("example",)) -> pd.DataFrame:
    """Mean and 95% t-interval over examples of raw ``value`` rows, grouped by ``by``.

    Rows of one example inside a group (e.g. several layers) are averaged first, so every example
    counts once. Summary frames (``mean`` column) pass through unchanged.
    """
    if is_summary(df):
        return df
    by = list(by)
    ex = [c for c in per_example if c in df.columns and c not in by]
    per = df.groupby(by + ex, dropna=False, sort=False)["value"].mean().reset_index()
    g = per.groupby(by, dropna=False, sort=False)["value"]
    out = g.agg(["mean", "std", "count"]).reset_index().rename(columns={"count": "n"})
    half = np.array([t975(int(n) - 1) for n in out["n"]]) * out["std"].fillna(0.0).to_numpy() / np.sqrt(out["n"])
    out["ci_lo"] = out["mean"] - half
    out["ci_hi"] = out["mean"] + half
    return out.drop(columns="std")


def value_column(df: pd.DataFrame) -> str:
    """``mean`` for summaries, ``value`` for raw rows."""
    return "mean" if is_summary(df) else "value"
