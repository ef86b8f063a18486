"""Each checkpoint's attention maps of chosen layers averaged over the run's first examples (the StreamingLLM figure).

:func:`checkpoint_mean_maps` runs the mean-map reducer (:mod:`anchorlens.analyses.mean_maps`) over the first
``max_examples`` inputs of a run for every loaded checkpoint: one capture of the chosen layers only, bounded memory
(layers × positions² per checkpoint). :func:`mean_maps_run` loads the checkpoints as ``compare`` does first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from anchorlens.analyses.mean_maps import MeanMaps, default_layers, mean_attention_maps
from anchorlens.capture.collect import PromptRenderer, encode_batches
from anchorlens.capture.options import CaptureOptions
from anchorlens.capture.run import check_selection
from anchorlens.capture.selection import Selection
from anchorlens.errors import UsageError
from anchorlens.models.loading import load_base
from anchorlens.tasks.prompts import PromptOptions
from anchorlens.workflows.inputs import resolve_inputs
from anchorlens.workflows.multibase import load_models, run_base_spec

MAP_EXAMPLES = 64  # examples averaged by default: the mean of 64 inputs is stable; StreamingLLM averages 256


def checkpoint_mean_maps(
    models: Mapping[str, Any],
    rows: Sequence[Mapping],
    prompts: PromptRenderer,
    *,
    layers: Sequence[int] | None = None,
    max_examples: int = MAP_EXAMPLES,
    max_positions: int | None = None,
    batch_size: int = 8,
    max_length: int | None = None,
    options: CaptureOptions = CaptureOptions(),
) -> dict[str, MeanMaps]:
    """name -> mean maps of ``layers`` (default: the first two, a middle and the last layer of the first model's
    stack) over the first ``max_examples`` of ``rows``, aligned by position (guidance first, then the sink)."""
    if max_examples < 1:
        raise UsageError(f"--map-examples {max_examples} averages nothing: give at least 1")
    if not models:
        return {}
    first = next(iter(models.values()))
    stack = first.adapter.stacks()[0]
    chosen = tuple(layers) if layers is not None else default_layers(first.adapter.num_layers(first.model, stack))
    take = list(range(min(max_examples, len(rows))))
    out = {}
    for name, model in models.items():
        check_selection(model, Selection(stacks=(stack,), layers=chosen))
        batches = encode_batches(
            model, [rows[i] for i in take], prompts, batch_size=batch_size, example_ids=take, max_length=max_length
        )
        out[name] = mean_attention_maps(
            model, batches, chosen, stack=stack, max_positions=max_positions, options=options
        )
    return out


def mean_maps_run(
    ckpts: Sequence[str],
    names: Sequence[str],
    *,
    base: str = "smollm2-135m",
    task: str = "rte",
    data: str | Path | None = None,
    n: int | None = None,
    layers: Sequence[int] | None = None,
    max_examples: int = MAP_EXAMPLES,
    max_positions: int | None = None,
    batch_size: int = 8,
    dtype: str | None = None,
    device: str | None = None,
    allow_other_base: bool = False,
    field_map: Any = None,
    prompt: PromptOptions | None = None,
    max_length: int | None = None,
) -> dict[str, MeanMaps]:
    """Load the checkpoints as ``compare`` does (same inputs, prompts and bases) and average their maps."""
    inputs = resolve_inputs(task, data, n, field_map=field_map, prompt=prompt)
    shared = load_base(run_base_spec(ckpts, base), dtype=dtype, device=device)
    prompts = inputs.prompts(shared.tokenizer, max_length)
    rows = prompts.examples(inputs.examples)
    models, _ = load_models(
        ckpts,
        names,
        shared,
        base,
        prompts=prompts,
        rows=rows,
        max_length=max_length,
        dtype=dtype,
        device=device,
        allow_other_base=allow_other_base,
        batch_size=batch_size,
    )
    return checkpoint_mean_maps(
        models,
        rows,
        prompts,
        layers=layers,
        max_examples=max_examples,
        max_positions=max_positions,
        batch_size=batch_size,
        max_length=max_length,
    )
