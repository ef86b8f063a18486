"""What an axis or colour bar shows, in words and unit: ``input → sink (attention mass)``, never ``decomposition``.

The text of a measure is the headline metric's label when the (metric, query role, key role) cell is a
headline number (:mod:`anchorlens.analyses.headline`), else it is built from the roles of the cell, so
a task's own roles (``demo → scaffold``) read the same way as the built-in ones.
"""

from __future__ import annotations

import pandas as pd

from anchorlens.analyses.headline import HEADLINE, anchor_metrics
from anchorlens.figures._roles import GUIDANCE_NAMES

MASS = "attention mass"
ENTROPY = "normalized entropy, 0–1"
# Unit of each metric's values (what a number on the axis means).
UNITS: dict[str, str] = {
    "decomposition": MASS,
    "role_flow": MASS,
    "anchor_mass": MASS,
    "first_token_mass": MASS,
    "structural_attention": MASS,
    "special_attention": MASS,
    "anchor_structural": MASS,
    "island_score": MASS,
    "entropy": ENTROPY,
    "anchor_content_entropy": ENTROPY,
    "guidance_absorption": "× its share of visible keys",
    "visible_keys": "keys",
    "visible_share": "share of visible keys",
}
_POOLED_QUERIES = ("", "all")
LABELS: dict[str, str] = {
    "k": "instance tokens (k)",
    "length": "soft-prompt length (tokens)",
    "accuracy": "accuracy",
    "first_token_mass": "attention to position 0",
    "anchor_mass": "input → anchor",
    "anchor_structural": "anchor → structural",
    "sink_mass": "input → sink",
    "num_trainable": "trainable parameters",
    "time_per_step_s": "time per step (s)",
    "best_eval_accuracy": "best eval accuracy",
}
COLUMN_UNITS: dict[str, str] = {"anchor_mass": MASS, "anchor_structural": MASS, "sink_mass": MASS}


def pretty(name: str) -> str:
    """Human text from a snake_case metric or column name (known names get their label)."""
    return LABELS.get(str(name), str(name).replace("_", " "))


def _headline_label(metric: str, query_role: str, key_role: str) -> str | None:
    """The headline metric's label for this cell, if it is one."""
    candidates = [*HEADLINE, *anchor_metrics(key_role), *anchor_metrics(query_role)]
    for m in candidates:
        if (m.metric, m.query_role, m.key_role) == (metric, query_role, key_role):
            return m.label
    return None


def _queries(query_role: str) -> str:
    return "all queries" if query_role in _POOLED_QUERIES else query_role


def measure_text(metric: str, query_role: str | None = None, key_role: str | None = None) -> str:
    """The measure in words, without its unit: ``input → structural (sink excluded)``, ``entropy of demo queries``."""
    q, k = str(query_role or ""), str(key_role or "")
    known = _headline_label(metric, q, k)
    if known is not None:
        return known
    if metric == "decomposition" and k:
        excluded = k not in ("sink", "guidance") and k not in GUIDANCE_NAMES
        return f"{_queries(q)} → {k}" + (" (sink excluded)" if excluded else "")
    if metric == "role_flow" and k:
        return f"{_queries(q)} → {k}"
    if metric == "anchor_mass":
        return f"{_queries(q)} → {k or 'anchor'}"
    if metric == "first_token_mass":
        return f"{_queries(q)} → position 0"
    if metric == "structural_attention" or metric == "anchor_structural":
        return f"{_queries(q)} → structural"
    if metric == "special_attention":
        return f"{_queries(q)} → special"
    if metric == "island_score":
        return f"island score ({q or 'guidance'} → {k or q or 'guidance'})"
    if metric == "entropy":
        return f"entropy of {_queries(q).removesuffix(' queries')} queries"
    if metric == "guidance_absorption":
        return f"absorption of {k or 'guidance'}"
    return pretty(metric) + (f" ({q} → {k})" if q and k else f" ({q})" if q else "")


def measure_label(metric: str, query_role: str | None = None, key_role: str | None = None) -> str:
    """The measure and its unit: ``input → sink (attention mass)``, ``entropy of input queries (normalized, 0–1)``."""
    text = measure_text(metric, query_role, key_role)
    unit = UNITS.get(metric) or COLUMN_UNITS.get(metric)
    return f"{text} ({unit})" if unit else text


def single(df: pd.DataFrame, column: str, given: str | None) -> str | None:
    """``given``, else the one value ``column`` holds in ``df`` (None when absent or several)."""
    if given is not None:
        return given
    if column not in df.columns:
        return None
    values = df[column].dropna().unique()
    return str(values[0]) if len(values) == 1 else None


def frame_measure_label(df: pd.DataFrame, metric: str, query_role: str | None, key_role: str | None) -> str:
    """:func:`measure_label` of the rows a figure draws (roles read from the rows when not given)."""
    return measure_label(metric, single(df, "query_role", query_role), single(df, "key_role", key_role))
