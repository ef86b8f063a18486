"""Write a position-sweep run directory: metrics, positions.csv, summary.md, figures/, manifest.json."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from anchorlens.analyses.headline import anchor_metrics
from anchorlens.figures import current_figure_size, figure_size, position_sweep, save_figure
from anchorlens.reports.comparison import exactness_lines, write_metrics
from anchorlens.reports.tables import FIXED_CELL, to_markdown
from anchorlens.rundir import OutClaim, claimed, examples_digest, write_manifest
from anchorlens.workflows.positions import PositionSweep


def position_grid(summary: pd.DataFrame, order: list[str] | None = None) -> pd.DataFrame:
    """Position x metric grid of 'mean [CI]' cells (``n/a (fixed by the causal mask)`` where the mask
    decides the value), rows in sweep order, columns the metrics' labels."""

    def cell(r: pd.Series) -> str:
        if str(r.get("fixed", "") or "") not in ("", "nan"):
            return FIXED_CELL
        return f"{r['mean']:.3f} [{r['ci_lo']:.3f}, {r['ci_hi']:.3f}]"

    column = "label" if "label" in summary.columns else "metric"
    cells = summary.assign(cell=summary.apply(cell, axis=1))
    grid = cells.pivot(index="position", columns=column, values="cell")
    return grid.reindex(order or list(dict.fromkeys(summary["position"])))


def write_positions(
    sweep: PositionSweep,
    out: str | Path | OutClaim,
    force: bool = False,
    accuracy: pd.DataFrame | None = None,
    *,
    figures: bool = True,
    size: str | None = None,
) -> Path:
    """Write every artifact of a position sweep atomically into ``out`` (a path or the command's claim); figures at
    the preset ``size`` (:data:`~anchorlens.figures.FIGURE_SIZES`; default: the current one), recorded in the manifest."""
    grid = position_grid(sweep.summary, sweep.positions)
    with (
        claimed(out, kind="positions", force=force) as claim,
        claim.atomic() as tmp,
        figure_size(size or current_figure_size()) as preset,
    ):
        write_metrics(sweep.metrics, tmp / "metrics")
        sweep.summary.to_csv(tmp / "positions.csv", index=False)
        if not sweep.evidence.empty:
            sweep.evidence.to_csv(tmp / "evidence.csv", index=False)
        for m in anchor_metrics(sweep.anchor) if figures else ():
            (tmp / "figures").mkdir(exist_ok=True)
            fig = position_sweep(
                m.rows(sweep.metrics),
                m.metric,
                accuracy,
                head=None,
                title=f"{m.label} vs {sweep.anchor} position ({sweep.spec})",
            )
            save_figure(fig, tmp / "figures" / f"positions_{m.metric}")
        md = [
            f"# Position sweep: {sweep.spec}",
            "",
            f"Task {sweep.facts['task']}, {sweep.facts['examples']} examples "
            f"from {sweep.facts['source']}. anchor_mass: attention input queries pay to the {sweep.anchor} token; "
            f"anchor_structural: the {sweep.anchor} token's own attention to structural tokens. Mean over examples "
            "(each averaged over layers and heads) with 95% bootstrap CI. n/a (fixed by the causal mask): the mask decides "
            "that value at that position (e.g. nothing before the input can see it), so it is not a finding.",
            "",
            to_markdown(grid, "position"),
            "",
            *(f"- {line}" for line in exactness_lines(sweep.facts)),
            *(
                [
                    f"- evidence.csv: per position and layer, the mass input queries give the first token, the sink "
                    f"and the {sweep.anchor} token by attention weight and by norm, and the evidence reducers' "
                    "sink rates and massive activations (mean over examples, 95% bootstrap CI)."
                ]
                if not sweep.evidence.empty
                else []
            ),
            "",
        ]
        (tmp / "summary.md").write_text("\n".join(md))
        drawn = {"figure_size": preset.name} if figures else {}
        write_manifest(tmp, "positions", **sweep.facts, **drawn, data_digest=examples_digest(sweep.inputs.examples))
    return claim.path
