"""Text renderings of the headline table: markdown for summary.md, plain text for the terminal."""

from __future__ import annotations

import pandas as pd

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


def _cell(row: pd.Series, baseline: bool) -> str:
    if str(row.get("fixed", "") or "") not in ("", "nan"):
        return FIXED_CELL
    text = f"{row['mean']:.3f} [{row['ci_lo']:.3f}, {row['ci_hi']:.3f}]"
    if not baseline and pd.notna(row.get("diff")):
        text += f"; Δ {row['diff']:+.3f} [{row['diff_lo']:+.3f}, {row['diff_hi']:+.3f}] q={row['q_value']:.3g}"
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
