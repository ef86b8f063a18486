"""Write sweep run directories: the table (csv + markdown), figures and a manifest."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from anchorlens.figures import current_figure_size, figure_size, save_figure, sweep_curve
from anchorlens.reports.tables import to_markdown
from anchorlens.rundir import OutClaim, claimed, write_manifest


def _fmt(df: pd.DataFrame) -> pd.DataFrame:
    """Numbers to 3 decimals for the markdown table."""
    return df.apply(lambda col: col.map(lambda v: f"{v:.3f}" if isinstance(v, float) else v))


def write_sweep(
    table: pd.DataFrame,
    out: str | Path | OutClaim,
    *,
    kind: str,
    x: str,
    by: str | None,
    facts: dict,
    force: bool = False,
    extra_metrics: tuple[str, ...] = (),
    runs: Path | None = None,
    figures: bool = True,
    curves: tuple[tuple[str, str, str], ...] = (("accuracy", "ci_lo", "ci_hi"),),
    size: str | None = None,
) -> Path:
    """sweep.csv, summary.md, figures/ (one per ``curves`` (y, lo, hi) column triple present, with its 95% CI, and
    one per extra metric, at the preset ``size``, default the current one), manifest.json (+ ``runs`` moved in), atomically."""
    with (
        claimed(out, kind=f"sweep-{kind}", force=force) as claim,
        claim.atomic() as tmp,
        figure_size(size or current_figure_size()) as preset,
    ):
        table.to_csv(tmp / "sweep.csv", index=False)
        if figures:
            (tmp / "figures").mkdir()
        for y, lo, hi in curves if figures else ():
            if y not in table.columns or not table[y].notna().any():
                continue
            save_figure(
                sweep_curve(table, x, y, lo=lo, hi=hi, by=by, title=f"{kind} sweep: {y} (95% bootstrap CI)"),
                tmp / "figures" / y,
            )
        for metric in extra_metrics if figures else ():
            if metric in table.columns and table[metric].notna().any():
                fig = sweep_curve(
                    table.dropna(subset=[metric]), x, metric, lo=None, hi=None, by=by, title=f"{kind} sweep: {metric}"
                )
                save_figure(fig, tmp / "figures" / metric)
        md = [
            f"# {kind} sweep",
            "",
            ", ".join(f"{k}: {v}" for k, v in facts.items()),
            "",
            to_markdown(_fmt(table.set_index(table.columns[0])), table.columns[0]),
            "",
        ]
        (tmp / "summary.md").write_text("\n".join(md))
        if runs is not None:
            shutil.move(str(runs), str(tmp / "runs"))
        write_manifest(tmp, f"sweep-{kind}", **facts, **({"figure_size": preset.name} if figures else {}))
    return claim.path
