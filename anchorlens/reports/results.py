"""The parts of a comparison report that read like a results section: the summary sentences with their main
numbers and references, the exactness certificate as a compact layers x checkpoints table, and the sample sizes
the figure captions state.

The sentences quote the cells of the tables they cite (:func:`~anchorlens.reports.tables.headline_grid`,
the task-effects and evidence grids), so the summary and the tables never disagree on a number or its policy
(n/a, rounding).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from anchorlens.reports.html import Sentence

HEADLINE_NAMES = ("sink", "guidance")  # the headline rows the summary quotes: where input attention goes


def sample_sizes(means: pd.DataFrame, examples: int) -> tuple[int, int, int]:
    """(examples, layers, heads) of a comparison: the layers and heads its statistics hold in their first stack
    (0 when ``means`` has none)."""
    if means is None or means.empty or not {"layer", "head", "stack"} <= set(means.columns):
        return examples, 0, 0
    rows = means[means["stack"] == means["stack"].iloc[0]]
    return examples, int(rows["layer"].dropna().nunique()), int(rows["head"].dropna().nunique())


def exactness_grid(exactness: Mapping[str, Mapping | None] | None, checkpoints: Sequence[str]) -> pd.DataFrame:
    """The exactness certificates as a layer x checkpoint grid of max |Δ| against eager attention (``1.2e-07``),
    then the rows ``all layers``, ``threshold`` and ``verdict``; empty when nothing was certified.

    A layer of another stack reads ``encoder 3``; a checkpoint without a certificate reads ``not certified (why)``
    in its verdict and ``—`` elsewhere. The per-layer rows are the materialised plan's probabilities; the row
    ``kernel plan`` is the largest difference of the kernel plan's statistics (``2.1e-06 (key_sums, score_sums)``),
    ``refused`` where the model rules that plan out, ``not used`` where the run never takes it.
    """
    records = {name: (exactness or {}).get(name) for name in checkpoints}
    if not any(records.values()):
        return pd.DataFrame()
    stacks = {str(e.get("stack", "")) for r in records.values() if r for e in r.get("per_layer") or ()}
    columns: dict[str, dict[str, str]] = {}
    for name, record in records.items():
        cells: dict[str, str] = {}
        for entry in (record or {}).get("per_layer") or ():
            where = f"{entry.get('stack')} {entry['layer']}" if len(stacks) > 1 else f"layer {entry['layer']}"
            cells[where] = _sci(entry.get("max_abs_diff"))
        if record and record.get("max_abs_diff") is not None:
            cells["all layers"] = _sci(record["max_abs_diff"])
            kernel = (record.get("plans") or {}).get("kernel")
            if kernel:
                cells["kernel plan"] = _kernel_cell(kernel)
            cells["threshold"] = f"{_sci(record.get('threshold'))} ({record.get('dtype')})"
            verdict = "within" if record.get("exact") else "ABOVE (--allow-inexact)"
            cells["verdict"] = f"{verdict}, {record.get('examples')} examples"
        else:
            why = (record or {}).get("unavailable", "no layer checked") if record else "not run"
            cells["verdict"] = f"not certified ({why})"
        columns[name] = cells
    grid = pd.DataFrame(columns)
    last = ("all layers", "kernel plan", "threshold", "verdict")
    order = [i for i in grid.index if i not in last] + [i for i in last if i in grid.index]
    return grid.reindex(index=order, columns=list(checkpoints)).fillna("—")


def _kernel_cell(kernel: Mapping) -> str:
    """The ``kernel plan`` cell of a certificate's ``plans["kernel"]`` record."""
    if kernel.get("max_abs_diff") is not None:
        return f"{_sci(kernel['max_abs_diff'])} ({', '.join(kernel.get('compared') or ())})"
    return "refused" if kernel.get("unavailable") else "not used"


def _sci(value: object) -> str:
    return "—" if value is None or pd.isna(value) else f"{float(value):.1e}"  # type: ignore[arg-type]


def _row_label(headline: pd.DataFrame, name: str, grid: pd.DataFrame) -> str | None:
    """The headline grid's row label of headline row ``name`` (``input → sink (decoder)``), if it has one."""
    if headline.empty or "name" not in headline.columns or "label" not in headline.columns:
        return None
    rows = headline[headline["name"] == name]
    for _, row in rows.iterrows():
        label = f"{row['label']} ({row['stack']})"
        if label in grid.index:
            return label
    return None


def _quote(grid: pd.DataFrame, label: str, checkpoints: Sequence[str]) -> str:
    """``label: base 0.083 [0.079, 0.088]; instance 0.066 [...]; Δ −0.018 ...`` from the grid's cells."""
    cells = "; ".join(f"{name} {grid.at[label, name]}" for name in checkpoints if name in grid.columns)
    return f"{label}: {cells}"


def summary_sentences(
    *,
    checkpoints: Sequence[str],
    headline: pd.DataFrame,
    grid: pd.DataFrame,
    effects: pd.DataFrame,
    evidence: pd.DataFrame,
    exactness: Mapping[str, Mapping | None] | None,
    fixed: int,
    figures: Sequence[str] = (),
    sizes: str = "",
) -> list[Sentence]:
    """A few sentences with the main numbers, each citing its table (``table-headline``, ``table-effects``,
    ``table-evidence``, ``table-exactness``) and the figures that draw it (``figure-STEM`` of ``figures``)."""
    base = checkpoints[0]
    drawn = set(figures)
    out: list[Sentence] = []
    quoted = [label for label in (_row_label(headline, n, grid) for n in HEADLINE_NAMES) if label]
    if quoted:
        text = (
            f"Where input queries' attention goes ({sizes or 'mean over examples'}, averaged over layers and heads; "
            f"Δ paired to {base}): " + "; ".join(_quote(grid, label, checkpoints) for label in quoted) + "."
        )
        refs = ["table-headline", *(f"figure-{s}" for s in ("layer_curves", "role_flow") if s in drawn)]
        out.append(Sentence(text, tuple(refs)))
    diffs = [f"figure-{s}" for s in figures if s.startswith("heads_diff_")]
    if diffs or "heads_sink" in drawn:
        out.append(
            Sentence(
                "Attention of input queries to the sink per layer and head, and each checkpoint's paired difference "
                f"to {base}, are in the head grids.",
                tuple([*(["figure-heads_sink"] if "heads_sink" in drawn else []), *diffs]),
            )
        )
    if fixed:
        out.append(
            Sentence(
                f"{fixed} value{'s are' if fixed != 1 else ' is'} n/a because the causal mask fixes "
                f"{'them' if fixed != 1 else 'it'} (not findings; the reasons are listed under the table).",
                ("table-headline",),
            )
        )
    if not effects.empty:
        label = str(effects.index[0])
        out.append(
            Sentence(
                "Task effects: " + _quote(effects, label, checkpoints) + "; the other measures in the table.",
                ("table-effects",),
            )
        )
    if not evidence.empty:
        rows = [str(i) for i in evidence.index if str(i).startswith("input → sink")][:2] or [str(evidence.index[0])]
        evidence_figures = [f"figure-{s}" for s in figures if s.startswith(("value_mass", "sink_", "massive"))]
        out.append(
            Sentence(
                "Evidence beyond attention weights: " + "; ".join(_quote(evidence, r, checkpoints) for r in rows) + ".",
                ("table-evidence", *evidence_figures),
            )
        )
    certified = {k: v for k, v in (exactness or {}).items() if v and v.get("max_abs_diff") is not None}
    if certified:
        worst = max(float(v["max_abs_diff"]) for v in certified.values())
        above = [k for k, v in certified.items() if not v.get("exact")]
        missing = [k for k in checkpoints if k not in certified]
        text = (
            f"The capture agrees with eager attention within its threshold for every certified checkpoint "
            f"(largest |Δ| {worst:.1e})"
            if not above
            else f"The capture of {', '.join(above)} differs from eager attention above the threshold "
            f"(largest |Δ| {worst:.1e}; run with --allow-inexact)"
        )
        text += f"; not certified: {', '.join(missing)}." if missing else "."
        out.append(Sentence(text, ("table-exactness",)))
    return out
