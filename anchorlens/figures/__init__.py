"""Figures for anchorlens metrics: attention budget, maps, layer curves, head grids, role flow, sweeps, sinks.

Every function returns a ``matplotlib.figure.Figure`` built without pyplot (no backend switch,
no ``plt.show``); save it with :func:`save_figure` or embed it with :func:`figure_to_png_bytes`.
"""

from __future__ import annotations

from anchorlens.figures._labels import measure_label
from anchorlens.figures._roles import ordered_roles, role_palette
from anchorlens.figures._style import (
    DIFF_CMAP,
    FIGURE_SIZES,
    MAP_CMAP,
    ROLE_COLORS,
    FigureSize,
    clean_token,
    current_figure_size,
    figure_size,
)
from anchorlens.figures.budget import attention_budget
from anchorlens.figures.curves import layer_curves
from anchorlens.figures.heads import head_diff_grid, head_grid, head_grids, head_range
from anchorlens.figures.maps import AveragedStackMaps, anchor_tokens, attention_map_figure, average_maps_aligned
from anchorlens.figures.positions import position_sweep
from anchorlens.figures.roleflow import role_flow_heatmaps
from anchorlens.figures.save import figure_to_png_bytes, save_figure
from anchorlens.figures.sinks import (
    evidence_curves,
    massive_activations_figure,
    sink_alpha_grid,
    sink_rate_curves,
    sink_top_roles,
    value_mass_curves,
)
from anchorlens.figures.streaming import streaming_maps_figure
from anchorlens.figures.sweeps import sweep_curve

__all__ = [
    "AveragedStackMaps",
    "DIFF_CMAP",
    "FIGURE_SIZES",
    "FigureSize",
    "MAP_CMAP",
    "ROLE_COLORS",
    "anchor_tokens",
    "attention_budget",
    "attention_map_figure",
    "average_maps_aligned",
    "clean_token",
    "current_figure_size",
    "evidence_curves",
    "figure_size",
    "figure_to_png_bytes",
    "head_diff_grid",
    "head_grid",
    "head_grids",
    "head_range",
    "layer_curves",
    "massive_activations_figure",
    "measure_label",
    "ordered_roles",
    "position_sweep",
    "role_flow_heatmaps",
    "role_palette",
    "save_figure",
    "sink_alpha_grid",
    "sink_rate_curves",
    "sink_top_roles",
    "streaming_maps_figure",
    "sweep_curve",
    "value_mass_curves",
]
