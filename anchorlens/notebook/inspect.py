"""``anchorlens.inspect``: one input through one model, shown inline in Jupyter."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import pandas as pd
from matplotlib.figure import Figure

from anchorlens.analyses import average_heads, metrics_frame
from anchorlens.capture.collect import collect_maps, encode_batches, stream_statistics
from anchorlens.capture.maps import AttentionMaps
from anchorlens.capture.selection import Selection
from anchorlens.errors import UsageError
from anchorlens.figures import attention_map_figure
from anchorlens.roles.templates import RAW_TEMPLATE, Template
from anchorlens.tasks import TASKS, get_task
from anchorlens.workflows.models import load_model
from anchorlens.analyses import default_reducers
from anchorlens.workflows.statistics import anchors_of


def _template_for(example: Mapping, task: str | None) -> Template:
    """The task's template, or the first task whose fields the example has."""
    if task is not None:
        return get_task(task).template
    for spec in TASKS.values():
        if all(f in example for f in spec.fields):
            return spec.template
    raise UsageError(f"no task template has the fields {sorted(example)}; pass task=... or a plain string")


@dataclass
class Inspection:
    """Maps and metrics of one input; renders inline in Jupyter (offline canvas widget)."""

    model: object
    example: dict
    template: Template
    maps: AttentionMaps
    selection: Selection

    def plot(self, layer: int | str | None = "mean", head: int | str | None = "mean", stack: str | None = None) -> Figure:
        """Paper-style heatmap of one layer/head (or their means)."""
        return attention_map_figure({"": self.maps}, stack=stack, layer=layer, head=head)

    def metrics(self, per_head: bool = False) -> pd.DataFrame:
        """Tidy metric rows (anchor mass, structural attention, entropy, role flow...) of this input."""
        reducers = default_reducers()
        batches = encode_batches(self.model, [self.example], self.template, batch_size=1)
        stream_statistics(self.model, batches, reducers, self.selection)
        df = metrics_frame(reducers, anchors=anchors_of(self.model))
        return df if per_head else average_heads(df)

    def _repr_html_(self) -> str:
        from anchorlens.notebook.widget import widget_html

        stack = self.maps.default_stack
        return widget_html(self.maps[stack], title=f"{stack} attention · template {self.template.name}")


def inspect(
    model_or_spec,
    text_or_example: str | Mapping,
    *,
    task: str | None = None,
    base: str = "smollm2-135m",
    layers: tuple[int, ...] | None = None,
    heads: tuple[int, ...] | None = None,
) -> Inspection:
    """Capture full maps of one input (a string, or a task example dict) through a model or spec."""
    model = load_model(model_or_spec, base) if isinstance(model_or_spec, str) else model_or_spec
    if isinstance(text_or_example, str):
        example, template = {"text": text_or_example}, RAW_TEMPLATE if task is None else get_task(task).template
    else:
        example, template = dict(text_or_example), _template_for(text_or_example, task)
    selection = Selection(layers=layers, heads=heads)
    batches = encode_batches(model, [example], template, batch_size=1)
    maps = collect_maps(model, batches, selection, max_examples=1)[0]
    return Inspection(model, example, template, maps, selection)
