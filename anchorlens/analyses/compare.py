"""Paired comparison of checkpoints measured on the same examples."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from anchorlens.analyses.frames import ROW_KEYS, per_head
from anchorlens.analyses.headline import HEADLINE, HeadlineMetric
from anchorlens.analyses.spill import CellSpill
from anchorlens.analyses.stats import (
    benjamini_hochberg,
    not_a_finding,
    paired_array_stats,
    paired_differences,
    paired_summary,
    rounding_only,
    summarize,
)
from anchorlens.analyses.tolerance import metric_tolerances
from anchorlens.heap import release_free_memory

_STAT_COLUMNS = [
    "n",
    "mean_baseline",
    "mean_checkpoint",
    "diff",
    "ci_lo",
    "ci_hi",
    "p_value",
    "q_value",
    "significant",
    "max_abs_diff",
    "tolerance",
    "within_tolerance",
]
# max_abs_diff: the largest per-example |Δ|; within_tolerance: it (or the mean |Δ| itself) is within the metric's
# rounding tolerance in the run's dtype (anchorlens.analyses.tolerance), so the difference reads 0: p_value and
# q_value NaN, not significant
# ci_lo/ci_hi: CI of the row's own mean; diff_lo/diff_hi: CI of its paired difference to the first checkpoint
_HEADLINE_COLUMNS = [
    "name",
    "label",
    "metric",
    "stack",
    "checkpoint",
    "query_role",
    "key_role",
    "n",
    "mean",
    "ci_lo",
    "ci_hi",
    "diff",
    "diff_lo",
    "diff_hi",
    "p_value",
    "q_value",
    "fixed",
    "max_abs_diff",
    "tolerance",
    "within_tolerance",
    "constant",
]
# fixed: the causal mask's reason when the mask fixes the metric; constant: every example has the same value (its
# range within the tolerance), so ci_lo/ci_hi have no width worth reading: the value is fixed, not estimated


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


def _factor(col: pd.Series) -> tuple[np.ndarray, pd.Index]:
    """(codes [rows] int64, uniques) of one key column; categorical columns use their codes as they are."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.cat.codes.to_numpy(np.int64), pd.Index(col.cat.categories)
    codes, uniques = pd.factorize(col, use_na_sentinel=False)  # a null (head <NA>) is a value of its own
    return np.asarray(codes, dtype=np.int64), pd.Index(uniques)


def _sorted(index: pd.Index) -> pd.Index:
    """``index`` sorted (nulls last) when its values compare, else as it is: ``union`` of two equal indexes keeps
    their order of appearance, so without this the order of cells and examples would depend on row order."""
    try:
        return index.sort_values(na_position="last")
    except TypeError:
        return index


def _joint_codes(a: pd.DataFrame, b: pd.DataFrame, columns: Sequence[str]):
    """Codes of rows of a and b over ``columns`` in one sorted key space: (code_a, code_b, uniques per column).

    A code is the mixed radix of the per-column positions in the sorted union of values, so codes
    order rows lexicographically by the columns.
    """
    code_a, code_b = np.zeros(len(a), dtype=np.int64), np.zeros(len(b), dtype=np.int64)
    uniques = []
    for c in columns:
        (ca, ua), (cb, ub) = _factor(a[c]), _factor(b[c])
        union = _sorted(ua.union(ub))
        code_a = code_a * len(union) + union.get_indexer(ua)[ca]
        code_b = code_b * len(union) + union.get_indexer(ub)[cb]
        uniques.append(union)
    return code_a, code_b, uniques


def _paired_arrays(a: pd.DataFrame, b: pd.DataFrame, cell: Sequence[str], value: str = "value"):
    """Cells and examples of two long frames as aligned arrays, built without a join or a sort.

    Returns (cell keys frame [C], blocks) where blocks yields (cell ids [c], A [c, E], B [c, E]):
    values per cell and example (NaN where absent), a bounded number of cells at a time. The two
    [C, E] float64 arrays are built once by scattering the rows (8 bytes per cell and example per
    side, far below the long frames themselves). ValueError when a frame holds several rows of one
    (cell, example).
    """
    raw_a, raw_b, uniques = _joint_codes(a, b, cell)
    ex_a, ex_b, (examples,) = _joint_codes(a, b, ["example"])
    space = int(np.prod([max(len(u), 1) for u in uniques]))
    if space <= 1 << 26:  # a lookup table over the key space: no sort
        present = np.zeros(space, dtype=bool)
        present[raw_a], present[raw_b] = True, True
        cell_codes = np.flatnonzero(present)
        lut = np.cumsum(present) - 1
        cell_a, cell_b = lut[raw_a], lut[raw_b]
    else:
        cell_codes = np.unique(np.concatenate([np.unique(raw_a), np.unique(raw_b)]))
        cell_a, cell_b = np.searchsorted(cell_codes, raw_a), np.searchsorted(cell_codes, raw_b)
    n_cells, n_ex = len(cell_codes), len(examples)
    decoded, rest = {}, cell_codes
    for c, u in zip(reversed(cell), reversed(uniques)):
        rest, pos = np.divmod(rest, len(u))
        decoded[c] = u.take(pos)
    keys = pd.DataFrame({c: np.asarray(decoded[c]) for c in cell})
    mats = []
    for name, df, cid, ex in (("df_a", a, cell_a, ex_a), ("df_b", b, cell_b, ex_b)):
        flat = cid.astype(np.int64) * n_ex + ex
        if len(flat) and np.bincount(flat, minlength=n_cells * n_ex).max() > 1:
            raise ValueError(
                f"{name} has several rows per {[*cell, 'example']}; add the distinguishing columns to 'on'"
            )
        m = np.full(n_cells * n_ex, np.nan)
        m[flat] = df[value].to_numpy(dtype=np.float64)
        mats.append(m.reshape(n_cells, n_ex))
    step = max(1, _CHUNK_CELLS // max(n_ex, 1))

    def blocks():
        for c0 in range(0, n_cells, step):
            c1 = min(n_cells, c0 + step)
            yield np.arange(c0, c1), mats[0][c0:c1], mats[1][c0:c1]

    return keys, blocks()


_CHUNK_CELLS = 1 << 23  # cell x example values per block of paired arrays (64 MiB per side)


def _block_stats(
    blocks: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]], n_boot: int, n_perm: int, ci: float, seed: int
) -> dict[str, np.ndarray] | None:
    """Paired statistics of blocks of (cell ids [c], checkpoint values [c, N], baseline values [c, N]), concatenated:
    id, n, mean_a, mean_b, diff, lo, hi, p per cell (None when no block came)."""
    keys = ("id", "n", "mean_a", "mean_b", "diff", "lo", "hi", "p", "max_abs")
    cols: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    for ids, a, b in blocks:
        diff = a - b
        n, mean, lo, hi, p = paired_array_stats(diff, n_boot, n_perm, ci, seed)
        ok = np.isfinite(diff)
        with np.errstate(invalid="ignore", divide="ignore"):  # sums over the paired values, without copies
            cols["mean_a"].append(a.sum(1, where=ok) / n)
            cols["mean_b"].append(b.sum(1, where=ok) / n)
        np.abs(diff, out=diff)
        cols["max_abs"].append(np.where(n > 0, diff.max(1, where=ok, initial=0.0), np.nan))
        del diff, ok
        for k, v in (("id", ids), ("n", n), ("diff", mean), ("lo", lo), ("hi", hi), ("p", p)):
            cols[k].append(v)
    return {k: np.concatenate(v) for k, v in cols.items()} if cols["id"] else None


def _spill_blocks(spill: CellSpill, name: str, baseline: str) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(cell ids, ``name``'s values, ``baseline``'s values) of each block of the spill, read one block at a time."""
    for block in range(spill.n_blocks):
        ids, a = spill.read(name, block)
        yield ids, a, spill.read(baseline, block)[1]
        del a
        release_free_memory()  # the block's matrices: pages back to the OS, not a heap that grows with the blocks


def _with_stats(
    cells: pd.DataFrame, name: str, baseline: str, got: dict[str, np.ndarray], keep: np.ndarray, dtype: object
) -> pd.DataFrame:
    """``cells`` (one row per kept cell) with the checkpoint, baseline and the paired statistics of ``got``; a cell
    whose every |Δ| is within its metric's tolerance in ``dtype`` is rounding: p_value NaN (out of BH)."""
    cells.insert(0, "checkpoint", name)
    cells.insert(1, "baseline", baseline)
    cells["n"] = got["n"][keep].astype(np.int64)
    cells["mean_baseline"], cells["mean_checkpoint"] = got["mean_b"][keep], got["mean_a"][keep]
    cells["diff"], cells["ci_lo"], cells["ci_hi"], cells["p_value"] = (
        got["diff"][keep],
        got["lo"][keep],
        got["hi"][keep],
        got["p"][keep],
    )
    cells["max_abs_diff"] = got["max_abs"][keep]
    cells["tolerance"] = metric_tolerances(cells["metric"].astype(str), dtype) if "metric" in cells else 0.0
    cells["within_tolerance"] = not_a_finding(cells["max_abs_diff"], cells["diff"], cells["tolerance"])
    cells.loc[cells["within_tolerance"].to_numpy(), "p_value"] = np.nan
    return cells


def _paired_table(parts: list[pd.DataFrame], cell: list[str], alpha: float, family: Sequence[str]) -> pd.DataFrame:
    """Every checkpoint's paired rows in one frame with Benjamini-Hochberg q per ``family``."""
    columns = ["checkpoint", "baseline", *cell, *_STAT_COLUMNS]
    if not parts or all(p.empty for p in parts):
        return pd.DataFrame(columns=columns)
    out = pd.concat([p for p in parts if not p.empty], ignore_index=True)
    out = _add_q_values(out, alpha, family)
    return out[columns]


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
    dtype: object | None = None,
) -> pd.DataFrame:
    """Per checkpoint and (metric, stack, layer, head, query_role, key_role) cell: paired difference
    checkpoint - baseline over the examples both frames hold (finite values on both sides).

    Columns: checkpoint, baseline, the cell keys, n, mean_baseline, mean_checkpoint, diff (mean paired
    difference), ci_lo/ci_hi (bootstrap CI of diff), p_value (sign-flip test), q_value
    (Benjamini-Hochberg over all rows, or within each ``family`` group, e.g. ``["checkpoint"]``),
    significant, max_abs_diff (largest per-example |Δ|), tolerance (the metric's rounding tolerance in the run's
    weights ``dtype``, default float32: :mod:`anchorlens.analyses.tolerance`) and within_tolerance (max_abs_diff
    within it: the difference is rounding, reported with p_value and q_value NaN and left out of BH). Rows pair on ``on`` (default: every tidy key column present), so cells whose roles
    differ between checkpoints (anchor_mass of capsule vs soft_prompt) do not pair.

    The long frames are turned into cell x example arrays (no join, no per-cell groupby) and the
    statistics run on blocks of cells, one resample matrix per sample size reused by every cell.
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
        keys, blocks = _paired_arrays(df, base, cell)
        got = _block_stats(blocks, n_boot, n_perm, ci, seed)
        if got is None:
            continue
        keep = got["n"] > 0
        s = keys.iloc[got["id"][keep]].reset_index(drop=True)
        parts.append(_with_stats(s, name, baseline, got, keep, dtype))
    return _paired_table(parts, cell, alpha, family)


def compare_spill(
    spill: CellSpill,
    baseline: str,
    *,
    n_boot: int = 2000,
    n_perm: int = 10000,
    ci: float = 0.95,
    alpha: float = 0.05,
    seed: int = 0,
    family: Sequence[str] = (),
    dtype: object | None = None,
) -> pd.DataFrame:
    """:func:`compare_frames` of the sides of ``spill`` (its cells: the key columns), read one block of cells at a
    time: the same rows, order and numbers as ``compare_frames`` of the frames the spill was fed, in memory bounded
    by the spill's block whatever the number of examples."""
    if baseline not in spill.sides:
        raise KeyError(f"baseline {baseline!r} not among {spill.sides}")
    cell = spill.cells.columns
    parts = []
    for name in spill.sides:
        if name == baseline:
            continue
        got = _block_stats(_spill_blocks(spill, name, baseline), n_boot, n_perm, ci, seed)
        if got is None:
            continue
        keep = np.flatnonzero(got["n"] > 0)
        keys = spill.cells.frame(got["id"][keep])
        order = np.argsort(_joint_codes(keys, keys, cell)[0], kind="stable")  # compare_frames' cell order
        keep = keep[order]
        s = keys.iloc[order].reset_index(drop=True)
        s = pd.DataFrame({c: np.asarray(pd.Index(s[c])) for c in cell})  # compare_frames' column types
        parts.append(_with_stats(s, name, baseline, got, keep, dtype))
    return _paired_table(parts, cell, alpha, family)


def paired_cell(columns: Sequence[str]) -> list[str]:
    """The cell columns :func:`compare_frames` pairs on for a frame with these columns (every tidy key but
    example, in its order)."""
    on = [c for c in ROW_KEYS if c in columns]
    first = ("metric", "stack", "layer", "head", "query_role", "key_role")
    return [c for c in first if c in on] + [c for c in on if c not in first and c != "example"]


def headline_rows(df: pd.DataFrame, metric: HeadlineMetric) -> pd.DataFrame:
    """Rows of one headline metric: per-head rows, else its rows averaged over heads (head <NA>)."""
    sub = metric.rows(df)
    heads = per_head(sub)
    return heads if len(heads) else sub


def _fixed_reason(rows: pd.DataFrame) -> str:
    """The mask reason when no row of ``rows`` was measured (all NaN and flagged), else ``""``."""
    if "fixed" not in rows.columns or rows.empty or np.isfinite(rows["value"].to_numpy(dtype=np.float64)).any():
        return ""
    reasons = rows["fixed"].astype(str)
    reasons = reasons[reasons != ""]
    return str(reasons.iloc[0]) if len(reasons) else ""


_MERGE_PARTS = 64  # HeadlineRows keeps its per-example values in at most this many frames


class HeadlineRows:
    """Per-example headline values gathered chunk by chunk (a few numbers per example and checkpoint) and the
    metrics the mask fixes: each example's value is its mean over layers and heads of the metric's finite rows."""

    def __init__(self, metrics: Sequence[HeadlineMetric]) -> None:
        self.metrics = list(metrics)
        self._parts: list[pd.DataFrame] = []
        self._reasons: dict[tuple[str, str], tuple[str, set[str]]] = {}
        self._measured: set[tuple[str, str]] = set()
        self._order: list[str] = []

    def add(self, checkpoint: str, df: pd.DataFrame) -> None:
        """Fold one checkpoint's rows of some examples (every row of each of those examples) in."""
        if checkpoint not in self._order:
            self._order.append(checkpoint)
        df = df[df["metric"].isin({m.metric for m in self.metrics})]  # one pass over the chunk, then small frames
        groups = df.groupby(["metric", "query_role", "key_role"], sort=False, observed=True).indices
        for metric in self.metrics:
            rows = groups.get((metric.metric, metric.query_role, metric.key_role))
            if rows is None:
                continue
            sub = df.iloc[np.sort(rows)]
            heads = per_head(sub)
            sub = heads if len(heads) else sub  # headline_rows: per-head rows, else the head means
            key = (metric.name, checkpoint)
            reason = _fixed_reason(sub)
            if reason:
                self._reasons.setdefault(key, (reason, set()))[1].update(map(str, sub["stack"]))
                continue
            self._measured.add(key)
            sub = sub[np.isfinite(sub["value"].to_numpy(dtype=np.float64))]
            per = sub.groupby(["stack", "example"], sort=True, observed=True)["value"].mean().reset_index()
            per["checkpoint"], per["name"] = checkpoint, metric.name
            self._parts.append(per)
        if len(self._parts) >= _MERGE_PARTS:  # a few numbers per example: one frame, not a thousand small ones
            self._parts = [pd.concat(self._parts, ignore_index=True)]

    def result(self) -> tuple[pd.DataFrame, dict]:
        """(per checkpoint, metric name, stack, example: the example's value, in that order; {(name, checkpoint):
        (mask reason, stacks)} of the metrics fixed in every example)."""
        cols = ["checkpoint", "name", "stack", "example", "value"]
        fixed = {k: (r, sorted(st)) for k, (r, st) in self._reasons.items() if k not in self._measured}
        if not self._parts:
            return pd.DataFrame(columns=cols), fixed
        per = pd.concat(self._parts, ignore_index=True)[cols]
        rank_c = {c: i for i, c in enumerate(self._order)}
        rank_m = {m.name: i for i, m in enumerate(self.metrics)}
        order = np.lexsort(
            (
                per["example"].to_numpy(),
                per["stack"].astype(str).to_numpy(),
                per["name"].map(rank_m).to_numpy(),
                per["checkpoint"].map(rank_c).to_numpy(),
            )
        )
        return per.iloc[order].reset_index(drop=True), fixed


def _per_example(frames: Mapping[str, pd.DataFrame], metrics: Sequence[HeadlineMetric]) -> tuple[pd.DataFrame, dict]:
    """(per checkpoint, metric name, stack, example: mean value over layers and heads of the finite
    rows; {(name, checkpoint): mask reason} of metrics fixed by the mask)."""
    rows = HeadlineRows(metrics)
    for ckpt, df in frames.items():
        rows.add(ckpt, df)
    return rows.result()


def headline_table(
    frames: Mapping[str, pd.DataFrame],
    metrics: Sequence[HeadlineMetric] = HEADLINE,
    *,
    n_boot: int = 2000,
    n_perm: int = 10000,
    ci: float = 0.95,
    alpha: float = 0.05,
    seed: int = 0,
    dtype: object | None = None,
) -> pd.DataFrame:
    """Headline metric x checkpoint table: mean over examples (each example's value averaged over
    layers and heads, per stack) with bootstrap CI (ci_lo, ci_hi), and the paired difference vs the
    first checkpoint of ``frames`` (diff with its CI diff_lo/diff_hi, sign-flip p_value, BH q_value
    over the table's diff rows).

    A metric whose rows the mask fixes in a checkpoint (every row NaN with a ``fixed`` reason) gets
    one row with NaN numbers and the reason in ``fixed``; measured rows have ``fixed == ""``.

    Rounding (:mod:`anchorlens.analyses.tolerance`, the weights' ``dtype``, default float32): a difference whose
    every per-example |Δ| (max_abs_diff) is within the metric's ``tolerance`` has ``within_tolerance`` True and no
    p_value or q_value (it is not in the BH family); a row whose values are the same in every example (their range
    within the tolerance) has ``constant`` True: its CI has no width, the value is fixed.
    """
    per, fixed = _per_example(frames, metrics)
    return headline_from_rows(
        per, fixed, list(frames), metrics, n_boot=n_boot, n_perm=n_perm, ci=ci, alpha=alpha, seed=seed, dtype=dtype
    )


def headline_from_rows(
    per: pd.DataFrame,
    fixed: dict,
    names: Sequence[str],
    metrics: Sequence[HeadlineMetric] = HEADLINE,
    *,
    n_boot: int = 2000,
    n_perm: int = 10000,
    ci: float = 0.95,
    alpha: float = 0.05,
    seed: int = 0,
    dtype: object | None = None,
) -> pd.DataFrame:
    """:func:`headline_table` from the per-example values of :meth:`HeadlineRows.result` (``names``: the
    checkpoints, the first the paired baseline)."""
    names = list(names)
    by_name = {m.name: m for m in metrics}
    per = per.assign(tolerance=metric_tolerances([by_name[n].metric for n in per["name"]], dtype))
    table = (
        summarize(per, ["name", "stack", "checkpoint"], n_boot=n_boot, ci=ci, seed=seed)
        if len(per)
        else pd.DataFrame(columns=["name", "stack", "checkpoint", "mean", "ci_lo", "ci_hi", "n"])
    )
    if len(per):
        table = table.merge(_constant(per), on=["name", "stack", "checkpoint"], how="left")
    table["fixed"] = ""
    flagged = [
        {"name": m, "stack": stack, "checkpoint": c, "fixed": reason}
        for (m, c), (reason, stacks) in fixed.items()
        for stack in stacks
    ]
    if flagged:
        table = pd.concat([table, pd.DataFrame(flagged)], ignore_index=True)
    if table.empty:
        return pd.DataFrame(columns=_HEADLINE_COLUMNS)
    first = per[per["checkpoint"] == names[0]]
    diffs = []
    for name in names[1:]:
        d = paired_differences(per[per["checkpoint"] == name], first, on=["name", "stack", "example"])
        d = d.merge(per[["name", "tolerance"]].drop_duplicates("name"), on="name", how="left")
        s = paired_summary(d, ["name", "stack"], n_boot=n_boot, n_perm=n_perm, ci=ci, seed=seed, tolerance="tolerance")
        s["checkpoint"] = name
        diffs.append(
            s[
                ["name", "stack", "checkpoint", "diff", "ci_lo", "ci_hi", "p_value", "max_abs_diff", "within_tolerance"]
            ].rename(columns={"ci_lo": "diff_lo", "ci_hi": "diff_hi"})
        )
    diff_cols = [
        "name",
        "stack",
        "checkpoint",
        "diff",
        "diff_lo",
        "diff_hi",
        "p_value",
        "max_abs_diff",
        "within_tolerance",
    ]
    diffs_df = pd.concat(diffs, ignore_index=True) if diffs else pd.DataFrame(columns=diff_cols)
    q: np.ndarray = (
        benjamini_hochberg(diffs_df["p_value"].to_numpy(dtype=np.float64), alpha)[1] if len(diffs_df) else np.empty(0)
    )
    diffs_df["q_value"] = pd.Series(q, index=diffs_df.index, dtype=np.float64)
    table = table.merge(diffs_df, on=["name", "stack", "checkpoint"], how="left")
    table["within_tolerance"] = table["within_tolerance"].astype("boolean").fillna(False).astype(bool)
    table["constant"] = table.get("constant", pd.Series(False, index=table.index)).astype("boolean")
    table["constant"] = table["constant"].fillna(False).astype(bool)
    for col in ("metric", "query_role", "key_role", "label"):
        table[col] = table["name"].map(lambda n, c=col: getattr(by_name[n], c))
    order = {m.name: i for i, m in enumerate(metrics)}
    rank = {c: i for i, c in enumerate(names)}
    table = table.assign(_m=table["name"].map(order), _c=table["checkpoint"].map(rank))
    table = table.sort_values(["_m", "stack", "_c"]).drop(columns=["_m", "_c"]).reset_index(drop=True)
    table["n"] = table["n"].fillna(0).astype(np.int64)
    table["tolerance"] = metric_tolerances(table["metric"].astype(str), dtype)
    return table[_HEADLINE_COLUMNS]


def _constant(per: pd.DataFrame) -> pd.DataFrame:
    """Per (name, stack, checkpoint): ``constant``, whether the values' range over the examples is within their
    ``tolerance`` (every example has the same value; a CI of no width)."""
    grouped = per.groupby(["name", "stack", "checkpoint"], sort=False, observed=True)
    spread = grouped["value"].max() - grouped["value"].min()
    tol = grouped["tolerance"].max()
    return pd.DataFrame(
        {"constant": rounding_only(spread.to_numpy(), tol.to_numpy())}, index=spread.index
    ).reset_index()
