"""The tidy metric frame: column names, builders and head averaging.

Every metric row is one (example, stack, layer, head, metric, query_role, key_role) cell:

========== ======= ==============================================================
column     dtype   meaning
========== ======= ==============================================================
example    int64   the example's dataset index
stack      str     attention stack (``"decoder"``, ``"encoder"``, ``"cross"``...)
layer      int64   model layer index
head       Int64   model head index; ``<NA>`` (null) for rows averaged over heads
metric     str     metric name (``"role_flow"``, ``"entropy"``...)
query_role str     role label of the queries, ``"all"`` or a pooled label
key_role   str     role label of the keys, or ``""`` when not applicable
value      float64 the metric value
count      float64 number of queries the value averages over (weights for pooling)
========== ======= ==============================================================
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from anchorlens.analyses.keys import first_rows, mixed_radix
from anchorlens.roles.kinds import INPUT_ROLES, Role
from anchorlens.roles.table import GUIDANCE_NAMES, is_field_group

COLUMNS: tuple[str, ...] = (
    "example",
    "stack",
    "layer",
    "head",
    "metric",
    "query_role",
    "key_role",
    "value",
    "count",
)
SITE_KEYS: tuple[str, ...] = ("example", "stack", "layer", "head")
ROW_KEYS: tuple[str, ...] = ("example", "stack", "layer", "head", "metric", "query_role", "key_role")
ALL = "all"
NO_ROLE = ""
INPUT = "input"  # label of the pooled input queries (every role but guidance: special, structural, content, ...)
GUIDANCE = "guidance"  # label of the pooled guidance roles
_DTYPES = {
    "example": "int64",
    "stack": "str",
    "layer": "int64",
    "head": "Int64",  # nullable: <NA> marks rows averaged over heads (never -1, which --heads reads as the last head)
    "metric": "str",
    "query_role": "str",
    "key_role": "str",
    "value": "float64",
    "count": "float64",
}
_RESOLVED = {c: pd.api.types.pandas_dtype(d) for c, d in _DTYPES.items()}


def arrow_schema(columns: Iterable[str]) -> Any:
    """The Arrow schema of a metric frame with these columns: the tidy columns' types fixed (so every shard of a
    run has one schema, empty or not), ``fixed`` and other extra columns as strings."""
    import pyarrow as pa

    types = {
        "example": pa.int64(),
        "stack": pa.string(),
        "layer": pa.int64(),
        "head": pa.int64(),
        "metric": pa.string(),
        "query_role": pa.string(),
        "key_role": pa.string(),
        "value": pa.float64(),
        "count": pa.float64(),
    }
    return pa.schema([pa.field(c, types.get(c, pa.string())) for c in columns])


def empty_frame() -> pd.DataFrame:
    """A frame with the tidy columns and dtypes and no rows."""
    return pd.DataFrame({c: pd.Series(dtype=_DTYPES[c]) for c in COLUMNS})


def conform(df: pd.DataFrame) -> pd.DataFrame:
    """Return ``df`` with the tidy columns first, in order and with their dtypes (extra columns kept; missing ``count`` is NaN)."""
    if df.empty:
        extra = [c for c in df.columns if c not in COLUMNS]
        out = empty_frame()
        for c in extra:
            out[c] = pd.Series(dtype=df[c].dtype)
        return out
    if "count" not in df.columns:
        df = df.assign(count=np.nan)
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"frame lacks tidy columns {missing}")
    extra = [c for c in df.columns if c not in COLUMNS]
    out = df[list(COLUMNS) + extra]
    if not _is_head_column(out["head"]):
        out = out.assign(head=head_column(out["head"]))
    casts = {c: _DTYPES[c] for c in COLUMNS if out[c].dtype != _RESOLVED[c]}
    if casts:  # only the columns whose dtype differs: casting a conformant column copies it for nothing
        out = out.astype(casts)
    index = out.index
    if isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1:
        return out
    return out.reset_index(drop=True)


def _is_head_column(head: pd.Series) -> bool:
    """Whether ``head`` is already what :func:`head_column` returns (nullable Int64, no negative index)."""
    if head.dtype != _RESOLVED["head"]:
        return False
    values = head.to_numpy(dtype=np.float64, na_value=np.nan)
    return not bool((values < 0).any())


def head_column(head: pd.Series) -> pd.Series:
    """``head`` as nullable Int64: per-head indices kept, head means as <NA>.

    Frames written before head means were null (``-1``) and CSV round trips (``""``) read the same way.
    """
    if not pd.api.types.is_numeric_dtype(head.dtype):
        head = head.astype(object).where(head.astype(str).str.strip() != "", None)
    out = pd.to_numeric(head, errors="raise").astype("Int64")
    return out.mask(out < 0)


def per_head(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of one model head each (``head`` not null)."""
    return df[df["head"].notna().to_numpy(dtype=bool)]


def head_means(df: pd.DataFrame) -> pd.DataFrame:
    """Rows averaged over heads (``head`` null)."""
    return df[df["head"].isna().to_numpy(dtype=bool)]


def concat_frames(frames: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate tidy frames (empty input gives an empty tidy frame)."""
    frames = [f for f in frames if not f.empty]
    if not frames:
        return empty_frame()
    return conform(pd.concat(frames, ignore_index=True))


def _column_codes(col: pd.Series) -> tuple[np.ndarray, int]:
    """(codes [n], size): a column's values as integer codes, a categorical's own codes (NaN as 0)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.cat.codes.to_numpy(np.int64) + 1, len(col.cat.categories) + 1  # NaN (-1) -> 0
    codes, uniques = pd.factorize(col, use_na_sentinel=False)
    return np.asarray(codes, dtype=np.int64), len(uniques)


def average_heads(df: pd.DataFrame) -> pd.DataFrame:
    """Rows with ``head`` <NA>: unweighted mean of ``value`` (and of ``count``) over heads.

    Groups by every column except head/value/count; input rows already averaged (head <NA>) are ignored; NaN
    values are skipped (a group of NaNs gives NaN). Groups come from column codes hashed by ``factorize``
    and sums by ``bincount`` (no pandas groupby, no sort), so millions of rows take seconds.
    """
    df = per_head(df)
    if df.empty:
        return conform(df)
    keys = [c for c in df.columns if c not in ("head", "value", "count")]
    code = mixed_radix((_column_codes(df[c]) for c in keys), len(df))
    inverse, uniq = pd.factorize(code)  # hash-based grouping: no sort of the rows
    out = df.iloc[first_rows(inverse, len(uniq))][keys].reset_index(drop=True)
    n_groups = len(uniq)
    for col in ("value", "count"):
        if col not in df.columns:
            continue
        v = df[col].to_numpy(dtype=np.float64)
        ok = np.isfinite(v)
        total = np.bincount(inverse, weights=np.where(ok, v, 0.0), minlength=n_groups)
        n = np.bincount(inverse, weights=ok.astype(np.float64), minlength=n_groups)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[col] = np.where(n > 0, total / np.maximum(n, 1), np.nan)
    out["head"] = pd.array([None] * len(out), dtype="Int64")
    return conform(out) if "count" in out.columns else out


def role_label(role: str | int | Role) -> str:
    """Label of one role: a ``Role`` or built-in id by its name, a name (any role a task defines) normalized
    (``"Demo-Label"`` -> ``"demo_label"``); ``"all"`` passes through."""
    if isinstance(role, Role):
        return role.label
    if isinstance(role, int) and not isinstance(role, bool):
        if 0 <= role < len(Role):
            return Role(role).label
        raise ValueError(f"role id {role} is not a built-in role; name roles a task adds by their name")
    if not isinstance(role, str) or not role.strip():
        raise ValueError(f"a role is a name or a built-in Role, got {role!r}")
    return role.strip().lower().replace("-", "_")


POOLED_LABELS: frozenset[str] = frozenset({ALL, INPUT, GUIDANCE, NO_ROLE})
_BUILTIN_INPUTS: tuple[str, ...] = tuple(r.label for r in INPUT_ROLES)


def input_labels(df: pd.DataFrame) -> tuple[str, ...]:
    """The input (non-guidance) role labels among ``df``'s query roles, built-ins first, then in order of first
    appearance; the built-in input roles when ``df`` has none (the run's roles come from its frame)."""
    seen = [str(r) for r in df["query_role"].unique()] if "query_role" in df.columns and len(df) else []
    return input_labels_among(seen)


def input_labels_among(seen: Iterable[str]) -> tuple[str, ...]:
    """The input role labels among query role labels ``seen`` (in order of first appearance), built-ins first;
    the built-in input roles when there are none. Field groups (``content:<field>``) are parts of ``content``, not
    roles: never among them (pooling them too would count content twice)."""
    found = [
        r for r in seen if r not in POOLED_LABELS and r not in GUIDANCE_NAMES and "+" not in r and not is_field_group(r)
    ]
    if not found:
        return _BUILTIN_INPUTS
    builtins = [r for r in _BUILTIN_INPUTS if r in found]
    return tuple(builtins + [r for r in found if r not in builtins])


def roles_label(roles: Iterable[str | int | Role], inputs: Sequence[str] = _BUILTIN_INPUTS) -> str:
    """Label of a pooled role set: ``"input"`` (the set is ``inputs``, the run's input roles), ``"guidance"``, one
    role's label, or labels joined by ``+``."""
    labels = [role_label(r) for r in roles]
    names = set(labels)
    if names == set(inputs):
        return INPUT
    if names == set(GUIDANCE_NAMES):
        return GUIDANCE
    return "+".join(labels)
