"""Write a comparison run directory: metrics, summary.md, figures/, report.html, manifest.json."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pandas as pd
from markupsafe import Markup
from matplotlib.figure import Figure

from anchorlens.analyses.accuracy_pairs import accuracy_pairs
from anchorlens.analyses.frames import per_head
from anchorlens.analyses.headline import SINK_MASS
from anchorlens.analyses.mean_maps import load_mean_maps, save_mean_maps
from anchorlens.atomic import write_json
from anchorlens.capture.maps_io import load_maps, save_maps
from anchorlens.errors import DataError, UsageError
from anchorlens.figures import (
    attention_map_figure,
    current_figure_size,
    figure_size,
    figure_to_png_bytes,
    head_diff_grid,
    head_grids,
    layer_curves,
    measure_label,
    role_flow_heatmaps,
    save_figure,
)
from anchorlens.figures._style import size_preset
from anchorlens.figures.maps import sink_tokens
from anchorlens.figures.streaming import streaming_maps_figure
from anchorlens.reports.bases import adapter_lines, base_sentence
from anchorlens.reports.evidence import EVIDENCE_NOTE, evidence_figures, evidence_grid, includes_notes, safe_stem
from anchorlens.reports.html import (
    HEADLINE_TITLE,
    Document,
    Plot,
    Table,
    citations,
    grid_html,
    numbering,
    render_document,
)
from anchorlens.reports.results import exactness_grid, sample_sizes, summary_sentences
from anchorlens.reports.tables import fixed_notes, headline_grid, present_roles, rounding_note, to_markdown
from anchorlens.rundir import OutClaim, claimed, examples_digest, write_manifest
from anchorlens.views import attention_view_html
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


def streaming_entry(result: Comparison) -> list[tuple[str, str, Figure]]:
    """The StreamingLLM-style figure (chosen layers' maps averaged over examples), when the run averaged any."""
    if not result.mean_maps:
        return []
    first = next(iter(result.mean_maps.values()))
    n = "/".join(str(v) for v in sorted({m.n_examples for m in result.mean_maps.values()}))
    return [
        (
            "streaming_maps",
            f"Attention maps of layers {', '.join(map(str, first.layers))}, mean over {first.heads} heads and the "
            f"first n = {n} examples aligned by position from the first token, one row per checkpoint; ▼ marks the "
            "sink (the first input token), hatched cells are masked (n/a)",
            streaming_maps_figure(result.mean_maps),
        )
    ]


def comparison_figures(result: Comparison) -> list[tuple[str, str, Figure]]:
    """(file stem, caption, figure) for every figure of a comparison; each caption says what is plotted over
    which n (examples, layers, heads)."""
    base, others = result.checkpoints[0], result.checkpoints[1:]
    m = SINK_MASS
    n, layers, heads = sample_sizes(result.means, int(result.facts.get("examples", 0) or 0))
    over = f"{layers} layers" + (f" × {heads} heads" if heads else "")
    out = [
        (
            "attention_maps",
            f"Attention of each query (rows) to each key (columns) in example {result.facts['map_example']} "
            f"(n = 1 example), mean over {over}, one panel per checkpoint; guidance outlined, structural tokens dashed",
            attention_map_figure(result.maps, layer="mean", head="mean"),
        ),
        *streaming_entry(result),
        (
            "layer_curves",
            f"Per-layer means of the headline measures over n = {n} examples (each averaged over {heads} heads) with "
            f"95% bootstrap CI, {layers} layers, one line per checkpoint; the sink is each checkpoint's first input "
            "token",
            layer_curves(
                result.curves,
                [c.label for c in CURVES],
                order=result.checkpoints,
                sinks=sink_tokens(result.maps),  # the sink plotted: the first input token, named as the sink
                present=present_roles(result.means),  # a role a checkpoint has not got (base: guidance) is n/a
                labels={c.label: measure_label(c.metric, c.query_role, c.key_role) for c in CURVES},
            ),
        ),
        (
            "heads_sink",
            f"Attention of input queries to the sink (the first input token) per layer and head ({over}), mean over "
            f"n = {n} examples; one colour scale for every checkpoint",
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
                f"Paired difference of attention of input queries to the sink, {name} − {base}, per layer and head "
                f"({over}) over n = {n} paired examples (* q < 0.05)",
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
            f"Role-to-role attention (rows: query role, columns: key role), mean over n = {n} examples and {over}; "
            "values the causal mask fixes are n/a, not findings",
            role_flow_heatmaps(flow, checkpoints=result.checkpoints),
        )
    )
    evidence = [
        (stem, caption if "n = " in caption else f"{caption} (n = {n} examples, {over})", fig)
        for stem, caption, fig in evidence_figures(
            result.means, result.checkpoints, result.facts.get("evidence"), table=result.evidence
        )
    ]
    return out + evidence


EFFECTS_TITLES = {
    "answer token": "Task effects: accuracy, the label's NLL and the KL to the baseline at the answer, per checkpoint",
    "text": "Task effects: the text's next-token NLL and the KL to the baseline, per checkpoint",
}
EVIDENCE_TITLE = "Evidence beyond attention weights: mass by weight and by norm, sink rates, massive activations"
EXACTNESS_TITLE = "Exactness certificate: max |Δ| of the captured attention against eager attention, per layer"
EXACTNESS_NOTE = (
    "Each checkpoint's capture is checked against eager attention on the first examples before any statistic is "
    "computed; a capture above its dtype's threshold is refused unless --allow-inexact. The layer rows compare the "
    "probabilities (the materialised plan); the row kernel plan compares what the kernel plan computes instead (key "
    "sums, sums of p log p) with the same eager maps, or says it was refused or not used."
)


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
        f"Task effects ({where}): {what}, per checkpoint; mean over examples with 95% bootstrap CI (accuracy: Wilson score interval; its paired Δ: Newcombe's score interval with the examples that changed); Δ = paired "
        f"difference to {base} (for KL, KL({base} ‖ checkpoint) itself) with its paired bootstrap CI; p from "
        "McNemar's exact test (accuracy) or a sign-flip test (NLL, KL), q Benjamini-Hochberg across the table. "
        "KL is never negative, so its test only says it is not exactly 0 (two attention paths that agree to float "
        "rounding give KL ~1e-7 and a small q): read its size. Per-example values: effects.parquet."
    )


def effects_title(result: Comparison) -> str:
    """The task-effects table's title: what it measures (at the answer token, or over a text)."""
    where = str(result.effects["stack"].iloc[0]) if len(result.effects) else "answer token"
    return EFFECTS_TITLES["answer token" if where == "answer token" else "text"]


def effects_grid(result: Comparison) -> pd.DataFrame:
    """The task-effects table as a metric x checkpoint grid of formatted cells (empty when none was measured)."""
    if result.effects.empty:
        return pd.DataFrame()
    return headline_grid(result.effects, result.checkpoints)


def checkpoint_line(facts: dict, checkpoints: list[str]) -> str:
    """``Checkpoints: base (the paired baseline); instance; ko = instance+knockout:...`` (a name's full spec)."""
    specs = facts.get("checkpoint_specs") or {}
    named = [f"{c} = {specs[c]}" if specs.get(c, c) != c else c for c in checkpoints]
    return f"Checkpoints: {named[0]} (the paired baseline); " + "; ".join(named[1:]) + "."


def comparison_document(
    result: Comparison, rendered: list[tuple[str, str, bytes]], view: Markup | None = None
) -> tuple[Document, list[str]]:
    """The report of a comparison (:class:`~anchorlens.reports.html.Document`) and summary.md's lines, in the same
    order: summary, headline table, task effects, evidence, figures, run details (certificate, facts)."""
    base = result.checkpoints[0]
    grid = headline_grid(result.headline, result.checkpoints, present_roles(result.means))
    effects = effects_grid(result)
    evidence = evidence_grid(result.evidence, result.checkpoints)
    exact = exactness_grid(result.facts.get("exactness"), result.checkpoints)
    fixed = fixed_notes(result.headline)
    n, layers, heads = sample_sizes(result.means, int(result.facts.get("examples", 0) or 0))
    lead = [
        f"Task {result.facts['task']}, {result.facts['examples']} examples from {result.facts['source']}, "
        f"{base_sentence(result.facts)}.",
        checkpoint_line(result.facts, result.checkpoints),
        *(line for line in adapter_lines(result.facts) if line),
    ]
    warnings = [line for line in other_base_warnings(result.facts) if line]
    tables = [
        Table(
            "headline",
            HEADLINE_TITLE,
            grid_html(grid),
            f"Mean over n = {n} examples (each example averaged over {layers} layers and {heads} heads) with 95% "
            f"bootstrap CI; Δ = paired difference to {base} with Benjamini-Hochberg q. {DECOMPOSITION_NOTE}",
            (*fixed, rounding_note(result.facts.get("dtype"))),
        )
    ]
    if not effects.empty:
        tables.append(Table("effects", effects_title(result), grid_html(effects), effects_note(result)))
    pairs = pairs_grid(comparison_pairs(result))
    if not pairs.empty:
        tables.append(Table("pairs", PAIRS_TITLE, grid_html(pairs), PAIRS_NOTE))
    if not evidence.empty:
        tables.append(
            Table(
                "evidence", EVIDENCE_TITLE, grid_html(evidence), EVIDENCE_NOTE, tuple(includes_notes(result.evidence))
            )
        )
    details = []
    if not exact.empty:
        details.append(
            Table("exactness", EXACTNESS_TITLE, grid_html(exact), EXACTNESS_NOTE, tuple(exactness_lines(result.facts)))
        )
    sentences = summary_sentences(
        checkpoints=result.checkpoints,
        headline=result.headline,
        grid=grid,
        effects=effects,
        evidence=evidence,
        exactness=result.facts.get("exactness"),
        fixed=len(fixed),
        figures=[stem for stem, _, _ in rendered],
        sizes=f"n = {n} examples",
    )
    facts = {k: v for k, v in result.facts.items() if k != "exactness"}  # the certificate is its own table
    facts["checkpoints"] = ", ".join(result.checkpoints)
    if isinstance(facts.get("seconds"), dict):
        facts["seconds"] = ", ".join(f"{k.replace('_', ' ')} {v:,.1f} s" for k, v in facts["seconds"].items())
    title = f"anchorlens compare: {' vs '.join(result.checkpoints)}"
    doc = Document(
        title,
        lead=lead,
        warnings=warnings,
        summary=sentences,
        tables=tables,
        figures=[Plot(stem, caption, png) for stem, caption, png in rendered],
        details=details,
        facts=facts,
        view=view,
        view_note=(
            f"Attention maps of example {result.facts.get('map_example', 0)} (n = 1 example; the figures above "
            "average over examples), every checkpoint, every layer and head: pick or combine heads in the layer × "
            "head grid, hover a token to see its attention in and out, colour the text by attention from or to a "
            "token or role, and compare two checkpoints on the tokens they share. Runs offline (inline script)."
        ),
    )
    grids = [grid, *(g for g in (effects, pairs, evidence) if not g.empty)]
    return doc, summary_markdown(doc, grids, [exact] if details else [])


SECTIONS = {
    "headline": "Headline",
    "effects": "Task effects",
    "pairs": "Accuracy, every pair",
    "evidence": "Evidence beyond attention weights",
}
PAIRS_TITLE = "Accuracy of every checkpoint against every other"
PAIRS_NOTE = (
    "Each pair on the examples both scored: accuracies with 95% Wilson intervals, Δ = row's second minus first "
    "with Newcombe's paired 95% interval, the examples only one side got right, McNemar's exact test and "
    "Benjamini-Hochberg q over the pairs (none where no example changed)."
)


def comparison_pairs(result: Comparison) -> pd.DataFrame:
    """:func:`~anchorlens.analyses.accuracy_pairs.accuracy_pairs` of a run with three or more checkpoints and
    labelled examples (with two, the task-effects table already pairs them); empty otherwise."""
    if len(result.checkpoints) < 3 or result.effect_rows.empty:
        return pd.DataFrame()
    return accuracy_pairs(result.effect_rows, result.checkpoints)


def pairs_grid(pairs: pd.DataFrame) -> pd.DataFrame:
    """The pairs as formatted cells, one row ``b vs a`` per pair."""
    if pairs.empty:
        return pd.DataFrame()
    rows = {}
    for r in pairs.itertuples():
        changed = r.only_a_right + r.only_b_right
        rows[f"{r.b} vs {r.a}"] = {
            "n": f"{r.n}",
            "accuracy (first)": f"{r.accuracy_a:.3f} [{r.a_lo:.3f}, {r.a_hi:.3f}]",
            "accuracy (second)": f"{r.accuracy_b:.3f} [{r.b_lo:.3f}, {r.b_hi:.3f}]",
            "Δ [95% CI]": ("Δ 0 " if not changed else f"{r.diff:+.3f} ") + f"[{r.diff_lo:+.3f}, {r.diff_hi:+.3f}]",
            "right only with second / first": f"{r.only_b_right} / {r.only_a_right}",
            "q": "—" if not changed else f"{r.q_value:.2g}",
        }
    return pd.DataFrame.from_dict(rows, orient="index")


def interactive_view(result: Comparison) -> Markup | None:
    """The interactive attention view of the run's map example, every checkpoint (None without maps)."""
    if not result.maps:
        return None
    example = result.facts.get("map_example", 0)
    return Markup(attention_view_html(result.maps, title=f"example {example}, every checkpoint"))


def summary_markdown(doc: Document, grids: list[pd.DataFrame], details: list[pd.DataFrame]) -> list[str]:
    """summary.md's lines in the report's order and numbering: the summary, a section per table (``## Task
    effects``) with its numbered title, the figures as links to figures/STEM.png, the run details."""
    names = numbering(doc)
    md = [f"# {doc.title}", "", *(f"{line}\n" for line in [*doc.lead, *doc.warnings])]
    md += ["## Summary", ""]
    for s in doc.summary:
        cited = [text for _, text in citations(s.refs, names)]
        md.append(f"- {s.text}" + (f" ({', '.join(cited)})" if cited else ""))
    md.append("")
    for i, (table, grid) in enumerate(zip(doc.tables, grids), 1):
        md += [f"## {SECTIONS.get(table.key, table.title)}", "", f"**Table {i}: {table.title}.** {table.note}", ""]
        index = "pair" if table.key == "pairs" else "metric"
        md += [to_markdown(grid, index), "", *(f"- {line}" for line in table.after), *([""] if table.after else [])]
    if doc.figures:
        md += ["## Figures", ""]
        md += [
            f"- Figure {i}: {f.caption} ([figures/{f.key}.png](figures/{f.key}.png))"
            for i, f in enumerate(doc.figures, 1)
        ]
        md.append("")
    if doc.details:
        md += ["## Run details", ""]
        for i, (table, grid) in enumerate(zip(doc.details, details), len(doc.tables) + 1):
            md += [f"**Table {i}: {table.title}.** {table.note}", "", to_markdown(grid, "layer"), ""]
            md += [*(f"- {line}" for line in table.after), *([""] if table.after else [])]
    return md


def write_comparison(
    result: Comparison,
    out: str | Path | OutClaim,
    force: bool = False,
    *,
    figures: bool = True,
    size: str | None = None,
) -> Path:
    """Write every artifact atomically into ``out`` (a path, or the claim the command took before computing).

    ``size``: the figures' preset (``screen``, ``column``, ``page``; default the current
    :func:`~anchorlens.figures.figure_size`), recorded in the manifest and facts.json.
    """
    with claimed(out, kind="compare", force=force) as claim, claim.atomic() as tmp:
        if result.metrics_file is not None:  # on disk (streamed by compare, or read back): copied, never loaded
            shutil.copyfile(result.metrics_file, tmp / result.metrics_file.name)
        else:
            write_metrics(result.metrics, tmp / "metrics")
        result.headline.to_csv(tmp / "headline.csv", index=False)
        result.paired.to_csv(tmp / "paired.csv", index=False)
        if not result.effects.empty:
            result.effects.to_csv(tmp / "task_effects.csv", index=False)
            write_metrics(result.effect_rows, tmp / "effects")
            pairs = comparison_pairs(result)
            if not pairs.empty:
                pairs.to_csv(tmp / "accuracy_pairs.csv", index=False)
        if not result.evidence.empty:
            result.evidence.to_csv(tmp / "evidence.csv", index=False)
        save_maps(result.maps, tmp / "maps")
        if result.mean_maps:
            save_mean_maps(result.mean_maps, tmp / "mean_maps")
        preset = size_preset(size) if size is not None else size_preset()
        rendered = write_figures(result, tmp / "figures", size=preset.name) if figures else []
        drawn = {"figure_size": preset.name} if figures else {}
        doc, md = comparison_document(result, rendered, interactive_view(result))
        doc.facts = {**doc.facts, **drawn}
        (tmp / "summary.md").write_text("\n".join(md))
        (tmp / "report.html").write_text(render_document(doc))
        write_json(tmp / "facts.json", {**result.facts, **drawn, "checkpoints": result.checkpoints})
        digest = (
            examples_digest(result.inputs.examples) if result.inputs is not None else result.facts.get("data_digest")
        )
        write_manifest(
            tmp, "compare", **result.facts, **drawn, checkpoints=", ".join(result.checkpoints), data_digest=digest
        )
    return claim.path


def write_figures(result: Comparison, folder: Path, size: str | None = None) -> list[tuple[str, str, bytes]]:
    """Save every comparison figure into ``folder`` (the formats of :func:`~anchorlens.figures.save_figure`) at
    the preset ``size`` (default the current one); returns (stem, caption, png bytes) triples."""
    folder.mkdir(parents=True, exist_ok=True)
    rendered = []
    with figure_size(size or current_figure_size()):
        for stem, caption, fig in comparison_figures(result):
            save_figure(fig, folder / stem, overwrite=True)
            rendered.append((stem, caption, figure_to_png_bytes(fig)))
    return rendered


def redraw_figures(
    run_dir: str | Path,
    out: str | Path | OutClaim | None = None,
    force: bool = False,
    *,
    size: str | None = None,
) -> tuple[Path, int]:
    """``anchorlens figures``: redraw a compare run's figures into ``out`` (default RUN_DIR/figures) atomically, at
    the preset ``size`` (default the current one).

    Returns (folder, number of figures). The folder records a manifest (with the size); a kill leaves no half folder.
    """
    target = Path(run_dir) / "figures" if out is None else out
    preset = size_preset(size) if size is not None else size_preset()
    with claimed(target, kind="figures", force=force) as claim:
        result = load_comparison(run_dir)
        with claim.atomic() as tmp:
            rendered = write_figures(result, tmp, size=preset.name)
            write_manifest(
                tmp,
                "figures",
                source=str(Path(run_dir).absolute()),
                figures=len(rendered),
                figure_size=preset.name,
            )
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
    mean_maps = (
        _read_part(run / "mean_maps.json", lambda: load_mean_maps(run / "mean_maps"))
        if (run / "mean_maps.json").exists()
        else {}
    )
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
        mean_maps=mean_maps,
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
