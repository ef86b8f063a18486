"""Sweeps: training-free instance tokens by count and position; soft-prompt length vs accuracy; knockouts by layer."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from anchorlens.analyses.stats import bootstrap_ci
from anchorlens.errors import UsageError
from anchorlens.evaluation import DEFAULT_MAX_LENGTH, task_metrics
from anchorlens.methods.spec import load_guided
from anchorlens.models.base import Base
from anchorlens.models.loading import load_base
from anchorlens.tasks.prompts import PromptOptions
from anchorlens.workflows.first_pass import first_pass
from anchorlens.workflows.inputs import resolve_inputs
from anchorlens.workflows.train import train

_PLAIN = ("", "base", "none")
EFFECT_WINDOW = 256  # examples length-sorted together into the task effects' batches


def compose(spec: str, k: int, position: str) -> str:
    """``spec`` plus ``k`` instance tokens at ``position`` (k=0: ``spec`` unchanged)."""
    if k == 0:
        return spec
    inst = f"instance:k={k},pos={position}"
    return inst if spec.strip().lower() in _PLAIN else f"{spec}+{inst}"


def _shared_base(base: Base | str | None, spec: str) -> Base | str | None:
    """Load a base once for all sweep points (a checkpoint spec with base None keeps its own)."""
    if isinstance(base, str):
        return load_base(base)
    if base is None:
        return load_guided(spec, None).base
    return base


def sweep_instance(
    spec: str,
    task: str = "rte",
    data: str | Path | None = None,
    k: Sequence[int] = (0, 1, 2, 4),
    positions: Sequence[str] = ("first", "last"),
    *,
    base: Base | str | None = None,
    n: int | None = None,
    batch_size: int = 8,
    max_length: int | None = DEFAULT_MAX_LENGTH,
    anchors: bool = False,
    field_map: Any = None,
    prompt: PromptOptions | None = None,
) -> pd.DataFrame:
    """Accuracy (with 95% CI) per (k, position) of ``spec + instance:k=K,pos=P``; k=0 is ``spec`` alone.

    ``spec`` is naturally a prompt-tuned checkpoint: the paper's Finding II adds training-free
    instance tokens to a prompt-tuned model (``"base"`` measures them on the bare base instead).
    ``anchors`` adds the instance token's anchor metrics (see :func:`instance_anchor_summary`).
    Columns: k, position, spec, accuracy, ci_lo, ci_hi (the seeded percentile bootstrap of
    :func:`anchorlens.analyses.stats.bootstrap_ci` over examples), n[, anchor metrics].

    Note: decoder models are scored at the last input token, so instance tokens inserted at
    ``last`` (after it) cannot influence the score of a causal model.
    """
    inputs = resolve_inputs(task, data, n, need_labels=True, field_map=field_map, prompt=prompt)
    shared = _shared_base(base, spec)
    cache: dict[str, dict] = {}
    rows = []
    for count in k:
        for pos in positions:
            full = compose(spec, int(count), pos)
            if full not in cache:
                model = load_guided(full, shared)
                preds = inputs.predict(model, batch_size=batch_size, max_length=max_length)
                cache[full] = task_metrics(preds, inputs.task)
                labelled = preds[preds["label"].notna()] if "label" in preds else preds.iloc[:0]
                cache[full]["ci"] = bootstrap_ci(labelled["correct"].astype(float).to_numpy())[1:]
                if anchors:
                    cache[full].update(instance_anchor_summary(model, inputs, batch_size))
            m = cache[full]
            rows.append(
                {
                    "k": int(count),
                    "position": pos,
                    "spec": full,
                    "accuracy": m["accuracy"],
                    "ci_lo": m["ci"][0],
                    "ci_hi": m["ci"][1],
                    "n": m["n"],
                    **{key: m.get(key, float("nan")) for key in (_ANCHOR_KEYS if anchors else ())},
                    **({"fixed": m.get("fixed", "")} if anchors else {}),
                }
            )
    return pd.DataFrame(rows)


_ANCHOR_KEYS = ("anchor_mass", "anchor_structural", "sink_mass")


def instance_anchor_summary(model, inputs, batch_size: int = 8) -> dict[str, Any]:
    """Mean over examples, layers and heads of: attention input queries pay to the instance token(s)
    (``anchor_mass``), the instance tokens' own attention to structural tokens (``anchor_structural``),
    and the attention input queries pay to the sink (``sink_mass``, the first input token). Without
    an instance token (k = 0) the two anchor values are NaN. A value the causal mask fixes (e.g. the
    instance token's attention at ``first``) is NaN and its reason
    is in ``fixed`` (``"anchor_structural: fixed by the causal mask: ..."``)."""
    from anchorlens.analyses.headline import SINK_MASS, anchor_metrics
    from anchorlens.workflows.statistics import capture_statistics

    df = capture_statistics(model, inputs, batch_size=batch_size, anchors=("first_token", "instance"))
    out: dict[str, Any] = {}
    fixed = []
    has_instance = any(g.kind == "instance" for g in model.guidances)
    for key, m in zip(_ANCHOR_KEYS, (*anchor_metrics("instance"), SINK_MASS)):
        if key != "sink_mass" and not has_instance:  # k = 0: no anchor, so no anchor mass (not 0.00)
            out[key] = float("nan")
            continue
        rows = m.rows(df)
        finite = rows[rows["value"].notna()]
        out[key] = float(finite.groupby("example")["value"].mean().mean()) if len(finite) else float("nan")
        if len(rows) and finite.empty and "fixed" in rows.columns:
            fixed.append(f"{key}: {rows['fixed'].iloc[0]}")
    out["fixed"] = "; ".join(fixed)
    return out


def sweep_length(
    method: str = "prompt",
    lengths: Sequence[int] = (1, 5, 20, 100),
    task: str = "rte",
    data: str | Path | None = None,
    eval_data: str | Path | None = None,
    *,
    base: Base | str = "smollm2-135m",
    out: str | Path | None = None,
    force: bool = False,
    **train_options: Any,
) -> pd.DataFrame:
    """Train ``method:n=L`` for each length L; eval accuracy, trainable parameters and time per step per length.

    ``out`` (optional) gets one training run dir per length (``n-L``); ``train_options`` go to ``train``.
    """
    shared = load_base(base) if isinstance(base, str) else base
    rows = []
    for length in lengths:
        spec = f"{method}:n={int(length)}"
        run_out = None if out is None else Path(out) / f"n-{int(length)}"
        run = train(spec, task, data, eval_data, base=shared, out=run_out, force=force, **train_options)
        rows.append(
            {
                "length": int(length),
                "spec": spec,
                "accuracy": run.metrics.get("accuracy"),
                "best_eval_accuracy": run.summary["best_eval_accuracy"],
                "num_trainable": run.summary["num_trainable"],
                "time_per_step_s": run.summary["time_per_step_s"],
                "steps": run.summary["steps"],
            }
        )
    return pd.DataFrame(rows)


def knockout_spec(spec: str, keys: str, first: int, last: int, mode: str = "renorm") -> str:
    """``spec`` with its ``keys`` knocked out at layers ``first..last`` (``base`` alone gives the knockout alone)."""
    knockout = f"knockout:keys={keys},layers={first}-{last},mode={mode}"
    return knockout if spec.strip().lower() in _PLAIN else f"{spec}+{knockout}"


def sweep_knockout(
    spec: str,
    keys: str = "instance",
    task: str = "rte",
    data: str | Path | None = None,
    *,
    window: int = 1,
    mode: str = "renorm",
    base: Base | str | None = None,
    n: int | None = None,
    batch_size: int = 8,
    max_length: int | None = DEFAULT_MAX_LENGTH,
    n_boot: int = 2000,
    field_map: Any = None,
    prompt: PromptOptions | None = None,
) -> pd.DataFrame:
    """Knock ``keys`` out of ``spec`` one window of ``window`` layers at a time; the paired task effects per window.

    One row per window: layer (its first layer), layers (``first-last``), spec, and from
    :func:`~anchorlens.evaluation.effects.effects_table` against ``spec`` itself on the same examples: ``d_nll``
    (ΔNLL) and ``d_accuracy`` (Δaccuracy, labelled tasks) with their paired bootstrap CIs (``*_lo``, ``*_hi``) and
    q-values (Benjamini-Hochberg across the whole sweep), ``kl`` (KL(spec ‖ knocked out) with CI), n; with
    ``mode=mean``, ``mean_norm`` (the norm of the first pass's mean that replaced the keys, averaged over the window's
    layers; each window makes its own first pass over the examples).
    """
    from anchorlens.evaluation.effects import effects_table, example_effects

    if window < 1:
        raise UsageError(f"--window must be at least 1, got {window}")
    inputs = resolve_inputs(task, data, n, field_map=field_map, prompt=prompt)
    shared = _shared_base(base, spec)
    reference = load_guided(spec, shared)
    depth = reference.num_layers
    specs = {
        knockout_spec(spec, keys, first, min(first + window, depth) - 1, mode): (first, min(first + window, depth) - 1)
        for first in range(0, depth, window)
    }
    models = {spec: reference, **{s: load_guided(s, reference.base) for s in specs}}
    prompts = inputs.prompts(reference.tokenizer, max_length)
    for model in models.values():
        model.check_roles(prompts.roles)
    rows = prompts.examples(inputs.examples)
    passes = {s: first_pass(m, rows, prompts, batch_size=batch_size, max_length=max_length) for s, m in models.items()}
    per_example = example_effects(
        models, rows, inputs.task, prompts, batch_size=batch_size, max_length=max_length, window=EFFECT_WINDOW
    )
    table = effects_table(per_example, list(models), labelled=inputs.task.has_labels, n_boot=n_boot)
    out = []
    for s, (first, last) in specs.items():
        mine = table[table["checkpoint"] == s].set_index("metric")
        row: dict[str, Any] = {"layer": first, "layers": f"{first}-{last}", "spec": s}
        if passes[s]:  # mode=mean: the size of the mean that replaced the keys, averaged over the window's layers
            norms = [v for record in passes[s] for v in record["mean_norm"].values()]
            row["mean_norm"] = sum(norms) / len(norms)
        for metric, name in (("nll", "d_nll"), ("correct", "d_accuracy")):
            if metric in mine.index:
                r = mine.loc[metric]
                row.update(
                    {name: r["diff"], f"{name}_lo": r["diff_lo"], f"{name}_hi": r["diff_hi"], f"{name}_q": r["q_value"]}
                )
        if "kl" in mine.index:
            r = mine.loc["kl"]
            row.update({"kl": r["mean"], "kl_lo": r["ci_lo"], "kl_hi": r["ci_hi"], "n": int(r["n"])})
        out.append(row)
    return pd.DataFrame(out)
