"""What capture hands to a sink for one attention call (or one chunk of its queries)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from anchorlens.engine.call import KeySpan
from anchorlens.roles.layout import Layout, SequenceRoles


@dataclass(frozen=True)
class AttentionEvent:
    """Attention probabilities of one (stack, layer) for one batch, possibly for a slice of its queries.

    probs: [B, H, q, K'] float32 over the first K' <= K keys (K' < K when the keys after K' are hidden
    from every query of the event: a causal chunk of queries sees no later key), rows sum to 1 over
    visible keys (1 - ``learned_sink`` where the module has a learned sink; 0 elsewhere); only the selected heads, whose model indices are ``heads`` ([H] long).
    visible: [B|1, H|1, q, K'] bool, or None where ``key_span`` stands for it (the kernel plan on a call without a
    mask: read :meth:`visible_mask`, :meth:`visible_counts` and :attr:`visibility_key`, which take either), which of
    those keys each query may attend to after every edit (causal,
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
    score_sums: [B, H, q, S] float32 or None, sum_j p_ij s_ij W_js over the S weight columns ``score_columns``
    ([B, K, S], the tensor the sink's ``score_columns`` returned; compare by identity): with ``log_norm`` they give
    sum p log p over those keys without the probabilities (an entropy). received: [B, H, K'] float32 or None, the
    mass each key receives from the event's valid queries, where the kernel plan computed it (read
    :meth:`received_mass`, which sums ``probs`` otherwise). value_sums: [B, H, q, C] float32 or None, sum_j p_ij C_jc
    n_j^h over ``key_columns`` weighted by the value norms, where the kernel plan computed them (read
    :meth:`value_sums_over`). plan: which of the engine's plans computed
    the event: ``"materialised"`` (probabilities in float32 chunks, ``probs`` and ``scores`` set) or ``"kernel"``
    (a fused kernel and its log-sum-exp, :mod:`anchorlens.engine.kernel`: ``probs`` and ``scores`` None, the
    quantities the sink reads set: ``log_norm``, ``key_sums``, ``score_sums``, ``visible``).
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
    probs: torch.Tensor | None
    visible: torch.Tensor | None
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
    score_sums: torch.Tensor | None = None
    score_columns: torch.Tensor | None = None
    plan: str = "materialised"
    key_parts: tuple[tuple[torch.Tensor, int], ...] = ()
    score_parts: tuple[tuple[torch.Tensor, int], ...] = ()
    key_span: KeySpan | None = None
    received: torch.Tensor | None = None
    value_sums: torch.Tensor | None = None
    cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(B, H, q, K'): the batch, the event's heads, its queries and the keys it covers (``probs``'s shape where it
        has probabilities; a kernel-plan event has none, :mod:`anchorlens.engine.kernel`)."""
        if self.probs is not None:
            b, h, q, k = self.probs.shape
            return b, h, q, k
        assert self.log_norm is not None, "an event without probabilities carries its log normaliser"
        b, h, q = self.log_norm.shape[:3]
        return b, h, q, self.key_span.key_count if self.key_span is not None else self.visible_mask().shape[-1]

    @property
    def device(self) -> torch.device:
        """Where the event's tensors are."""
        found = self.probs if self.probs is not None else self.log_norm
        assert found is not None, "an event carries its probabilities or its log normaliser"
        return found.device

    def visible_mask(self) -> torch.Tensor:
        """[B|1, H|1, q, K'] bool: ``visible``, or the mask ``key_span`` stands for (built on each call, O(q·K'):
        prefer :meth:`visible_counts`)."""
        if self.visible is not None:
            return self.visible
        assert self.key_span is not None, "an event carries its visibility as a mask or as a key span"
        return self.key_span.dense()

    @property
    def visibility_key(self) -> torch.Tensor | KeySpan:
        """The object that identifies this event's visibility (``visible`` or ``key_span``): the layers of a forward
        share it, so work that depends only on it can be cached by identity (:class:`~anchorlens.capture.identity.IdentityCache`)."""
        if self.visible is not None:
            return self.visible
        assert self.key_span is not None, "an event carries its visibility as a mask or as a key span"
        return self.key_span

    def visible_counts(self, columns: torch.Tensor) -> torch.Tensor:
        """[B, H|1, q, C] float64: each query's sum of the key weights ``columns`` ([B, K, C], K >= K') over the keys
        it sees after every edit: prefix sums over a key span (O(K·C)), a product with the mask otherwise."""
        if self.key_span is not None and self.visible is None:
            return self.key_span.counts(columns.to(self.device)).expand(columns.shape[0], -1, -1, -1)
        seen = self.visible_mask().to(self.device).to(torch.float32)  # [B|1, H|1, q, K']
        # float32 sums of 0/1 weights are exact below 2^24 keys
        return torch.matmul(seen, columns[:, None, : seen.shape[-1]].to(self.device, torch.float32)).double()

    def sums_over(self, columns: torch.Tensor) -> torch.Tensor | None:
        """[B, H, q, C] this event's ``key_sums`` over exactly ``columns`` ([B, K, C], the tensor a reducer's
        ``key_columns`` returned: compared by identity), or None when the engine did not sum them (then sum the
        probabilities). Where several reducers asked for different columns the engine summed them side by side
        (``key_parts``), and each finds its own here."""
        return _part(self.key_sums, self.key_columns, self.key_parts, columns)

    def value_sums_over(self, columns: torch.Tensor) -> torch.Tensor | None:
        """[B, H, q, C] this event's ``value_sums`` over exactly ``columns`` (as :meth:`sums_over`), or None (then
        weigh the probabilities: ``probs @ (value_norms * columns)``)."""
        return _part(self.value_sums, self.key_columns, self.key_parts, columns)

    def score_sums_over(self, columns: torch.Tensor) -> torch.Tensor | None:
        """[B, H, q, S] this event's ``score_sums`` over exactly ``columns`` (as :meth:`sums_over`), or None."""
        return _part(self.score_sums, self.score_columns, self.score_parts, columns)

    def probabilities(self, reader: str) -> torch.Tensor:
        """``probs``, or a :class:`RuntimeError` naming ``reader`` when the plan that ran computed none (a reducer
        that reads them declares ``"probs"`` in its ``reads``, and then the capture never picks such a plan)."""
        if self.probs is None:
            raise RuntimeError(
                f"{reader} reads attention probabilities at {self.stack}.{self.layer}, but the {self.plan} plan "
                "computed none: declare 'probs' in its reads"
            )
        return self.probs

    def received_mass(self, reader: str) -> torch.Tensor:
        """[B, H, K'] float32: sum over the event's valid queries i of p_ij, the mass each key j receives from them:
        the kernel plan's ``received``, or the sum of ``probs`` (padding queries' rows are finite; they weigh 0)."""
        if self.received is not None:
            return self.received
        probs = self.probabilities(reader)
        valid = self.layout.q.valid.to(probs.device).to(probs.dtype)  # [B, q]
        return torch.matmul(valid[:, None, None, :], probs).squeeze(2)

    def received_counts(self) -> torch.Tensor:
        """[B, H|1, K'] float64: how many of the event's valid queries see each key after every edit (a key span's
        difference array, O(q + K'); a product with the mask otherwise)."""
        valid = self.layout.q.valid.to(self.device)
        if self.key_span is not None and self.visible is None:
            return self.key_span.key_counts(valid.to(torch.float64))
        seen = self.visible_mask().to(self.device).to(torch.float32)  # [B|1, H|1, q, K']
        return torch.matmul(valid[:, None, None, :].to(torch.float32), seen).squeeze(2).double()

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
        """K': how many leading keys the event covers (the rest are hidden from these queries)."""
        return self.shape[3]

    def full_probs(self) -> torch.Tensor:
        """[B, H, q, K] probabilities over all the layout's keys (zeros appended for hidden trailing keys)."""
        probs = self.probabilities("full_probs")
        missing = self.layout.k.roles.shape[1] - self.key_count
        return torch.nn.functional.pad(probs, (0, missing)) if missing else probs

    @property
    def is_first_chunk(self) -> bool:
        """Whether this event starts its attention call (always True without chunking)."""
        return self.query_start == 0

    @property
    def is_last_chunk(self) -> bool:
        """Whether this event ends its attention call (always True without chunking)."""
        total = self.query_total if self.query_total is not None else self.shape[2]
        return self.query_start + self.shape[2] >= total


def _part(
    sums: torch.Tensor | None,
    summed: torch.Tensor | None,
    parts: tuple[tuple[torch.Tensor, int], ...],
    columns: torch.Tensor,
) -> torch.Tensor | None:
    """The slice of ``sums`` (over the columns ``summed``, made of ``parts``) that is over ``columns``, or None."""
    if sums is None:
        return None
    if summed is columns:
        return sums
    for part, start in parts:
        if part is columns:
            return sums[..., start : start + part.shape[-1]]
    return None


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
