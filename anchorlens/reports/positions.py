"""Write a position-sweep run directory: metrics, positions.csv, summary.md, figures/, manifest.json."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from anchorlens.figures import position_sweep, save_figure
from anchorlens.reports.comparison import write_metrics
from anchorlens.reports.tables import to_markdown
from anchorlens.rundir import OutClaim, claimed, examples_digest, write_manifest
from anchorlens.workflows.positions import PositionSweep


def position_grid(summary: pd.DataFrame, order: list[str] | None = None) -> pd.DataFrame:
    """Position x metric grid of 'mean [CI]' cells, rows in sweep order."""
    cells = summary.assign(cell=summary.apply(lambda r: f"{r['mean']:.3f} [{r['ci_lo']:.3f}, {r['ci_hi']:.3f}]", axis=1))
    grid = cells.pivot(index="position", columns="metric", values="cell")
    return grid.reindex(order or list(dict.fromkeys(summary["position"])))


def write_positions(sweep: PositionSweep, out: str | Path | OutClaim, force: bool = False,
                    accuracy: pd.DataFrame | None = None) -> Path:
    """Write every artifact of a position sweep atomically into ``out`` (a path or the command's claim)."""
    grid = position_grid(sweep.summary, sweep.positions)
    with claimed(out, kind="positions", force=force) as claim, claim.atomic() as tmp:
        write_metrics(sweep.metrics, tmp / "metrics")
        sweep.summary.to_csv(tmp / "positions.csv", index=False)
        (tmp / "figures").mkdir()
        for metric, q, k in (("anchor_mass", None, sweep.anchor), ("anchor_structural", sweep.anchor, "structural")):
            rows = sweep.metrics[(sweep.metrics.metric == metric) & (sweep.metrics.key_role == k)]
            if q is not None:
                rows = rows[rows.query_role == q]
            rows = rows[rows.query_role != "all"]
            fig = position_sweep(rows, metric, accuracy, head=None, title=f"{metric} vs {sweep.anchor} position ({sweep.spec})")
            save_figure(fig, tmp / "figures" / f"positions_{metric}")
        md = [f"# Position sweep: {sweep.spec}", "", f"Task {sweep.facts['task']}, {sweep.facts['examples']} examples "
              f"from {sweep.facts['source']}. anchor_mass: attention input queries pay to the {sweep.anchor} token; "
              f"anchor_structural: the {sweep.anchor} token's own attention to structural tokens. Mean over examples "
              "(each averaged over layers and heads) with 95% bootstrap CI.", "", to_markdown(grid, "position"), ""]
        (tmp / "summary.md").write_text("\n".join(md))
        write_manifest(tmp, "positions", **sweep.facts, data_digest=examples_digest(sweep.inputs.examples))
    return claim.path
