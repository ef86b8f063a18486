"""Sweep where the capsule / instance token sits (first, after_structural, middle, last, index)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from anchorlens.analyses.evidence import evidence_record, parse_evidence
from anchorlens.analyses.evidence_table import TABLE_COLUMNS, evidence_table
from anchorlens.analyses.headline import anchor_metrics
from anchorlens.analyses.stats import summarize
from anchorlens.capture.certificate import CertifyOptions
from anchorlens.capture.run import check_selection
from anchorlens.capture.selection import Selection
from anchorlens.errors import UsageError
from anchorlens.methods.spec import load_guided
from anchorlens.models.loading import load_base
from anchorlens.roles.kinds import Role
from anchorlens.tasks.prompts import PromptOptions
from anchorlens.workflows.compare import validate_positions
from anchorlens.workflows.inputs import Inputs, resolve_inputs
from anchorlens.workflows.statistics import capture_statistics, certify_capture, model_reducers

MOVABLE = (Role.CAPSULE, Role.INSTANCE)


@dataclass
class PositionSweep:
    """Per-position metric rows (``position`` column) of one checkpoint spec."""

    spec: str
    positions: list[str]
    anchor: str
    metrics: pd.DataFrame
    summary: pd.DataFrame
    inputs: Inputs
    facts: dict
    evidence: pd.DataFrame = field(default_factory=pd.DataFrame)  # evidence.csv with a position column; empty: off


def parse_positions(text: str | Sequence[str]) -> list[str]:
    """``"first,middle,last,3"`` -> list of position names; UsageError on unknown names."""
    from anchorlens.methods.positions import Position

    items = [p.strip() for p in (text.split(",") if isinstance(text, str) else text) if str(p).strip()]
    if not items:
        raise UsageError("--positions is empty; use e.g. first,middle,last")
    for item in items:
        Position.parse(item)  # raises UsageError naming the valid positions
    return items


def _move(model, position: str) -> str:
    """Set the position of the model's capsule/instance guidances; returns the anchor role label."""
    from anchorlens.methods.positions import Position

    moved = [g for g in model.guidance_list() if Role(g.role) in MOVABLE]
    if not moved:
        raise UsageError(
            "this checkpoint has no capsule or instance token to move; try --ckpt instance or --ckpt capsule"
        )
    for g in moved:
        g.position = Position.parse(position)
    return Role(moved[0].role).label


def sweep_positions(
    spec: str,
    positions: Sequence[str],
    *,
    base: str = "smollm2-135m",
    task: str = "rte",
    data: str | Path | None = None,
    n: int | None = None,
    selection: Selection = Selection(),
    batch_size: int = 8,
    dtype: str | None = None,
    device: str | None = None,
    allow_other_base: bool = False,
    field_map: Any = None,
    prompt: PromptOptions | None = None,
    certificate: CertifyOptions = CertifyOptions(),
    evidence: str | Sequence[str] | Mapping[str, Mapping] | None = None,
) -> PositionSweep:
    """Capture the same inputs with the anchor at each position; summary = anchor mass per position.

    Each position's capture is certified against eager on the first examples (``facts["exactness"]``).
    ``evidence``: opt-in evidence reducers (as ``compare`` takes them); their rows go to the metrics and
    ``PositionSweep.evidence`` gives the evidence table per position (the anchor's mass by weight and by norm,
    sink rates, massive activations)."""
    extra = parse_evidence(evidence)
    positions = parse_positions(positions)
    inputs = resolve_inputs(task, data, n, field_map=field_map, prompt=prompt)
    model = load_guided(spec, load_base(base, dtype=dtype, device=device), allow_other_base=allow_other_base)
    check_selection(model, selection)
    prompts = inputs.prompts(model.base.tokenizer)
    rows = prompts.examples(inputs.examples)
    anchor = ""
    for position in positions:
        anchor = _move(model, position)
        validate_positions(model, rows, prompts, batch_size)
    frames, tables, exactness = [], [], {}
    for position in positions:
        _move(model, position)
        exactness[position] = certify_capture(
            model,
            rows,
            prompts,
            selection=selection,
            options=certificate,
            label=f"{spec} at {position}",
            evidence=extra,
        )
        # the anchor's derived rows come from capture_statistics itself (adding them again duplicated them)
        df = capture_statistics(
            model, inputs, selection=selection, batch_size=batch_size, anchors=("first_token", anchor), evidence=extra
        ).assign(position=position, checkpoint=spec)
        frames.append(df)
        if extra:
            tables.append(evidence_table(df, {spec: [anchor]}).assign(position=position))
    metrics = pd.concat(frames, ignore_index=True)
    table = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    table = table[["position", *TABLE_COLUMNS]] if len(table) else table
    summary = position_summary(metrics, anchor)
    facts = {
        "spec": spec,
        "base": base,
        "base_provenance": model.base.provenance(),
        "task": inputs.task.name,
        "source": inputs.source,
        "examples": len(rows),
        "roles": prompts.roles.to_json(),
        **inputs.facts(prompts),
        "anchor_role": anchor,
        "positions": positions,
        **({"exactness": exactness} if certificate.enabled else {}),
        **({"evidence": evidence_record(model_reducers(model, prompts.roles, extra))} if extra else {}),
    }
    return PositionSweep(spec, positions, anchor, metrics, summary, inputs, facts, evidence=table)


def position_summary(metrics: pd.DataFrame, anchor: str) -> pd.DataFrame:
    """Per position and anchor headline metric (:func:`anchor_metrics`): mean over examples (each
    averaged over layers and heads) with bootstrap CI; a position where the mask fixes the metric
    gets NaN numbers and the reason in ``fixed``."""
    parts = []
    for m in anchor_metrics(anchor):
        rows = m.rows(metrics)
        for position, sub in rows.groupby("position", sort=False):
            finite = sub[sub["value"].notna()]
            if finite.empty:
                reasons = sub["fixed"] if "fixed" in sub.columns else pd.Series([""])
                s = pd.DataFrame(
                    {
                        "position": [position],
                        "mean": [float("nan")],
                        "ci_lo": [float("nan")],
                        "ci_hi": [float("nan")],
                        "n": [0],
                        "fixed": [str(reasons.iloc[0])],
                    }
                )
            else:
                per_example = finite.groupby(["position", "example"], sort=False)["value"].mean().reset_index()
                s = summarize(per_example, by=["position"]).assign(fixed="")
            parts.append(s.assign(metric=m.metric, query_role=m.query_role, key_role=m.key_role, label=m.label))
    cols = ["position", "metric", "query_role", "key_role", "label", "mean", "ci_lo", "ci_hi", "n", "fixed"]
    return pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)
