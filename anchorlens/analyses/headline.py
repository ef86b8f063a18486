"""The headline metrics, named once: which frame rows each headline number is read from.

Every workflow, report and figure that shows a headline number takes its rows from a
:class:`HeadlineMetric` here (demo, compare, reports, sweeps, positions), so no other module spells
out role labels for headline rows. The headline is the sink-aware decomposition of the attention
of INPUT queries (special + structural + content; guidance queries excluded), the guidance
absorption, the entropy of input queries, and the guidance-only metrics reported separately.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from anchorlens.analyses.decomposition import SINK
from anchorlens.analyses.derived import FIELD_FLOW
from anchorlens.analyses.frames import GUIDANCE, INPUT, NO_ROLE
from anchorlens.roles.table import field_group


@dataclass(frozen=True)
class HeadlineMetric:
    """A named reference to the rows (metric, query_role, key_role) of one headline number."""

    name: str
    metric: str
    query_role: str
    key_role: str
    label: str
    description: str

    def rows(self, df: pd.DataFrame) -> pd.DataFrame:
        """This metric's rows of a tidy frame (every head, layer, example; fixed rows included)."""
        return df[
            (df["metric"] == self.metric) & (df["query_role"] == self.query_role) & (df["key_role"] == self.key_role)
        ]


def _part(name: str, key: str, label: str, description: str) -> HeadlineMetric:
    return HeadlineMetric(name, "decomposition", INPUT, key, label, description)


SINK_MASS = _part(
    "sink", SINK, "input → sink", "attention input queries put on the sink: the first input token (BOS / position 0)"
)
GUIDANCE_MASS = _part(
    "guidance",
    GUIDANCE,
    "input → guidance",
    "attention input queries put on guidance keys (soft prompt, instance, capsule)",
)
STRUCTURAL_MASS = _part(
    "structural",
    "structural",
    "input → structural (sink excluded)",
    "attention input queries put on template tokens, the sink excluded",
)
CONTENT_MASS = _part(
    "content",
    "content",
    "input → content (sink excluded)",
    "attention input queries put on the user's fields, the sink excluded",
)
SPECIAL_MASS = _part(
    "special",
    "special",
    "input → special (sink excluded)",
    "attention input queries put on special tokens, the sink excluded",
)
ABSORPTION = HeadlineMetric(
    "absorption",
    "guidance_absorption",
    INPUT,
    GUIDANCE,
    "guidance absorption",
    "input → guidance mass / the guidance share of visible positions (> 1: more than its share)",
)
INPUT_ENTROPY = HeadlineMetric(
    "entropy", "entropy", INPUT, NO_ROLE, "entropy of input queries", "normalized attention entropy of input queries"
)
GUIDANCE_ENTROPY = HeadlineMetric(
    "guidance_entropy",
    "entropy",
    GUIDANCE,
    NO_ROLE,
    "entropy of guidance queries",
    "normalized attention entropy of guidance queries (reported separately)",
)
ISLAND = HeadlineMetric(
    "island",
    "island_score",
    GUIDANCE,
    GUIDANCE,
    "island score (guidance → guidance)",
    "share of guidance queries' attention kept on guidance keys",
)

DECOMPOSITION: tuple[HeadlineMetric, ...] = (SINK_MASS, GUIDANCE_MASS, STRUCTURAL_MASS, CONTENT_MASS, SPECIAL_MASS)
HEADLINE: tuple[HeadlineMetric, ...] = DECOMPOSITION + (ABSORPTION, INPUT_ENTROPY, GUIDANCE_ENTROPY, ISLAND)


def role_mass_metric(role: str) -> HeadlineMetric:
    """Attention input queries put on a role the run adds (a chat template's scaffold and system, a task's own
    role, few-shot demonstrations), the sink excluded."""
    return _part(
        role,
        role,
        f"input → {role} (sink excluded)",
        f"attention input queries put on {role} tokens, the sink excluded",
    )


def run_headline(added_roles: Sequence[str], fields: Sequence[str] = ()) -> tuple[HeadlineMetric, ...]:
    """The headline of a run whose role table adds ``added_roles`` to the built-ins: the decomposition gains one
    row per added role (after the built-in parts, so the parts of a run still sum to 1), then the rest, then the
    flow between the template's ``fields`` (:func:`field_metrics`; none for a task of one field)."""
    parts = DECOMPOSITION + tuple(role_mass_metric(r) for r in added_roles)
    return parts + HEADLINE[len(DECOMPOSITION) :] + field_metrics(fields)


def field_flow_metric(query_field: str, key_field: str) -> HeadlineMetric:
    """Attention the content tokens of template field ``query_field`` put on those of ``key_field`` (the
    ``field_flow`` rows of the groups ``content:<field>``, :func:`~anchorlens.analyses.derived.field_flow_rows`)."""
    q, k = field_group(query_field), field_group(key_field)
    return HeadlineMetric(
        f"field_flow:{query_field}:{key_field}",
        FIELD_FLOW,
        q,
        k,
        f"{q} → {k}",
        f"attention the {query_field} field's tokens put on the {key_field} field's tokens",
    )


def field_metrics(fields: Sequence[str]) -> tuple[HeadlineMetric, ...]:
    """One :func:`field_flow_metric` per ordered pair of distinct template fields, later fields' queries first (in
    a decoder they are the ones that can see the earlier fields; the reverse pairs are n/a, fixed by the mask)."""
    order = list(dict.fromkeys(fields))
    return tuple(
        field_flow_metric(q, k) for i, q in reversed(list(enumerate(order))) for j, k in enumerate(order) if i != j
    )


def anchor_mass_metric(anchor: str) -> HeadlineMetric:
    """Attention input queries put on the ``anchor`` role's keys (e.g. the instance token)."""
    return HeadlineMetric(
        f"anchor_mass:{anchor}",
        "anchor_mass",
        INPUT,
        anchor,
        f"input → {anchor}",
        f"attention input queries put on the {anchor} token(s)",
    )


def anchor_structural_metric(anchor: str) -> HeadlineMetric:
    """The ``anchor`` role's own attention to structural keys."""
    return HeadlineMetric(
        f"anchor_structural:{anchor}",
        "anchor_structural",
        anchor,
        "structural",
        f"{anchor} → structural",
        f"the {anchor} token's own attention to structural tokens",
    )


def anchor_metrics(anchor: str) -> tuple[HeadlineMetric, ...]:
    """The anchor's headline pair: mass input queries give it, and its own attention to structure."""
    return anchor_mass_metric(anchor), anchor_structural_metric(anchor)


def headline_metric(name: str) -> HeadlineMetric:
    """The headline metric called ``name``; KeyError lists the names."""
    for m in HEADLINE:
        if m.name == name:
            return m
    raise KeyError(f"unknown headline metric {name!r}; known: {', '.join(m.name for m in HEADLINE)}")


__all__ = [
    "ABSORPTION",
    "CONTENT_MASS",
    "DECOMPOSITION",
    "GUIDANCE_ENTROPY",
    "GUIDANCE_MASS",
    "HEADLINE",
    "HeadlineMetric",
    "INPUT_ENTROPY",
    "ISLAND",
    "SINK_MASS",
    "SPECIAL_MASS",
    "STRUCTURAL_MASS",
    "anchor_mass_metric",
    "anchor_metrics",
    "anchor_structural_metric",
    "field_flow_metric",
    "field_metrics",
    "headline_metric",
    "role_mass_metric",
    "run_headline",
]
