"""``sink_battery``: the attention-sink metrics of Gu et al. 2024 ("When attention sink emerges in language models").

Per head h and key k, the mean attention k receives from the queries that may attend to it:

    alpha_h(k) = sum_{i valid, i sees k} A_h(i, k) / #{i valid, i sees k}

(for causal attention without a window: every valid query i >= k, the paper's definition; a sliding window
leaves out the queries k has slid out of, instead of counting their zero weight). Head h is a *sink head*
at threshold eps when alpha_h(first key) > eps (the paper's sink), and an *any-key* sink head when one of its
top keys by received mass has alpha > eps (sinks that are not the first token: newlines, punctuation, the
instance token). The sink rate is the share of a layer's heads that are sink heads.

One attention call may arrive as several query chunks: the column sums over queries ([B, H, K], one
product per chunk: the probabilities summed over their valid queries) are added up until the call's last
chunk, then reduced to a few numbers per example and head. The state is sums per example and head (one row
per example: memory does not depend on the maps), merged by adding, like every other reducer's.

Frame rows (query_role ``all``; head <NA> for the rate rows):

========================== ============================================================== =================
metric                     value                                                          key_role
========================== ============================================================== =================
``sink_alpha_first``       alpha_h of the example's first valid key                       that key's role
``sink_alpha_top{r}``      alpha_h of the key with the r-th largest received mass         that key's role
``sink_position_top{r}``   that key's position (0-based among the example's valid keys)   that key's role
``sink_head@{eps}``        1 if alpha_h(first key) > eps else 0                           ``""``
``sink_head_any@{eps}``    1 if some top key has alpha_h > eps else 0                     ``""``
``sink_rate@{eps}``        share of the site's heads with ``sink_head@{eps}`` = 1         ``""``
``sink_rate_any@{eps}``    share of the site's heads with ``sink_head_any@{eps}`` = 1     ``""``
========================== ============================================================== =================

``count``: the queries the alpha averages over (alpha and position rows), the example's valid queries
(head and rate rows). Averaging ``sink_head@eps`` over heads, examples and layers gives the overall sink rate
(:func:`sink_rates`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from anchorlens.analyses.base import SiteReducer
from anchorlens.analyses.frames import ALL, NO_ROLE, per_head
from anchorlens.analyses.registry import register_reducer
from anchorlens.analyses.rows import Rows, cell_rows
from anchorlens.analyses.shared import anchor_key_index
from anchorlens.capture.event import AttentionEvent
from anchorlens.capture.identity import IdentityCache
from anchorlens.engine.quantities import RECEIVED, VISIBLE
from anchorlens.errors import UsageError
from anchorlens.roles.table import BUILTIN_ROLES, RoleTable

DEFAULT_EPS: tuple[float, ...] = (0.3,)
DEFAULT_TOP = 3
ALPHA_FIRST = "sink_alpha_first"
ALPHA_TOP = "sink_alpha_top"
POSITION_TOP = "sink_position_top"
SINK_HEAD = "sink_head"
SINK_HEAD_ANY = "sink_head_any"
SINK_RATE = "sink_rate"
SINK_RATE_ANY = "sink_rate_any"


def eps_label(metric: str, eps: float) -> str:
    """``metric@eps`` (``sink_head@0.3``): the metric name of a thresholded row."""
    return f"{metric}@{eps:g}"


def check_eps(eps: float | Sequence[float]) -> tuple[float, ...]:
    """The thresholds as a sorted tuple of floats; UsageError unless each lies in (0, 1)."""
    values = (eps,) if isinstance(eps, int | float) else tuple(eps)
    if not values:
        raise UsageError("the sink battery needs at least one eps threshold: pass e.g. eps=0.3")
    out = []
    for v in values:
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise UsageError(f"sink threshold eps={v!r} is not a number: use values in (0, 1), e.g. 0.3") from None
        if not 0.0 < f < 1.0:
            raise UsageError(f"sink threshold eps={v} is outside (0, 1): use values in (0, 1), e.g. 0.3")
        out.append(f)
    return tuple(sorted(set(out)))


@register_reducer("sink_battery")
class SinkBatteryReducer(SiteReducer):
    """alpha_h(k) on the first key and the top-``top`` keys by received mass, sink heads and sink rates per ``eps``.

    See the module docstring for the definitions and frame rows. State per example and head: ``first`` [3]
    (received mass of the first valid key, queries that see it, its role id), ``top`` [5, m] (alpha, queries,
    position, role id, present) of the top keys, ``flags`` [2, E] (first-key and any-key sink flags per eps),
    ``seen`` [2] (times the example was reduced, its valid queries). Every array is a sum: an example seen twice
    (or in two shards) averages.
    """

    name = "sink_battery"
    # the mass each key receives, summed over the queries: the kernel plan computes it in one more pass
    reads = frozenset({RECEIVED, VISIBLE})

    def __init__(
        self, eps: float | Sequence[float] = DEFAULT_EPS, top: int = DEFAULT_TOP, roles: RoleTable = BUILTIN_ROLES
    ) -> None:
        self.eps = check_eps(eps)
        if isinstance(top, bool) or not isinstance(top, int) or top < 1:
            raise UsageError(f"sink battery top={top!r} must be a positive whole number of keys, e.g. 3")
        self.top = top
        super().__init__(roles)
        # site -> [mass [B, H, K], queries [B, H, K], valid queries [B]] of the call whose chunks are arriving
        self._open: dict[tuple[str, int], list[torch.Tensor]] = {}
        self._seen_by = IdentityCache()

    def _options(self) -> dict:
        """``{"eps": [...], "top": m}``."""
        return {"eps": list(self.eps), "top": self.top}

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        """first: [3]; top: [5, m]; flags: [2, E]; seen: [2]."""
        return {"first": (3,), "top": (5, self.top), "flags": (2, len(self.eps)), "seen": (2,)}

    # -- streaming ---------------------------------------------------------------------------
    def update(self, event: AttentionEvent) -> None:
        """Add the chunk's received mass per key; at the call's last chunk reduce it into the state."""
        self._check_roles(event)
        site = (event.stack, int(event.layer))
        received = event.received_mass(self.name)  # [B, H, K']: from the chunk's valid queries
        b, h, k_cover = received.shape
        k_all = event.layout.k.roles.shape[1]
        dev = received.device
        if event.is_first_chunk or site not in self._open:
            self._open[site] = [
                torch.zeros(b, h, k_all, dtype=torch.float64, device=dev),
                torch.zeros(b, h, k_all, dtype=torch.float64, device=dev),
                torch.zeros(b, dtype=torch.float64, device=dev),
            ]
        mass, queries, n_queries = self._open[site]
        mass[..., :k_cover] += received
        queries[..., :k_cover] += self._seen_by.get(
            (event.visibility_key, event.layout.q.valid, dev), event.received_counts
        )
        n_queries += event.layout.q.valid.to(dev).sum(1)
        if event.is_last_chunk:
            del self._open[site]
            arrays = self._reduce_call(event, mass, queries, n_queries)
            self._sums.add([site], event.example_ids, event.heads, arrays)

    def _reduce_call(
        self, event: AttentionEvent, mass: torch.Tensor, queries: torch.Tensor, n_queries: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """The whole call's sums (mass [B, H, K] each key received from valid queries, queries [B, H, K] that see it,
        n_queries [B] valid queries) -> state arrays [1, B, H, *shape] (float64)."""
        k = event.layout.k
        dev = mass.device
        valid = k.valid.to(dev).bool()  # [B, K]
        roles = k.roles.to(dev).double()  # [B, K]
        b, h, k_all = mass.shape
        seen = valid[:, None] & (queries > 0)  # [B, H, K]: keys some valid query sees
        alpha = torch.where(seen, mass / queries.clamp_min(1.0), 0.0)  # [B, H, K]
        first, found = anchor_key_index(valid, 0)
        rows = torch.arange(b, device=dev)
        first_mass = mass[rows, :, first]  # [B, H]
        first_queries = queries[rows, :, first]  # [B, H]
        first_alpha = torch.where(first_queries > 0, first_mass / first_queries.clamp_min(1.0), 0.0)[:, :, None]
        f = found.double()
        first_arr = (
            torch.stack([first_mass, first_queries, roles[rows, first][:, None].expand(b, h)], -1) * f[:, None, None]
        )
        m = min(self.top, k_all)
        ranked = torch.where(seen, mass, -1.0)  # unseen keys rank last
        top_mass, top_idx = ranked.topk(m, dim=-1)  # [B, H, m]
        present = (top_mass >= 0).double()
        position = (valid.long().cumsum(1) - 1).double()  # [B, K]: rank among the valid keys
        by_key = lambda t: t[:, None].expand(b, h, k_all).gather(-1, top_idx)  # noqa: E731  [B, K] -> [B, H, m]
        top_alpha = alpha.gather(-1, top_idx)
        top_arr = (
            torch.stack(
                [top_alpha, queries.gather(-1, top_idx), by_key(position), by_key(roles), torch.ones_like(top_alpha)],
                -2,
            )
            * present[:, :, None]
        )
        if m < self.top:
            top_arr = torch.nn.functional.pad(top_arr, (0, self.top - m))
        eps = torch.tensor(self.eps, dtype=torch.float64, device=dev)
        any_alpha = (top_alpha * present).amax(-1, keepdim=True)  # [B, H, 1]
        flags = torch.stack([(first_alpha > eps).double(), (any_alpha > eps).double()], -2) * f[:, None, None, None]
        seen_arr = torch.stack([f, n_queries * f], -1)[:, None].expand(b, h, 2)
        return {
            "first": first_arr[None],
            "top": top_arr[None],
            "flags": flags[None],
            "seen": seen_arr[None],
        }

    # -- frame -------------------------------------------------------------------------------
    def _site_rows(
        self, stack: str, layer: int, examples: np.ndarray, heads: np.ndarray, arrays: dict[str, torch.Tensor]
    ) -> Rows:
        """Rows of one site (module docstring) from arrays [N, H, ...]."""
        seen = arrays["seen"][..., 0].numpy()  # [N, H]
        ok = seen > 0
        if not ok.any():
            return Rows.empty()
        n_seen = np.maximum(seen, 1e-300)
        n_queries = arrays["seen"][..., 1].numpy() / n_seen
        names = np.asarray(self.roles.names + (NO_ROLE,), dtype=object)

        def role_of(ids: np.ndarray) -> np.ndarray:
            return names[np.clip(np.rint(ids), 0, len(names) - 1).astype(np.int64)]

        first, top, flags = (arrays[k].numpy() for k in ("first", "top", "flags"))
        rows = lambda metric, value, count, keep, key_role=NO_ROLE, heads=heads: cell_rows(  # noqa: E731
            stack, layer, examples, heads, metric, value, count, keep, ALL, key_role
        )
        first_queries = first[..., 1] / n_seen
        parts = [
            rows(
                ALPHA_FIRST,
                first[..., 0] / np.maximum(first[..., 1], 1e-300),
                first_queries,
                ok & (first_queries > 0),
                role_of(first[..., 2] / n_seen),
            )
        ]
        for r in range(self.top):
            present = top[..., 4, r]
            denom = np.maximum(present, 1e-300)
            key_role, queries = role_of(top[..., 3, r] / denom), top[..., 1, r] / denom
            parts.append(rows(f"{ALPHA_TOP}{r + 1}", top[..., 0, r] / denom, queries, present > 0, key_role))
            parts.append(rows(f"{POSITION_TOP}{r + 1}", top[..., 2, r] / denom, queries, present > 0, key_role))
        heads_seen = ok.sum(1, keepdims=True)  # [N, 1]
        for e, eps in enumerate(self.eps):
            for which, (head_metric, rate_metric) in enumerate(
                ((SINK_HEAD, SINK_RATE), (SINK_HEAD_ANY, SINK_RATE_ANY))
            ):
                value = flags[..., which, e] / n_seen
                parts.append(rows(eps_label(head_metric, eps), value, n_queries, ok))
                rate = np.where(ok, value, 0.0).sum(1, keepdims=True) / np.maximum(heads_seen, 1)
                parts.append(
                    rows(eps_label(rate_metric, eps), rate, n_queries.max(1, keepdims=True), heads_seen > 0, heads=None)
                )
        return Rows.concat(parts)


def sink_rates(frame: pd.DataFrame, eps: float = DEFAULT_EPS[0], any_key: bool = False) -> pd.DataFrame:
    """Sink rate per (stack, layer) and overall: the share of (example, head) cells that are sink heads at ``eps``.

    Columns ``stack``, ``layer`` (``-1`` for the overall row of each stack), ``sink_rate``, ``heads`` (cells
    counted). Reads ``sink_head@eps`` rows (``sink_head_any@eps`` with ``any_key``) of a ``sink_battery`` frame;
    empty when it has none.
    """
    metric = eps_label(SINK_HEAD_ANY if any_key else SINK_HEAD, eps)
    rows = per_head(frame[frame["metric"] == metric]) if "metric" in frame.columns else frame.iloc[:0]
    if rows.empty:
        return pd.DataFrame({"stack": [], "layer": [], "sink_rate": [], "heads": []})
    per_layer = rows.groupby(["stack", "layer"], sort=True)["value"].agg(["mean", "size"]).reset_index()
    overall = rows.groupby("stack", sort=True)["value"].agg(["mean", "size"]).reset_index().assign(layer=-1)
    out = pd.concat([per_layer, overall[["stack", "layer", "mean", "size"]]], ignore_index=True)
    return out.rename(columns={"mean": "sink_rate", "size": "heads"}).astype({"layer": "int64", "heads": "int64"})


__all__ = [
    "ALPHA_FIRST",
    "ALPHA_TOP",
    "DEFAULT_EPS",
    "DEFAULT_TOP",
    "POSITION_TOP",
    "SINK_HEAD",
    "SINK_HEAD_ANY",
    "SINK_RATE",
    "SINK_RATE_ANY",
    "SinkBatteryReducer",
    "check_eps",
    "eps_label",
    "sink_rates",
]
