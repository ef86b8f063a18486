"""``massive_activations``: the largest hidden-state entries of every layer (Sun et al. 2024, "Massive activations").

Reads the residual stream each selected block returns (:class:`~anchorlens.capture.event.HiddenEvent`, from the
same forward as the attention statistics) over the example's valid positions: its median magnitude
median(|h|) over every valid (token, dimension) entry (the lower median of an even count), the ``top`` largest
|h| with their token and dimension, and how many entries are *massive*: |h| > ``abs_threshold`` (100 in the
paper) and > ``ratio`` (1000) x the median. Attention events are ignored.

Frame rows (head <NA>: the residual stream has no heads; key_role ``""``):

============================ ============================================================ =================
metric                       value                                                        query_role
============================ ============================================================ =================
``massive_top{r}``           the r-th largest |h| of the layer                            its token's role
``massive_position_top{r}``  its token's position (0-based among the valid positions)     its token's role
``massive_dim_top{r}``       its hidden dimension                                         its token's role
``massive_abs_top{r}``       1 if that |h| > ``abs_threshold`` else 0                     its token's role
``massive_ratio_top{r}``     1 if that |h| > ``ratio`` x the layer's median |h| else 0    its token's role
``massive_median``           the layer's median |h|                                       ``all``
``massive_count``            entries with both flags (massive activations)                ``all``
``massive_median``           median |h| over the INPUT positions only                     ``input``
``massive_count``            massive entries among the input positions (threshold: their  ``input``
                             own median), leaving out every position a guidance inserted
============================ ============================================================ =================

The ``input`` rows leave out the positions a method inserts (soft prompt, instance, capsule): a knocked-out or
inserted token's own residual stream can hold most of a checkpoint's massive activations (an instance token that
a knockout left with no key to attend to), which says nothing about the input's. ``count``: the example's valid
positions (``all``) or valid input positions (``input``). The state is sums per example and layer (an example seen twice, or
in two shards, averages), merged by adding.
"""

from __future__ import annotations

import numpy as np
import torch

from anchorlens.analyses.base import SiteReducer
from anchorlens.analyses.frames import ALL, INPUT
from anchorlens.analyses.registry import register_reducer
from anchorlens.analyses.rows import Rows, cell_rows
from anchorlens.capture.event import AttentionEvent, HiddenEvent
from anchorlens.errors import UsageError
from anchorlens.roles.table import BUILTIN_ROLES, RoleTable

DEFAULT_ABS = 100.0
DEFAULT_RATIO = 1000.0
DEFAULT_TOP = 3
TOP = "massive_top"
POSITION = "massive_position_top"
DIM = "massive_dim_top"
ABS_FLAG = "massive_abs_top"
RATIO_FLAG = "massive_ratio_top"
MEDIAN = "massive_median"
COUNT = "massive_count"
_ALL_HEADS = torch.tensor([-1])  # one column: the residual stream has no heads


def _positive(name: str, value: float) -> float:
    """``value`` as a positive float, else UsageError naming ``name``."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        f = float("nan")
    if not f > 0 or f == float("inf"):
        raise UsageError(f"massive activations {name}={value!r} must be a positive number")
    return f


@register_reducer("massive_activations")
class MassiveActivationsReducer(SiteReducer):
    """Top |h| entries, median |h| and the massive-activation count of every block's output (module docstring).

    State per example (one head column, -1): ``top`` [5, m] (|h|, position, dimension, role id, present), ``stats``
    [3] (median |h|, massive entries, valid positions), ``input_stats`` [3] (the same over input positions) and
    ``seen`` [1].
    """

    name = "massive_activations"

    def __init__(
        self,
        top: int = DEFAULT_TOP,
        abs_threshold: float = DEFAULT_ABS,
        ratio: float = DEFAULT_RATIO,
        roles: RoleTable = BUILTIN_ROLES,
    ) -> None:
        if isinstance(top, bool) or not isinstance(top, int) or top < 1:
            raise UsageError(f"massive activations top={top!r} must be a positive whole number, e.g. 3")
        self.top = top
        self.abs_threshold = _positive("abs_threshold", abs_threshold)
        self.ratio = _positive("ratio", ratio)
        super().__init__(roles)

    def _options(self) -> dict:
        """``{"top", "abs_threshold", "ratio"}``."""
        return {"top": self.top, "abs_threshold": self.abs_threshold, "ratio": self.ratio}

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        """top: [5, m]; stats: [3]; input_stats: [3]; seen: [1]."""
        return {"top": (5, self.top), "stats": (3,), "input_stats": (3,), "seen": (1,)}

    reads: frozenset[str] = frozenset()  # no attention quantity: the block outputs only (update_hidden)

    def update(self, event: AttentionEvent) -> None:
        """Attention events carry no hidden states: nothing to do."""

    def update_hidden(self, event: HiddenEvent) -> None:
        """Reduce one block's output [B, T, d] over each example's valid positions into the state."""
        table = event.roles.table
        if table is not self.roles and table.names != self.roles.names:
            raise UsageError(
                f"reducer {self.name} counts roles {', '.join(self.roles.names)} but the run has "
                f"{', '.join(table.names)}; build it with the run's roles (roles=...)"
            )
        mag = event.hidden.detach().abs().float()  # [B, T, d]
        b, t, d = mag.shape
        valid = event.roles.valid.to(mag.device).bool()  # [B, T]
        flat = mag.masked_fill(~valid[..., None], float("nan")).view(b, t * d)
        median = flat.nanmedian(dim=1).values.nan_to_num_(0.0)  # [B]
        m = min(self.top, t * d)
        values, index = flat.nan_to_num(-1.0).topk(m, dim=1)  # [B, m]
        present = (values >= 0).double()
        token, dim = index // d, index % d
        position = (valid.long().cumsum(1) - 1).gather(1, token)
        role = event.roles.roles.to(mag.device).gather(1, token)
        top = (
            torch.stack([values.double(), position.double(), dim.double(), role.double(), present], 1)
            * present[:, None]
        )
        if m < self.top:
            top = torch.nn.functional.pad(top, (0, self.top - m))
        found = valid.any(1).double()
        stats = self._stats(mag, valid, median) * found[:, None]
        inputs = torch.tensor(table.input_ids, dtype=torch.long, device=mag.device)
        is_input = valid & torch.isin(event.roles.roles.to(mag.device), inputs)
        input_stats = self._stats(mag, is_input) * found[:, None]
        arrays = {
            "top": top[:, None],
            "stats": stats[:, None],
            "input_stats": input_stats[:, None],
            "seen": found[:, None, None],
        }
        site = (event.stack, int(event.layer))
        self._sums.add([site], event.example_ids, _ALL_HEADS, {k: v[None] for k, v in arrays.items()})

    def _stats(self, mag: torch.Tensor, where: torch.Tensor, median: torch.Tensor | None = None) -> torch.Tensor:
        """[B, 3] float64: median |h| over the positions ``where`` ([B, T] bool) of ``mag`` [B, T, d] (``median`` [B]
        when already known), the massive entries among them (|h| > abs_threshold and > ratio x that median) and their
        number of positions (0s where none)."""
        b, t, d = mag.shape
        if median is None:
            flat = mag.masked_fill(~where[..., None], float("nan")).view(b, t * d)
            median = flat.nanmedian(dim=1).values.nan_to_num_(0.0)  # [B]
        massive = (mag > self.abs_threshold) & (mag > self.ratio * median[:, None, None]) & where[..., None]
        return torch.stack([median.double(), massive.sum((1, 2)).double(), where.sum(1).double()], 1)

    def _site_rows(
        self, stack: str, layer: int, examples: np.ndarray, heads: np.ndarray, arrays: dict[str, torch.Tensor]
    ) -> Rows:
        """Rows of one site (module docstring) from arrays [N, 1, ...]."""
        seen = arrays["seen"][..., 0].numpy()  # [N, 1]
        ok = seen > 0
        if not ok.any():
            return Rows.empty()
        n_seen = np.maximum(seen, 1e-300)
        top, stats = arrays["top"].numpy(), arrays["stats"].numpy()
        median, massive, positions = (stats[..., i] / n_seen for i in range(3))
        names = np.asarray(self.roles.names, dtype=object)
        rows = lambda metric, value, keep, query_role=ALL: cell_rows(  # noqa: E731
            stack, layer, examples, None, metric, value, positions, keep, query_role
        )
        parts = [rows(MEDIAN, median, ok), rows(COUNT, massive, ok)]
        inputs = arrays["input_stats"].numpy()
        i_median, i_massive, i_positions = (inputs[..., i] / n_seen for i in range(3))
        there = ok & (i_positions > 0)
        for metric, value in ((MEDIAN, i_median), (COUNT, i_massive)):
            parts.append(cell_rows(stack, layer, examples, None, metric, value, i_positions, there, INPUT))
        for r in range(self.top):
            present = top[..., 4, r]
            there = present > 0
            denom = np.maximum(present, 1e-300)
            value = top[..., 0, r] / denom
            role = names[np.clip(np.rint(top[..., 3, r] / denom), 0, len(names) - 1).astype(np.int64)]
            parts.append(rows(f"{TOP}{r + 1}", value, there, role))
            parts.append(rows(f"{POSITION}{r + 1}", top[..., 1, r] / denom, there, role))
            parts.append(rows(f"{DIM}{r + 1}", top[..., 2, r] / denom, there, role))
            parts.append(rows(f"{ABS_FLAG}{r + 1}", (value > self.abs_threshold).astype(np.float64), there, role))
            parts.append(rows(f"{RATIO_FLAG}{r + 1}", (value > self.ratio * median).astype(np.float64), there, role))
        return Rows.concat(parts)
