"""Metric reducers, tidy metric frames, statistics and checkpoint comparison.

Importing this package registers the reducers ``role_flow``, ``first_token``, ``entropy``, ``decomposition``,
``learned_sink``, ``sink_battery``, ``massive_activations`` and ``value_mass`` with :func:`anchorlens.analyses.registry.make_reducer`.
"""

from __future__ import annotations

from anchorlens.analyses.base import SiteReducer
from anchorlens.analyses.compare import compare_frames, headline_rows, headline_table
from anchorlens.analyses.decomposition import SINK, DecompositionReducer, parts_of
from anchorlens.analyses.defaults import DEFAULT_REDUCERS, EVIDENCE_REDUCERS, default_reducers
from anchorlens.analyses.entropy import EntropyReducer, normalized_entropy
from anchorlens.analyses.first_token import FirstTokenReducer
from anchorlens.analyses.frames import (
    ALL,
    COLUMNS,
    NO_ROLE,
    ROW_KEYS,
    SITE_KEYS,
    average_heads,
    concat_frames,
    conform,
    empty_frame,
    roles_label,
)
from anchorlens.analyses.headline import HEADLINE, HeadlineMetric, anchor_metrics, headline_metric
from anchorlens.analyses.learned_sink import LearnedSinkReducer
from anchorlens.analyses.massive import MassiveActivationsReducer
from anchorlens.analyses.metrics import (
    FIRST_TOKEN,
    MASK_REASON,
    anchor_mass,
    anchor_structural,
    derived_metrics,
    flow_mass,
    guidance_absorption,
    island_score,
    mark_fixed,
    metrics_frame,
    metrics_rows,
    pooled_entropy,
    special_attention,
    structural_attention,
)
from anchorlens.analyses.role_flow import RoleFlowReducer
from anchorlens.analyses.shared import anchor_key_index, role_onehot, sink_index
from anchorlens.analyses.sink_battery import SinkBatteryReducer, sink_rates
from anchorlens.analyses.stats import (
    benjamini_hochberg,
    bootstrap_ci,
    paired_array_stats,
    paired_differences,
    paired_summary,
    sign_flip_test,
    summarize,
)
from anchorlens.analyses.table import SiteTable
from anchorlens.analyses.value_mass import ValueMassReducer

__all__ = [
    "DEFAULT_REDUCERS",
    "EVIDENCE_REDUCERS",
    "LearnedSinkReducer",
    "DecompositionReducer",
    "MASK_REASON",
    "SINK",
    "guidance_absorption",
    "mark_fixed",
    "pooled_entropy",
    "sink_index",
    "default_reducers",
    "ALL",
    "COLUMNS",
    "EntropyReducer",
    "FIRST_TOKEN",
    "FirstTokenReducer",
    "HEADLINE",
    "HeadlineMetric",
    "anchor_metrics",
    "headline_metric",
    "paired_array_stats",
    "NO_ROLE",
    "ROW_KEYS",
    "RoleFlowReducer",
    "SITE_KEYS",
    "MassiveActivationsReducer",
    "SiteReducer",
    "SinkBatteryReducer",
    "SiteTable",
    "ValueMassReducer",
    "anchor_key_index",
    "anchor_mass",
    "anchor_structural",
    "average_heads",
    "benjamini_hochberg",
    "bootstrap_ci",
    "compare_frames",
    "concat_frames",
    "conform",
    "derived_metrics",
    "empty_frame",
    "flow_mass",
    "headline_rows",
    "headline_table",
    "island_score",
    "metrics_frame",
    "metrics_rows",
    "normalized_entropy",
    "paired_differences",
    "paired_summary",
    "parts_of",
    "role_onehot",
    "roles_label",
    "sign_flip_test",
    "sink_rates",
    "special_attention",
    "structural_attention",
    "summarize",
]
