"""Each checkpoint's attention maps of chosen layers averaged over the run's first examples (the StreamingLLM figure).

:func:`checkpoint_mean_maps` runs the mean-map reducer (:mod:`anchorlens.analyses.mean_maps`) over the first
``max_examples`` inputs of a run for every loaded checkpoint: one capture of the chosen layers only, bounded memory
(layers × positions² per checkpoint)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from anchorlens.analyses.mean_maps import MeanMaps, default_layers, mean_attention_maps
from anchorlens.capture.collect import PromptRenderer, encode_batches
from anchorlens.capture.options import CaptureOptions
from anchorlens.capture.run import check_selection
from anchorlens.capture.selection import Selection
from anchorlens.errors import UsageError

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
    depth = int(first.adapter.num_layers(first.model, stack))
    chosen = (
        tuple(dict.fromkeys(layer + depth if layer < 0 else layer for layer in layers))  # -1: the last layer
        if layers is not None
        else default_layers(depth)
    )
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
