"""The observer protocol: what a statistics sink (the capture session) supplies to each attention call.

An observer says which attention modules it watches (sites) and which heads, how the engine may compute there
(``fast`` or ``strict`` output, a memory budget), lends reusable buffers and a per-forward cache, and receives the
probabilities of every chunk of queries (:meth:`Observer.emit`). :mod:`anchorlens.capture.session` implements it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from anchorlens.engine.call import KeySpan
from anchorlens.models.adapters.site import Site


class ObserverOptions(Protocol):
    """How the engine computes at an observed site."""

    @property
    def mode(self) -> str:
        """``"fast"``: the output from the probabilities of all heads; else sdpa's output, probabilities apart."""
        ...

    @property
    def memory_budget(self) -> int:
        """Bytes the float32 buffers of one chunk of queries may use at once."""
        ...

    @property
    def plan(self) -> str:
        """``"auto"``, ``"kernel"`` or ``"materialised"`` (:mod:`~anchorlens.engine.plan`)."""
        ...


class SharedCache(Protocol):
    """Work keyed on the tensors every layer of a forward shares (masks, layouts), done once per forward."""

    def get(self, keys: tuple, compute: Callable[[], Any]) -> Any:
        """``compute()`` unless the very same ``keys`` were seen before (then the cached value)."""
        ...


class Observer(Protocol):
    """What the active observer supplies to, and receives from, every call of the engine's attention function."""

    @property
    def options(self) -> ObserverOptions:
        """Output mode and memory budget."""
        ...

    @property
    def shared(self) -> SharedCache:
        """The per-forward cache (visibility, edited visibility and key columns are kept there)."""
        ...

    @property
    def reads(self) -> frozenset[str]:
        """The quantities the observer's sink reads (:mod:`~anchorlens.engine.quantities`)."""
        ...

    def readers(self, quantity: str) -> list[str]:
        """Who reads ``quantity`` (names, for messages)."""
        ...

    def note_plan(self, site: Site, plan: str) -> None:
        """The plan the engine took at ``site`` (recorded for the run's manifest)."""
        ...

    @property
    def wants_value_norms(self) -> bool:
        """Whether the engine computes ||v_j W_O^h|| once per observed call and hands them over."""
        ...

    def site_of(self, module: torch.nn.Module) -> Site | None:
        """The site of an attention module, or None if it is not observed."""
        ...

    def heads_tensor(self, device: torch.device) -> torch.Tensor | None:
        """[H_sel] long indices of the observed heads on ``device``, or None for all heads."""
        ...

    def key_columns(self, site: Site, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """[B, K, C] key columns whose probability sums the observer reads at ``site``, or None."""
        ...

    def score_columns(self, site: Site, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """[B, K, S] weight columns whose score sums the observer reads at ``site``, or None."""
        ...

    def valid_queries(self, site: Site, device: torch.device) -> torch.Tensor:
        """[B, Q] bool: the call's queries that are real positions (not padding), whose received mass
        (``received``) the engine sums."""
        ...

    def scratch_buffer(self, name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A flat buffer of at least ``numel`` elements, reused by every call (``"logits"``, ``"probs"``,
        ``"value_columns"``: the engine's)."""
        ...

    def emit(
        self,
        site: Site,
        probs: torch.Tensor | None,
        visible: torch.Tensor | KeySpan,
        query_start: int = 0,
        scores: torch.Tensor | None = None,
        log_norm: torch.Tensor | None = None,
        key_sums: torch.Tensor | None = None,
        key_columns: torch.Tensor | None = None,
        learned_sink: torch.Tensor | None = None,
        value_norms: torch.Tensor | None = None,
        score_sums: torch.Tensor | None = None,
        score_columns: torch.Tensor | None = None,
        plan: str = "materialised",
        received: torch.Tensor | None = None,
        value_sums: torch.Tensor | None = None,
    ) -> None:
        """Receive probabilities [B, H, q, K'] of queries ``query_start:query_start+q`` and the first K' keys, with
        what the engine computed beside them (see :class:`~anchorlens.capture.event.AttentionEvent`); under the
        kernel plan no probabilities (None), ``log_norm`` always, and ``received`` [B, H, K'] and ``value_sums`` [B, H, q, C] where the sink reads them."""
        ...
