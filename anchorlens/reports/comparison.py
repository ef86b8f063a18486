"""Write a comparison run directory: metrics, summary.md, figures/, report.html, manifest.json."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pandas as pd
from matplotlib.figure import Figure

from anchorlens.analyses.frames import per_head
from anchorlens.analyses.headline import SINK_MASS
from anchorlens.atomic import write_json
from anchorlens.capture.maps_io import load_maps, save_maps
from anchorlens.errors import DataError, UsageError
from anchorlens.figures import (
    attention_map_figure,
    figure_to_png_bytes,
    head_diff_grid,
    head_grids,
    layer_curves,
    measure_label,
    role_flow_heatmaps,
    save_figure,
)
from anchorlens.figures.maps import sink_tokens
from anchorlens.reports.bases import adapter_lines, base_sentence
from anchorlens.reports.evidence import EVIDENCE_NOTE, evidence_figures, evidence_grid, safe_stem
from anchorlens.reports.html import grid_html, render_report
from anchorlens.reports.tables import fixed_notes, headline_grid, present_roles, to_markdown
from anchorlens.rundir import OutClaim, claimed, examples_digest, write_manifest
from anchorlens.workflows.compare import Comparison
from anchorlens.workflows.compare_summaries import CURVES, figure_summaries

T = TypeVar("T")

DECOMPOSITION_NOTE = (
    "Input queries' attention (special + structural + content; guidance queries excluded) is split "
    "into the sink (the first input token), guidance, structural, content and special keys, the "
    "sink excluded from the others, summing to 1 per query. Guidance absorption = input → guidance "
    "mass / the guidance share of visible positions (> 1: more than its share). Values the causal "
    "mask fixes are n/a, not findings."
)


def comparison_figures(result: Comparison) -> list[tuple[str, str, Figure]]:
    """(file stem, caption, figure) for every figure of a comparison."""
    base, others = result.checkpoints[0], result.checkpoints[1:]
    m = SINK_MASS
    out = [
        (
            "attention_maps",
            f"Attention map of example {result.facts['map_example']} (mean over layers and heads), "
            "guidance outlined, structural tokens dashed",
            attention_map_figure(result.maps, layer="mean", head="mean"),
        ),
        (
            "layer_curves",
            "Per-layer means with 95% bootstrap CI over examples; the sink is each checkpoint's first input token",
            layer_curves(
                result.curves,
                [c.label for c in CURVES],
                order=result.checkpoints,
                anchors=sink_tokens(result.maps),  # the sink plotted: the first input token
                labels={c.label: measure_label(c.metric, c.query_role, c.key_role) for c in CURVES},
            ),
        ),
        (
            "heads_sink",
            "Attention of input queries to the sink by layer and head, one colour scale for every checkpoint",
            head_grids(result.means, m.metric, result.checkpoints, query_role=m.query_role, key_role=m.key_role),
        ),
    ]
    paired = per_head(result.paired)
    shown = paired[(paired.metric == m.metric) & (paired.query_role == m.query_role) & (paired.key_role == m.key_role)]
    bound = float(shown["diff"].abs().max()) if len(shown) else None  # one scale for every difference figure
    for name in others:
        out.append(
            (
                f"heads_diff_{safe_stem(name)}",
                f"Paired difference of attention to the sink, {name} − {base} (* q<0.05)",
                head_diff_grid(
                    paired, m.metric, checkpoint=name, query_role=m.query_role, key_role=m.key_role, bound=bound or None
                ),
            )
        )
    flow = result.means[(result.means.metric == "role_flow") & result.means["head"].isna()]
    flow = flow[flow.query_role != "all"]
    out.append(
        (
            "role_flow",
            "Role-to-role attention (rows: query role, columns: key role), mean over layers and heads",
            role_flow_heatmaps(flow, checkpoints=result.checkpoints),
        )
    )
    return out + evidence_figures(result.means, result.checkpoints, result.facts.get("evidence"))


def write_metrics(df: pd.DataFrame, path_stem: Path) -> Path:
    """metrics.parquet (or metrics.csv when no parquet engine is installed)."""
    try:
        path = path_stem.with_suffix(".parquet")
        df.to_parquet(path, index=False)
    except ImportError:
        path = path_stem.with_suffix(".csv")
        df.to_csv(path, index=False)
    return path


def other_base_warnings(facts: dict) -> list[str]:
    """One summary line per checkpoint loaded with --allow-other-base on a base other than its own."""
    lines = []
    for name, records in facts.get("other_base", {}).items():
        for r in records:
            lines.append(
                f"Warning: {name} ({r['source']}) was trained on {r['recorded']['spec']!r} "
                f"(model_type {r['recorded'].get('model_type')}) and is measured here on "
                f"{r['base']['spec']!r} (--allow-other-base)."
            )
    return [*lines, ""] if lines else []


def exactness_lines(facts: dict) -> list[str]:
    """One summary line per checkpoint's certificate (its capture against eager on the first examples)."""
    lines = []
    for name, record in (facts.get("exactness") or {}).items():
        if record is None:
            continue
        worst = record.get("max_abs_diff")
        if worst is None:
            lines.append(f"Exactness of {name}: not certified ({record.get('unavailable', 'no layer checked')}).")
            continue
        verdict = "within" if record.get("exact") else "ABOVE (--allow-inexact)"
        lines.append(
            f"Exactness of {name}: max |Δ| {worst:.1e} against eager attention over {len(record['per_layer'])} "
            f"layers on {record['examples']} examples, {verdict} the {record['dtype']} threshold "
            f"{record['threshold']:.0e}."
        )
    return lines


def effects_note(result: Comparison) -> str:
    """What the task-effects table shows, for summary.md and report.html."""
    base = result.checkpoints[0]
    where = str(result.effects["stack"].iloc[0]) if len(result.effects) else "answer token"
    what = (
        "accuracy, the label's NLL and KL of the next-token distribution at the answer position"
        if where == "answer token"
        else "the text's own next-token NLL and KL, each the mean over the text's positions"
    )
    return (
        f"Task effects ({where}): {what}, per checkpoint; mean over examples with 95% bootstrap CI; Δ = paired "
        f"difference to {base} (for KL, KL({base} ‖ checkpoint) itself) with its paired bootstrap CI; p from "
        "McNemar's exact test (accuracy) or a sign-flip test (NLL, KL), q Benjamini-Hochberg across the table. "
        "KL is never negative, so its test only says it is not exactly 0 (two attention paths that agree to float "
        "rounding give KL ~1e-7 and a small q): read its size. Per-example values: effects.parquet."
    )


def effects_grid(result: Comparison) -> pd.DataFrame:
    """The task-effects table as a metric x checkpoint grid of formatted cells (empty when none was measured)."""
    if result.effects.empty:
        return pd.DataFrame()
    return headline_grid(result.effects, result.checkpoints)


def write_comparison(
    result: Comparison, out: str | Path | OutClaim, force: bool = False, *, figures: bool = True
) -> Path:
    """Write every artifact atomically into ``out`` (a path, or the claim the command took before computing)."""
    grid = headline_grid(result.headline, result.checkpoints, present_roles(result.means))
    with claimed(out, kind="compare", force=force) as claim, claim.atomic() as tmp:
        if result.metrics_file is not None:  # on disk (streamed by compare, or read back): copied, never loaded
            shutil.copyfile(result.metrics_file, tmp / result.metrics_file.name)
        else:
            write_metrics(result.metrics, tmp / "metrics")
        result.headline.to_csv(tmp / "headline.csv", index=False)
        result.paired.to_csv(tmp / "paired.csv", index=False)
        effects = effects_grid(result)
        if not effects.empty:
            result.effects.to_csv(tmp / "task_effects.csv", index=False)
            write_metrics(result.effect_rows, tmp / "effects")
        effect_lines = ["## Task effects", "", effects_note(result), "", to_markdown(effects), ""]
        evidence = evidence_grid(result.evidence, result.checkpoints)
        if not result.evidence.empty:
            result.evidence.to_csv(tmp / "evidence.csv", index=False)
        evidence_lines = ["## Evidence beyond attention weights", "", EVIDENCE_NOTE, "", to_markdown(evidence), ""]
        save_maps(result.maps, tmp / "maps")
        rendered = []
        if figures:
            rendered = write_figures(result, tmp / "figures")
        title = f"anchorlens compare: {' vs '.join(result.checkpoints)}"
        facts = {**result.facts, "checkpoints": ", ".join(result.checkpoints)}
        shown = {k: v for k, v in facts.items() if k != "exactness"}  # per-layer lists stay in the manifest
        if "seconds" in shown:
            shown["seconds"] = ", ".join(f"{k.replace('_', ' ')} {v:,.1f} s" for k, v in shown["seconds"].items())
        exact = exactness_lines(result.facts)
        md = [
            f"# {title}",
            "",
            f"Task {result.facts['task']}, {result.facts['examples']} examples from "
            f"{result.facts['source']}, {base_sentence(result.facts)}.",
            "",
            *adapter_lines(result.facts),
            *other_base_warnings(result.facts),
            *(f"{line}\n" for line in exact),
            "Mean over examples (each example averaged over layers and heads) with 95% bootstrap CI; Δ = paired "
            f"difference to {result.checkpoints[0]} with Benjamini-Hochberg q.",
            "",
            DECOMPOSITION_NOTE,
            "",
            to_markdown(grid),
            "",
            *(f"- {n}" for n in fixed_notes(result.headline)),
            "",
            *(effect_lines if not effects.empty else []),
            *(evidence_lines if not evidence.empty else []),
        ]
        (tmp / "summary.md").write_text("\n".join(md))
        (tmp / "report.html").write_text(
            render_report(
                title,
                shown,
                grid,
                rendered,
                [*other_base_warnings(result.facts)[:-1], *exact, DECOMPOSITION_NOTE, *fixed_notes(result.headline)],
                tables=[
                    *([(effects_note(result), grid_html(effects))] if not effects.empty else []),
                    *([(EVIDENCE_NOTE, grid_html(evidence))] if not evidence.empty else []),
                ],
            )
        )
        write_json(tmp / "facts.json", {**result.facts, "checkpoints": result.checkpoints})
        digest = examples_digest(result.inputs.examples) if result.inputs is not None else facts.get("data_digest")
        write_manifest(tmp, "compare", **facts, data_digest=digest)
    return claim.path


def write_figures(result: Comparison, folder: Path) -> list[tuple[str, bytes]]:
    """Save every comparison figure (png + pdf) into ``folder``; returns (caption, png bytes) pairs."""
    folder.mkdir(parents=True, exist_ok=True)
    rendered = []
    for stem, caption, fig in comparison_figures(result):
        save_figure(fig, folder / stem, overwrite=True)
        rendered.append((caption, figure_to_png_bytes(fig)))
    return rendered


def redraw_figures(
    run_dir: str | Path, out: str | Path | OutClaim | None = None, force: bool = False
) -> tuple[Path, int]:
    """``anchorlens figures``: redraw a compare run's figures into ``out`` (default RUN_DIR/figures) atomically.

    Returns (folder, number of figures). The folder records a manifest; a kill leaves no half folder.
    """
    target = Path(run_dir) / "figures" if out is None else out
    with claimed(target, kind="figures", force=force) as claim:
        result = load_comparison(run_dir)
        with claim.atomic() as tmp:
            rendered = write_figures(result, tmp)
            write_manifest(tmp, "figures", source=str(Path(run_dir).absolute()), figures=len(rendered))
    return claim.path, len(rendered)


REWRITE_HINT = "re-run `anchorlens compare` into a new --out to rewrite it"


def _read_part(path: Path | Callable[[], Path], read: Callable[[], T]) -> T:
    """``read()`` of one file of a run; a damaged or truncated file is one DataError naming it (``path``, or the
    callable that finds which file broke, asked only then) and the fix."""
    try:
        return read()
    except UsageError:
        raise
    except Exception as err:  # truncated parquet/json/safetensors, bad csv...
        detail = " ".join(str(err).split())[:200] or type(err).__name__
        where = path() if callable(path) else path
        raise DataError(f"{where}: cannot read ({detail}); {REWRITE_HINT}") from None


def _broken_maps_file(run: Path) -> Path:
    """The maps file to name if the maps fail to load: ``maps.json`` when it is not JSON, else the tensors."""
    try:
        json.loads((run / "maps.json").read_text())
    except (OSError, ValueError):
        return run / "maps.json"
    return run / "maps.safetensors"


def load_comparison(run_dir: str | Path) -> Comparison:
    """Rebuild a Comparison (without its inputs) from a run directory written by ``write_comparison``.

    A missing or damaged file is a :class:`~anchorlens.errors.DataError` (one line, exit 2) naming the file.
    """
    run = Path(run_dir)
    needed = ["facts.json", "headline.csv", "paired.csv", "maps.json", "maps.safetensors"]
    missing = [f for f in needed if not (run / f).exists()]
    metrics = next((p for p in (run / "metrics.parquet", run / "metrics.csv") if p.exists()), None)
    if not run.is_dir() or missing or metrics is None:
        names = [*missing, *([] if metrics is not None else ["metrics.parquet"])]
        raise UsageError(
            f"{run} is not an anchorlens compare run directory (missing {', '.join(names)}); "
            "pass a directory written by `anchorlens compare`, or re-run compare to rewrite it"
        )
    facts = _read_part(run / "facts.json", lambda: json.loads((run / "facts.json").read_text()))
    if not isinstance(facts, dict) or not isinstance(facts.get("checkpoints"), list):
        raise DataError(f"{run / 'facts.json'}: no list of checkpoints; {REWRITE_HINT}")

    def read(name: str) -> pd.DataFrame:
        return _read_part(run / name, lambda: pd.read_csv(run / name, keep_default_na=False, na_values=[""]))

    headline, paired = read("headline.csv"), read("paired.csv")
    for name, frame in (("headline.csv", headline), ("paired.csv", paired)):
        if frame.empty or not {"checkpoint", "metric"} <= set(frame.columns):
            raise DataError(f"{run / name}: truncated or not a compare table (no rows or columns); {REWRITE_HINT}")
        for col in ("query_role", "key_role"):
            if col in frame.columns:
                frame[col] = frame[col].fillna("").astype(str)
    checkpoints = facts.pop("checkpoints")
    means, curves = _read_part(metrics, lambda: figure_summaries(metrics))
    effects = read("task_effects.csv") if (run / "task_effects.csv").exists() else pd.DataFrame()
    evidence = _read_part(run / "evidence.csv", lambda: read_evidence(run / "evidence.csv"))
    rows = next((p for p in (run / "effects.parquet", run / "effects.csv") if p.exists()), None)
    effect_rows = (
        pd.DataFrame()
        if rows is None
        else _read_part(rows, lambda: pd.read_parquet(rows))
        if rows.suffix == ".parquet"
        else read(rows.name)
    )
    maps = _read_part(lambda: _broken_maps_file(run), lambda: load_maps(run / "maps"))
    return Comparison(
        checkpoints,
        None,
        headline,
        paired,
        maps,
        facts,
        means=means,
        curves=curves,
        metrics_file=metrics,
        effects=effects,
        effect_rows=effect_rows,
        evidence=evidence,
    )


def read_evidence(path: Path) -> pd.DataFrame:
    """A run's evidence.csv (empty when the run had no evidence reducers): ``layer`` <NA> on the all-layers rows."""
    if not path.exists():
        return pd.DataFrame()
    table = pd.read_csv(
        path, keep_default_na=False, na_values={"layer": [""], "mean": [""], "ci_lo": [""], "ci_hi": [""]}
    )
    table["layer"] = table["layer"].astype("Int64")
    table["key"] = table["key"].astype(str)
    return table
