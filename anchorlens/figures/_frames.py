"""Filtering and summarising tidy metric frames before plotting (raw ``value`` rows or summaries)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import pandas as pd

from anchorlens.analyses import stats
from anchorlens.analyses.frames import head_column


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


HeadChoice = int | Literal["mean"] | None


def pick_head(df: pd.DataFrame, head: HeadChoice) -> pd.DataFrame:
    """Keep one head: ``"mean"`` (rows averaged over heads, head <NA>), an index (negative: from the
    last head present, as ``--heads``), or None for every row; error if heads stay mixed."""
    if head is None or "head" not in df.columns:
        return df
    col = head_column(df["head"])
    present = sorted(int(h) for h in col.dropna().unique())
    if head == "mean":
        hit = col.isna()
    else:
        index = present[head] if head < 0 and -len(present) <= head else head
        hit = (col == index).fillna(False)
    if hit.any():
        return df[hit.to_numpy(dtype=bool)]
    if col.nunique(dropna=False) <= 1:
        return df
    raise ValueError(
        f"no rows with head {head!r} and several heads present; pass head='mean' or an index "
        f"(available: {', '.join(map(str, present))}{', mean' if col.isna().any() else ''})"
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
    """Mean and 95% percentile-bootstrap interval over examples of raw ``value`` rows, grouped by ``by``.

    Rows of one example inside a group (e.g. several layers) are averaged first, so every example
    counts once; the interval is the project's bootstrap (``anchorlens.analyses.stats.summarize``).
    Summary frames (``mean`` column) pass through unchanged. Group order is kept.
    """
    if is_summary(df):
        return df
    by = list(by)
    ex = [c for c in per_example if c in df.columns and c not in by]
    per = df.groupby(by + ex, dropna=False, sort=False)["value"].mean().reset_index()
    out = stats.summarize(per, by)
    order = per[by].drop_duplicates()
    return order.merge(out, on=by, how="left").reset_index(drop=True)


def value_column(df: pd.DataFrame) -> str:
    """``mean`` for summaries, ``value`` for raw rows."""
    return "mean" if is_summary(df) else "value"
