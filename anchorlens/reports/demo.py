"""The demo's output: the per-layer view, a side-by-side table and a one-line finding for the terminal, a small report.

``write_demo`` writes ``report.html`` (the finding, the headline table, the figures, the per-layer
table), ``attention_budget.png``, ``streaming_maps.png/.pdf/.svg`` (chosen layers' attention maps averaged
over examples, StreamingLLM's Fig. 2), ``per_layer.csv``, ``headline.csv`` and ``manifest.json``: well under
1 MB, where ``anchorlens compare`` writes every figure and the per-head statistics.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from markupsafe import Markup

from anchorlens.analyses.frames import per_head
from anchorlens.figures import attention_budget, current_figure_size, save_figure
from anchorlens.figures.streaming import streaming_maps_figure
from anchorlens.reports.html import render_report
from anchorlens.reports.tables import fixed_notes, headline_grid, present_roles
from anchorlens.roles.kinds import GUIDANCE_ROLES
from anchorlens.rundir import OutClaim, claimed, examples_digest, write_manifest
from anchorlens.workflows.compare import Comparison
from anchorlens.workflows.demo import DEMO_PARTS, headline_of

GUIDANCE_NAMES = tuple(r.label for r in GUIDANCE_ROLES)
WIDTH = 8  # characters per number column
FIGURE = "attention_budget.png"
STREAMING_FIGURE = "streaming_maps"  # .png, .pdf, .svg
SHORT = {"structural": "struct"}  # column headers that fit the number width
NOT_APPLICABLE = "–"  # a part the checkpoint has not got (the base has no anchor)
PART_NOTE = (
    "Where input tokens' attention goes, per layer (mean over examples and heads): sink = the first "
    "input token; anchor = the checkpoint's guidance (the instance token; – without one); struct(ural) "
    "and content exclude the sink. A checkpoint's four columns sum to 1 (special tokens aside)."
)


def guidance_of(result: Comparison) -> dict[str, str | None]:
    """Each checkpoint's guidance role (the anchor input queries can attend to), None for the bare base.

    Read from the run's roles (:func:`~anchorlens.reports.tables.present_roles`).
    """
    present = present_roles(result.means)
    return {name: next((g for g in GUIDANCE_NAMES if g in present.get(name, ())), None) for name in result.checkpoints}


def per_layer_table(result: Comparison) -> pd.DataFrame:
    """Layer x (checkpoint, part) means over examples and heads of the sink-aware decomposition of input queries.

    Parts: sink (the first input token), anchor (the checkpoint's guidance; NaN for a checkpoint
    without one, so it reads "–" rather than 0.000), structural and content (the sink excluded).
    """
    guidance = guidance_of(result)
    columns = {}
    for name in result.checkpoints:
        rows = result.means[result.means["checkpoint"] == name]
        for part, metric in DEMO_PARTS:
            series = per_head(metric.rows(rows)).groupby("layer")["value"].mean()
            if part == "anchor" and guidance[name] is None:
                series = series * np.nan
            columns[(name, part)] = series
    table = pd.DataFrame(columns)
    table.index = pd.Index([int(v) for v in table.index], name="layer")
    table.columns = pd.MultiIndex.from_tuples(table.columns, names=["checkpoint", "part"])
    return table


def _number(value: float) -> str:
    return f"{NOT_APPLICABLE:>{WIDTH}}" if value is None or math.isnan(value) else f"{value:{WIDTH}.3f}"


def side_by_side(table: pd.DataFrame, checkpoints: list[str]) -> str:
    """Fixed-width text: one row per layer, each checkpoint's sink / anchor / structural / content side by side."""
    parts = [p for p, _ in DEMO_PARTS]
    block = WIDTH * len(parts) + 2
    head1 = f"{'':>5}  " + "".join(f"{name[: block - 2]:^{block}}" for name in checkpoints)
    head2 = f"{'layer':>5}  " + "".join(
        "".join(f"{SHORT.get(p, p):>{WIDTH}}" for p in parts) + "  " for _ in checkpoints
    )
    lines = [head1.rstrip(), head2.rstrip()]
    for layer, row in table.iterrows():
        cells = "".join("".join(_number(row[(c, p)]) for p in parts) + "  " for c in checkpoints)
        lines.append(f"{layer:>5}  {cells}".rstrip())
    mean = table.mean(skipna=False)
    lines.append(f"{'mean':>5}  " + "".join("".join(_number(mean[(c, p)]) for p in parts) + "  " for c in checkpoints))
    return "\n".join(line.rstrip() for line in lines)


def _signed(value: float) -> str:
    """``+0.205`` / ``−0.378`` (a true minus sign)."""
    return f"{value:+.3f}".replace("-", "−")


def _q(q: float) -> str:
    return "q < 0.001" if q < 0.001 else f"q = {q:.2g}"


def finding(result: Comparison, checkpoint: str) -> str:
    """One line: what ``checkpoint`` changes against the first checkpoint, each number with its 95% bootstrap CI.

    ``instance vs base (24 paired examples, 95% bootstrap CI): input → instance 0.270 [0.247, 0.296];
    input → sink 0.529 → 0.151, Δ −0.378 [−0.395, −0.360]; input → structural ... ; all q < 0.001``
    """
    baseline = result.checkpoints[0]
    anchor = guidance_of(result).get(checkpoint)
    pieces, qs = [], []
    row = headline_of(result, checkpoint, f"anchor_mass:{anchor}") if anchor else None
    if row is not None and not math.isnan(row["mean"]):
        pieces.append(f"{row['label']} {row['mean']:.3f} [{row['ci_lo']:.3f}, {row['ci_hi']:.3f}]")
    n = None
    for name in ("sink", "structural"):
        base_row, row = headline_of(result, baseline, name), headline_of(result, checkpoint, name)
        if base_row is None or row is None or math.isnan(row.get("diff", math.nan)):
            continue
        label = str(row["label"]).replace(" (sink excluded)", "")
        if bool(row.get("within_tolerance", False)):
            pieces.append(f"{label} {base_row['mean']:.3f} → {row['mean']:.3f}, Δ 0 (within rounding)")
            continue
        pieces.append(
            f"{label} {base_row['mean']:.3f} → {row['mean']:.3f}, "
            f"Δ {_signed(row['diff'])} [{_signed(row['diff_lo'])}, {_signed(row['diff_hi'])}]"
        )
        qs.append(float(row["q_value"]))
        n = int(row["n"])
    if not pieces:
        return f"{checkpoint} vs {baseline}: no paired headline difference to report"
    head = f"{checkpoint} vs {baseline} ({n} paired examples, 95% bootstrap CI)" if n else f"{checkpoint} vs {baseline}"
    tail = f"; {'all ' if len(qs) > 1 else ''}{_q(max(qs))}" if qs else ""
    return f"{head}: " + "; ".join(pieces) + tail


def _table_html(table: pd.DataFrame) -> Markup:
    """The per-layer table as escaped HTML, numbers to 3 decimals, absent parts as –."""
    shown = table.apply(lambda col: col.map(lambda v: NOT_APPLICABLE if pd.isna(v) else f"{v:.3f}"))
    return Markup(shown.to_html(escape=True, border=0))


def streaming_caption(result: Comparison) -> str:
    """What the StreamingLLM-style figure plots, over which layers and how many examples."""
    first = next(iter(result.mean_maps.values()))
    n = sorted({m.n_examples for m in result.mean_maps.values()})
    layers = ", ".join(map(str, first.layers))
    return (
        f"Attention maps of layers {layers}, averaged over heads and the first {'/'.join(map(str, n))} examples "
        "aligned by position from the first token, one row per checkpoint; ▼ marks the sink (the first input "
        f"token), hatched cells are masked (n/a) ({STREAMING_FIGURE}.png)"
    )


def write_demo(result: Comparison, table: pd.DataFrame, out: str | Path | OutClaim, force: bool = False) -> Path:
    """Write the demo's report, figure and tables atomically into ``out`` (a path or the command's claim)."""
    findings = [finding(result, name) for name in result.checkpoints[1:]]
    with claimed(out, kind="demo", force=force) as claim, claim.atomic() as tmp:
        fig = attention_budget(result.means, result.checkpoints)
        (png,) = save_figure(fig, tmp / Path(FIGURE).stem, formats=("png",), dpi=110)
        figures = [(f"Where input tokens' attention goes, per layer ({FIGURE})", png.read_bytes())]
        if result.mean_maps:
            maps_fig = streaming_maps_figure(result.mean_maps)
            print_size = current_figure_size() != "screen"  # a paper's figure: the preset's print resolution
            maps_png, *_ = save_figure(maps_fig, tmp / STREAMING_FIGURE, dpi=None if print_size else 110)
            figures.append((streaming_caption(result), maps_png.read_bytes()))
        table.to_csv(tmp / "per_layer.csv")
        result.headline.to_csv(tmp / "headline.csv", index=False)
        facts = {**result.facts, "checkpoints": ", ".join(result.checkpoints)}
        title = f"anchorlens demo: {' vs '.join(result.checkpoints)}"
        html = render_report(
            title,
            facts,
            headline_grid(result.headline, result.checkpoints, present_roles(result.means)),
            figures,
            [*findings, *fixed_notes(result.headline)],
            tables=[(PART_NOTE, _table_html(table))],
        )
        (tmp / "report.html").write_text(html)
        digest = examples_digest(result.inputs.examples) if result.inputs is not None else None
        write_manifest(tmp, "demo", **facts, data_digest=digest)
    return claim.path
