"""Compare checkpoints on the same examples: metrics, paired differences, headline table, maps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from anchorlens.analyses import average_heads, compare_frames, headline_table
from anchorlens.analyses.frames import concat_frames
from anchorlens.analyses.headline import HEADLINE, anchor_metrics
from anchorlens.capture.collect import PromptRenderer, collect_maps, encode_batches
from anchorlens.capture.maps import AttentionMaps
from anchorlens.capture.run import check_selection
from anchorlens.capture.selection import Selection
from anchorlens.errors import UsageError
from anchorlens.evaluation.effects import effects_table, example_effects
from anchorlens.methods.spec import load_guided
from anchorlens.models.loading import load_base
from anchorlens.tasks.prompts import PromptOptions
from anchorlens.workflows.inputs import Inputs, resolve_inputs
from anchorlens.workflows.statistics import capture_statistics

# metrics compared per layer and head (paired.csv); the headline rows come from analyses.headline
PAIRED_METRICS = ("decomposition", "guidance_absorption", "entropy", "island_score", "anchor_mass", "anchor_structural")


@dataclass
class Comparison:
    """Everything ``compare`` measured; reports and figures are built from it."""

    checkpoints: list[str]
    inputs: Inputs | None  # None for a comparison read back from its run directory
    metrics: pd.DataFrame
    headline: pd.DataFrame
    paired: pd.DataFrame
    maps: dict[str, AttentionMaps]
    facts: dict = field(default_factory=dict)
    effects: pd.DataFrame = field(default_factory=pd.DataFrame)  # task effects table (see effects_table)
    effect_rows: pd.DataFrame = field(default_factory=pd.DataFrame)  # per example: checkpoint, example, metric, value


def checkpoint_names(specs: Sequence[str]) -> list[str]:
    """Short unique display names: the shortest path suffix that tells directories apart, else the spec."""
    parts = [Path(s).expanduser().resolve().parts if Path(s).expanduser().is_dir() else (s,) for s in specs]
    depth = [1] * len(specs)
    while True:
        names = ["/".join(p[-d:]) for p, d in zip(parts, depth)]
        clashes = {n for n in names if names.count(n) > 1}
        grow = [i for i, n in enumerate(names) if n in clashes and depth[i] < len(parts[i])]
        if not grow:
            break
        for i in grow:
            depth[i] += 1
    out: list[str] = []
    for name in names:  # identical specs given twice
        unique, k = name, 2
        while unique in out:
            unique, k = f"{name}#{k}", k + 1
        out.append(unique)
    return out


def compare(
    ckpts: Sequence[str],
    *,
    base: str = "smollm2-135m",
    task: str = "rte",
    data: str | Path | None = None,
    n: int | None = None,
    selection: Selection = Selection(),
    batch_size: int = 8,
    map_example: int = 0,
    dtype: str | None = None,
    device: str | None = None,
    progress: bool = False,
    n_boot: int = 2000,
    allow_other_base: bool = False,
    field_map: Any = None,
    prompt: PromptOptions | None = None,
    max_length: int | None = None,
) -> Comparison:
    """Measure every checkpoint on the same inputs and one base; the first checkpoint is the paired baseline.

    ``allow_other_base``: load checkpoints trained on another base anyway (recorded in ``facts["other_base"]``);
    ``field_map``/``prompt``: column renames and prompt options (chat, system prompt, few-shot) of the inputs;
    ``max_length``: a text task's window (and every input's truncation).
    """
    if len(ckpts) < 2:
        raise UsageError("compare needs at least two --ckpt (e.g. --ckpt base --ckpt instance)")
    inputs = resolve_inputs(task, data, n, field_map=field_map, prompt=prompt)
    shared = load_base(base, dtype=dtype, device=device)
    prompts = inputs.prompts(shared.tokenizer, max_length)
    rows = prompts.examples(inputs.examples)
    if not 0 <= map_example < len(rows):
        raise UsageError(f"--map-example {map_example} is out of range: {len(rows)} examples")
    models = {
        name: load_guided(spec, shared, allow_other_base=allow_other_base)
        for name, spec in zip(checkpoint_names(ckpts), ckpts)
    }
    for model in models.values():
        check_selection(model, selection)
        model.check_roles(prompts.roles)
        validate_positions(model, rows, prompts, batch_size)
    frames, maps, params = {}, {}, {}
    for name, model in models.items():
        bar = _progress(progress, len(rows), name)
        df = capture_statistics(
            model,
            inputs,
            selection=selection,
            batch_size=batch_size,
            max_length=max_length,
            progress=bar,
            prompts=prompts,
        )
        if bar is not None:
            bar.close()
        frames[name] = df
        one = [rows[map_example]]
        batch = encode_batches(model, one, prompts, batch_size=1, example_ids=[map_example], max_length=max_length)
        maps[name] = collect_maps(model, batch, selection, max_examples=1)[0]
        params[name] = int(getattr(model, "num_trainable", lambda: 0)())
    names = list(models)
    effect_rows = example_effects(models, rows, inputs.task, prompts, batch_size=batch_size, max_length=max_length)
    effects = effects_table(effect_rows, names, labelled=inputs.task.has_labels, n_boot=n_boot)
    metrics = concat_frames([df.assign(checkpoint=name) for name, df in frames.items()])
    anchors = dict.fromkeys(a for name in names for a in models[name].anchors() if a != "first_token")
    headline = headline_table(frames, HEADLINE + tuple(m for a in anchors for m in anchor_metrics(a)), n_boot=n_boot)
    paired = _paired(frames, names[0], n_boot)
    facts = {
        "base": base,
        "base_fingerprint": shared.fingerprint(),
        "base_provenance": shared.provenance(),
        "base_parameters": shared.num_parameters(),
        "trainable_parameters": params,
        "task": inputs.task.name,
        "source": inputs.source,
        "examples": len(rows),
        "map_example": map_example,
        "roles": prompts.roles.to_json(),
        **inputs.facts(),
    }
    other = {name: model.meta["other_base"] for name, model in models.items() if model.meta.get("other_base")}
    if other:
        facts["other_base"] = other
    return Comparison(names, inputs, metrics, headline, paired, maps, facts, effects, effect_rows)


def _paired(frames: dict[str, pd.DataFrame], baseline: str, n_boot: int) -> pd.DataFrame:
    """Per layer/head paired differences vs the baseline for the comparable metrics (BH per checkpoint)."""
    keep = {name: df[df["metric"].isin(PAIRED_METRICS)] for name, df in frames.items()}
    per_head = compare_frames(keep, baseline, n_boot=n_boot, n_perm=2000, family=["checkpoint", "metric"])
    means = {name: average_heads(df) for name, df in keep.items()}
    layer_mean = compare_frames(means, baseline, n_boot=n_boot, n_perm=2000, family=["checkpoint", "metric"])
    return pd.concat([per_head, layer_mean], ignore_index=True)


def validate_positions(model, rows: Sequence[dict], prompts: PromptRenderer, batch_size: int) -> None:
    """Plan every batch's inserted positions before any capture, so bad positions fail in seconds."""
    if not hasattr(model, "plan"):
        return
    for batch in encode_batches(model, rows, prompts, batch_size=batch_size):
        model.plan(batch)


def _progress(enabled: bool, total: int, name: str):
    """A tqdm bar on stderr, or None."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"capture {name}", unit="ex", leave=False, disable=None)  # None: off when not a TTY
