"""The quantities an attention call can give an observer, by name, and which of the engine's plans gives which.

A reducer declares what it reads (its ``reads``: a set of these names); the capture hands the union of its
reducers' reads to the engine, which picks per call the cheapest plan that gives them all
(:mod:`anchorlens.engine.plan`). Names and shapes (for one event of B examples, H heads, q queries, K keys):

- ``probs`` [B, H, q, K] and ``scores`` [B, H, q, K]: the probabilities and logits themselves;
- ``lse`` [B, H, q, 1]: the log normaliser of each query row (``log_norm`` on the event);
- ``key_sums`` [B, H, q, C]: probability sums over the sink's key columns (``key_columns``);
- ``score_sums`` [B, H, q, S]: sum_j p_ij s_ij over the sink's score columns (``score_columns``), what an entropy
  needs with ``lse``;
- ``received`` [B, H, K']: sum_i p_ij over the event's valid queries i, the mass each key receives (what a sink
  battery ranks keys by); the kernel plan computes it in one more pass (the attention transposed), the
  materialised plan sums ``probs``;
- ``visible`` [B|1, H|1, q, K] bool: which keys each query can attend to after every edit;
- ``value_norms`` [B, H, K]: ||v_j W_O^h||;
- ``value_sums`` [B, H, q, C]: sum_j p_ij C_jc ||v_j W_O^h|| over the sink's key columns, the norm-based
  (value-aware) mass (with ``value_norms``); the kernel plan computes it in passes of per-head columns, the
  materialised plan from ``probs``;
- ``learned_sink`` [B, H, q]: the mass of a learned sink logit, where the module has one.
"""

from __future__ import annotations

PROBS = "probs"
SCORES = "scores"
LSE = "lse"
KEY_SUMS = "key_sums"
SCORE_SUMS = "score_sums"
RECEIVED = "received"
VISIBLE = "visible"
VALUE_NORMS = "value_norms"
VALUE_SUMS = "value_sums"
LEARNED_SINK = "learned_sink"

QUANTITIES = frozenset(
    {PROBS, SCORES, LSE, KEY_SUMS, SCORE_SUMS, RECEIVED, VISIBLE, VALUE_NORMS, VALUE_SUMS, LEARNED_SINK}
)
# what a reader that declares no ``reads`` is given: everything but the value norms and the sums weighted by them,
# which cost a projection per call and need a module whose output is a projection of the concatenated heads (they
# are computed only when asked)
UNDECLARED_READS = QUANTITIES - {VALUE_NORMS, VALUE_SUMS}
# the materialised plan computes every quantity
MATERIALISED_QUANTITIES = QUANTITIES
# the kernel plan all but the maps themselves; it runs only where a module has no learned sink, so there the
# learned sink's mass is rightly absent
KERNEL_QUANTITIES = QUANTITIES - {PROBS, SCORES}
