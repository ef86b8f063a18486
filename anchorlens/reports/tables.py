"""Text renderings of the headline table: markdown for summary.md, plain text for the terminal."""

from __future__ import annotations

import pandas as pd

from anchorlens.analyses.tolerance import dtype_name, tolerance

FIXED_CELL = "n/a (fixed by the causal mask)"
ABSENT_CELL = "n/a (no such tokens)"
GUIDANCE_KEY = "guidance"  # the pooled guidance key of the decomposition


def present_roles(metrics: pd.DataFrame) -> dict[str, set[str]]:
    """Checkpoint -> the roles its inputs have (every position is a query: the role-flow query roles)."""
    flow = metrics[(metrics["metric"] == "role_flow") & (metrics["query_role"] != "all")]
    return {str(k): set(v.astype(str)) for k, v in flow.groupby("checkpoint")["query_role"]}


def _absent(row: pd.Series, present: set[str] | None, guidance: tuple[str, ...]) -> bool:
    """Whether a decomposition part reads a role the checkpoint has not got (its 0.000 measures nothing)."""
    if present is None or row.get("metric") != "decomposition":
        return False
    key = str(row.get("key_role", ""))
    if key == GUIDANCE_KEY:
        return not any(g in present for g in guidance)
    return key not in ("sink", "") and key not in present


SAME_CELL = "fixed: same in every example"  # a value with no spread over the examples: no interval to read
SMALL_N = 30  # below this many examples an accuracy cell says its n is small


def _flag(row: pd.Series, column: str) -> bool:
    """A boolean column of a table row (a CSV read back gives True/False or "True"/"False"; absent: False)."""
    value = row.get(column)
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return False
    return str(value).strip().lower() in ("true", "1", "1.0")


def _mean_text(row: pd.Series) -> str:
    """``0.436 [0.431, 0.440]``; ``0.436 (fixed: same in every example)`` for a value with no spread; accuracy with
    its Wilson interval named."""
    if str(row.get("interval", "")) == "wilson":
        return f"{row['mean']:.3f} [{row['ci_lo']:.3f}, {row['ci_hi']:.3f}] Wilson"
    same = _flag(row, "constant") if "constant" in row else row["ci_lo"] == row["ci_hi"]
    if same:
        return f"{row['mean']:.3f} ({SAME_CELL})"
    return f"{row['mean']:.3f} [{row['ci_lo']:.3f}, {row['ci_hi']:.3f}]"


def _diff_text(row: pd.Series) -> str:
    """The paired Δ vs the first checkpoint: ``Δ 0 (within rounding ...)`` without q for rounding, the examples that
    changed for accuracy, ``(same in every example)`` for an interval of no width, else ``Δ ± [lo, hi] q=`` (in
    scientific notation below 5e-4, which 3 decimals would print as a zero)."""
    q = row.get("q_value")
    q_text = f" q={q:.3g}" if pd.notna(q) else ""
    if str(row.get("diff_interval", "")) == "newcombe":
        changed, n = row.get("changed"), int(row["n"])
        who = f"{int(changed)} of {n} examples changed" if pd.notna(changed) else f"n = {n}"
        small = f", n = {n} is small" if n < SMALL_N else ""
        interval = f"[{row['diff_lo']:+.3f}, {row['diff_hi']:+.3f}] Newcombe"
        if _flag(row, "within_tolerance"):
            return f"Δ 0 ({who}{small}; {interval})"
        return f"Δ {row['diff']:+.3f} {interval} ({who}{small}){q_text}"
    if _flag(row, "within_tolerance"):
        if row["max_abs_diff"] <= row["tolerance"]:
            return f"Δ 0 (within rounding: max |Δ| {row['max_abs_diff']:.0e} ≤ {row['tolerance']:.0e}, no test)"
        return f"Δ 0 (|Δ| {abs(row['diff']):.0e} below the tolerance {row['tolerance']:.0e}, no test)"
    # a tested difference that 3 decimals would print as ±0.000 keeps its digits (a real change of 8e-06, not a zero)
    fmt = "+.1e" if abs(row["diff"]) < 5e-4 else "+.3f"
    if row["diff_lo"] == row["diff_hi"]:
        return f"Δ {row['diff']:{fmt}} (same in every example){q_text}"
    return f"Δ {row['diff']:{fmt}} [{row['diff_lo']:{fmt}}, {row['diff_hi']:{fmt}}]{q_text}"


def fixed_cell(reason: str) -> str:
    """The n/a text of a cell with a ``fixed`` reason: the mask's, or ``n/a (empty: ...)`` for a query that sees no
    key after an edit."""
    return f"n/a ({reason.split(';')[0]})" if reason.startswith("empty") else FIXED_CELL


def _cell(row: pd.Series, baseline: bool) -> str:
    reason = str(row.get("fixed", "") or "")
    if reason not in ("", "nan"):
        return fixed_cell(reason)
    text = _mean_text(row)
    if not baseline and pd.notna(row.get("diff")):
        text += "; " + _diff_text(row)
    return text


def headline_grid(
    headline: pd.DataFrame,
    checkpoints: list[str],
    present: dict[str, set[str]] | None = None,
    guidance: tuple[str, ...] = ("soft_prompt", "instance", "capsule"),
) -> pd.DataFrame:
    """Metric x checkpoint grid of formatted cells (mean [95% CI]; paired Δ vs the first checkpoint).

    Rows are the headline metrics' labels; a value the mask fixes reads ``n/a (fixed by the causal
    mask)`` (the reasons: :func:`fixed_notes`); a metric a checkpoint lacks reads ``n/a``. With
    ``present`` (checkpoint -> its roles, :func:`present_roles`), attention to a role a checkpoint
    has not got (the base's guidance, special tokens of a template without them) reads ``n/a (no
    such tokens)``, not 0.000.
    """
    rows: dict[str, dict[str, str]] = {}
    for _, row in headline.iterrows():
        if present is not None and _absent(row, present.get(str(row["checkpoint"])), guidance):
            label = f"{row['label']} ({row['stack']})" if "label" in row else str(row["metric"])
            rows.setdefault(label, {})[row["checkpoint"]] = ABSENT_CELL
            continue
        label = (
            f"{row['label']} ({row['stack']})"
            if "label" in row
            else f"{row['metric']} ({row['stack']}: {row['query_role'] or '-'}→{row['key_role'] or '-'})"
        )
        rows.setdefault(label, {})[row["checkpoint"]] = _cell(row, row["checkpoint"] == checkpoints[0])
    grid = pd.DataFrame.from_dict(rows, orient="index").reindex(columns=checkpoints)
    return grid.fillna("n/a")


def fixed_notes(headline: pd.DataFrame) -> list[str]:
    """One line per headline value the mask fixes: which metric, which checkpoint, and why."""
    if "fixed" not in headline.columns:
        return []
    rows = headline[headline["fixed"].fillna("").astype(str) != ""]
    return [f"{r['label']} of {r['checkpoint']}: n/a, {r['fixed']} (not a finding)" for _, r in rows.iterrows()]


def rounding_note(dtype: object | None = None) -> str:
    """What ``Δ 0 (within rounding)``, ``fixed: same in every example`` and the accuracy intervals mean, with the
    tolerances of the run's weights ``dtype`` (default float32), for summary.md and report.html."""
    name = dtype_name(dtype)
    return (
        f"Δ 0 (within rounding): every example's |Δ| is within the {name} rounding tolerance of the measurement "
        f"(attention and entropy {tolerance('attention', name):.0e}, NLL {tolerance('nll', name):.0e}, "
        f"KL {tolerance('kl', name):.0e}; anchorlens.analyses.tolerance); Δ 0 (|Δ| below the tolerance): the mean "
        "difference itself is smaller than the measurement resolves. Neither is tested or in the "
        "Benjamini-Hochberg family (within_tolerance in the CSVs). Fixed: same in every example: the value does not "
        "vary over the examples, so it has no interval. Accuracy: Wilson score interval of the mean and Newcombe's "
        f"score interval of the paired Δ with the examples that changed, honest at small n (n < {SMALL_N} is "
        "flagged), never a bootstrap of 0/1 outcomes."
    )


def to_markdown(grid: pd.DataFrame, index_name: str = "metric") -> str:
    """GitHub markdown table of a small string frame."""
    header = [index_name, *map(str, grid.columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for idx, row in grid.iterrows():
        lines.append("| " + " | ".join([str(idx), *map(str, row.tolist())]) + " |")
    return "\n".join(lines)


def to_text(grid: pd.DataFrame) -> str:
    """Plain fixed-width rendering for the terminal: one block per metric."""
    out = []
    width = max(len(str(c)) for c in grid.columns)
    for idx, row in grid.iterrows():
        out.append(str(idx))
        for ckpt, cell in row.items():
            out.append(f"  {str(ckpt):<{width}}  {cell}")
    return "\n".join(out)
