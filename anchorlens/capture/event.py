"""What capture hands to a sink for one attention call (or one chunk of its queries)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from anchorlens.roles.layout import Layout, SequenceRoles


@dataclass(frozen=True)
class AttentionEvent:
    """Attention probabilities of one (stack, layer) for one batch, possibly for a slice of its queries.

    probs: [B, H, q, K'] float32 over the first K' <= K keys (K' < K when the keys after K' are hidden
    from every query of the event: a causal chunk of queries sees no later key), rows sum to 1 over
    visible keys (1 - ``learned_sink`` where the module has a learned sink; 0 elsewhere); only the selected heads, whose model indices are ``heads`` ([H] long).
    visible: [B|1, H|1, q, K'] bool, which of those keys each query may attend to after every edit (causal,
    window and padding masks combined, less the keys a knockout removes from the softmax: ``renorm`` masks them
    before it, ``zero`` zeroes them after it; ``value`` and ``mean`` knockouts keep the weights, so the keys stay
    visible). H|1: 1 unless a knockout acts on some heads only (then one row per head of the event). A query whose
    visible keys are all removed has an all-zero row of ``probs`` (an empty row). layout: roles of *these* queries ([B, q]) and of all K keys ([B, K]); use
    :attr:`key_count` (K') and :meth:`full_probs` rather than assuming K' = K. example_ids: [B] long, the examples' dataset indices.
    scores: [B, H, q, K] float32 attention logits (after soft-capping, bias and mask), and log_norm:
    [B, H, q, 1] float32 the log of the softmax normaliser (sink included), so that log probs = scores -
    log_norm where probs > 0; elsewhere scores are very negative (always weight them by ``probs``).
    Both None when the producer did not keep them. key_sums: [B, H, q, C] float32, each query's
    probability summed over the C key columns ``key_columns`` ([B, K, C] weights over all the layout's keys,
    the tensor the sink's ``key_columns`` returned for this layout; the sums cover the first K'), computed
    by the capture together with the output when it computes the output from the probabilities (fast mode,
    float32 values): no pass over the probabilities of its own. Both None otherwise; a reducer whose columns
    are not ``key_columns`` (compare by identity) sums the probabilities itself.
    learned_sink: [B, H, q] float32 or None, the probability of the attention module's learned sink logit
    (gpt-oss's ``sinks``, passed to the attention as ``s_aux``): a pseudo-key outside the layout, so over real keys
    rows sum to 1 - learned_sink; None when the module has no learned sink.
    value_norms: [B, H, K] float32 or None, ||v_j W_O^h|| for every key of the layout (the norm of key j's value
    after head h's part of the output projection, :mod:`anchorlens.engine.value_norms`): A_h(i, j) times it is the
    norm of key j's contribution to query i's output; computed only when the sink asks (``wants_value_norms``).
    ``probs`` and ``scores`` live in buffers the capture
    reuses for the next attention call (no large allocation per layer): read them while consuming the
    event, never keep them (copy what you need, as :class:`~anchorlens.capture.sinks.MapSink` does). cache: scratch space for one event, where reducers share
    derived tensors (for example mass per key role) so that work common to several reducers is done once;
    the capture lends ``cache["work"]``, a flat scratch buffer at least the size of ``probs``, reused by
    the next event (use it for temporaries consumed within the update).

    Chunking contract: when the recompute hits its memory budget, or the call is causal and long enough
    to skip its hidden upper triangle, one attention call arrives as several events covering queries ``query_start : query_start + q`` of ``query_total``, in order, with
    disjoint slices whose union is all queries. Everything in an event refers to its own slice, so a
    reducer whose state is a sum over queries (every built-in one) is correct by simply adding each
    event; a reducer that needs whole rows of queries at once must assemble them by ``query_start``.
    """

    stack: str
    layer: int
    heads: torch.Tensor
    probs: torch.Tensor
    visible: torch.Tensor
    layout: Layout
    example_ids: torch.Tensor
    query_start: int = 0
    query_total: int | None = None
    scores: torch.Tensor | None = None
    log_norm: torch.Tensor | None = None
    key_sums: torch.Tensor | None = None
    key_columns: torch.Tensor | None = None
    learned_sink: torch.Tensor | None = None
    value_norms: torch.Tensor | None = None
    cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def query_valid(self) -> torch.Tensor:
        """[B, q] bool: queries of this event that are real positions (not padding)."""
        return self.layout.q.valid

    @property
    def key_valid(self) -> torch.Tensor:
        """[B, K] bool: keys that are real positions (not padding)."""
        return self.layout.k.valid

    @property
    def key_count(self) -> int:
        """K': how many leading keys ``probs`` covers (the rest are hidden from these queries)."""
        return self.probs.shape[-1]

    def full_probs(self) -> torch.Tensor:
        """[B, H, q, K] probabilities over all the layout's keys (zeros appended for hidden trailing keys)."""
        missing = self.layout.k.roles.shape[1] - self.key_count
        return torch.nn.functional.pad(self.probs, (0, missing)) if missing else self.probs

    @property
    def is_first_chunk(self) -> bool:
        """Whether this event starts its attention call (always True without chunking)."""
        return self.query_start == 0

    @property
    def is_last_chunk(self) -> bool:
        """Whether this event ends its attention call (always True without chunking)."""
        total = self.query_total if self.query_total is not None else self.probs.shape[2]
        return self.query_start + self.probs.shape[2] >= total


@dataclass(frozen=True)
class HiddenEvent:
    """The hidden states one block of a (stack, layer) returned for one batch: the residual stream after the block.

    hidden: [B, T, d] in the model's dtype, the block's output as the next block receives it (positions a guidance
    inserts for this block only, such as a capsule's, are removed again by then); roles: the roles and validity
    of those T positions ([B, T], the run's table); example_ids: [B] long. ``hidden`` is the model's own tensor:
    read it while consuming the event, never modify or keep it.
    """

    stack: str
    layer: int
    hidden: torch.Tensor
    roles: SequenceRoles
    example_ids: torch.Tensor
