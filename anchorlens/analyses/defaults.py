"""The reducer set every workflow streams by default, and the opt-in evidence reducers beside it.

``sink_battery``, ``massive_activations`` and ``value_mass`` are not in the default set: their rows are per-example
facts (which key or token, which dimension) whose roles differ from example to example, so as paired cells they
would mostly not pair, and the ones that do would join every comparison's Benjamini-Hochberg family and change the
q-values of the attention statistics the defaults report. Ask for them by name (``extra=``, ``make_reducer``;
``--evidence`` on ``capture``/``compare`` and ``inspect(evidence=...)``, parsed by
:func:`anchorlens.analyses.evidence.parse_evidence`); ``compare`` reports them in ``evidence.csv``
(:mod:`anchorlens.analyses.evidence_table`), never in ``paired.csv``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from anchorlens.analyses.registry import make_reducer
from anchorlens.capture.reducer import Reducer
from anchorlens.roles.table import BUILTIN_ROLES, RoleTable

DEFAULT_REDUCERS = ("role_flow", "first_token", "entropy", "decomposition", "learned_sink")
EVIDENCE_REDUCERS = ("sink_battery", "massive_activations", "value_mass")


def default_reducers(
    anchor_role: str = "capsule",
    roles: RoleTable = BUILTIN_ROLES,
    *,
    extra: Sequence[str] | Mapping[str, Mapping] = (),
) -> list[Reducer]:
    """Fresh ``role_flow``, ``first_token``, ``entropy`` (also of ``anchor_role``'s queries), ``decomposition`` and
    ``learned_sink`` reducers counting the run's ``roles``, then the reducers named in ``extra`` (names, or name -> options, e.g.
    ``{"sink_battery": {"eps": [0.1, 0.3]}}``), each built with the run's roles."""
    options = dict(extra) if isinstance(extra, Mapping) else {name: {} for name in extra}
    return [
        make_reducer("role_flow", roles=roles),
        make_reducer("first_token", roles=roles),
        make_reducer("entropy", anchor_role=anchor_role, roles=roles),
        make_reducer("decomposition", roles=roles),
        make_reducer("learned_sink", roles=roles),  # rows only where the model has learned sinks (gpt-oss)
        *(make_reducer(name, roles=roles, **dict(opts)) for name, opts in options.items()),
    ]
