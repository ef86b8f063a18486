"""Knockout ``mode=mean``: the first pass that averages the keys' hidden states, and the hooks that use the means.

Where a mean knockout acts, a forward pre-hook on the attention module runs the module once more on its own input
with the selected keys' rows replaced by the dataset mean (no cache, no gradient); the attention function records
that call's key and value (:meth:`~anchorlens.methods.knockout.KnockoutForward.record`) and skips its math, and the real call
reads them for the knocked-out (query, key) pairs. The module itself computes the key and value from the mean
(projections, key norm, rotary embedding at the key's own position), so the replacement is exact for any
architecture whose attention goes through the attention function. The first pass (:class:`MeanCollector`) sums the
same input at the same keys over the run's batches, with every knockout off.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch import nn

from anchorlens.errors import UsageError
from anchorlens.methods.knockout import Knockout, KnockoutForward
from anchorlens.models.adapters.site import Site
from anchorlens.roles.layout import LayoutProvider

_HIDDEN = "hidden_states"
_CACHES = ("cache", "past_key_values", "past_key_value", "layer_past")  # the cache's name across transformers versions


def mean_knockouts(knockouts: Sequence[Knockout]) -> list[Knockout]:
    """The knockouts of ``mode=mean``."""
    return [ko for ko in knockouts if ko.config.mode == "mean"]


def _hidden(args: tuple, kwargs: dict) -> torch.Tensor:
    """The attention module's input [B, T, d]: keyword ``hidden_states`` or the first positional argument."""
    hidden = kwargs.get(_HIDDEN, args[0] if args else None)
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3:
        raise UsageError(
            "knockout mode=mean cannot find the hidden state this architecture's attention reads; "
            "use mode=renorm, zero or value"
        )
    return hidden


def _with_hidden(args: tuple, kwargs: dict, hidden: torch.Tensor) -> tuple[tuple, dict]:
    """The call's arguments with ``hidden`` as its input and no key/value cache (the recording must not append)."""
    kwargs = {k: (None if k in _CACHES else v) for k, v in kwargs.items()}
    if _HIDDEN in kwargs or not args:
        return args, {**kwargs, _HIDDEN: hidden}
    return (hidden, *args[1:]), kwargs


def key_rows(ko: Knockout, layout: LayoutProvider, site: Site, length: int) -> torch.Tensor:
    """[B, T] bool: the rows of the attention input (T = ``length`` positions) that are ``ko``'s keys at ``site``.

    UsageError when a selected key has no row (a prefix-tuning key) or the call does not cover the whole sequence.
    """
    seqs = layout.layout(site.stack, site.layer)
    if seqs.q.valid.shape[1] != length:
        raise UsageError(
            f"{ko.describe()}: mode=mean needs forwards over whole sequences (the call has {length} of "
            f"{seqs.q.valid.shape[1]} positions; no generation with a key/value cache); use mode=renorm, zero or value"
        )
    keys = ko.key_mask(seqs.k)
    extra = keys.shape[1] - length  # key-only positions in front (prefix tuning)
    if extra and bool(keys[:, :extra].any()):
        raise UsageError(
            f"{ko.describe()}: mode=mean replaces a key's hidden state, and prefix keys have none; "
            "use mode=renorm, zero or value for them"
        )
    return keys[:, extra:]


@contextmanager
def mean_hooks(forward: KnockoutForward, modules: Sequence[tuple[Site, nn.Module]]) -> Iterator[None]:
    """While the block runs, every attention module where a mean knockout acts first records the key and value its
    input gives with the selected keys' rows replaced by their means (``forward.mean_kv``)."""
    means = mean_knockouts(forward.knockouts)
    hooks = []
    for site, module in modules if means else ():
        acting = [ko for ko in means if ko.applies(site)]
        if acting:
            hooks.append((module, partial(_record, forward, site, acting)))
    with _pre_hooks(hooks):
        yield


@contextmanager
def _pre_hooks(hooks: Sequence[tuple[nn.Module, Callable[..., Any]]]) -> Iterator[None]:
    """Register each (module, hook) as a forward pre-hook with keyword arguments while the block runs."""
    handles = [module.register_forward_pre_hook(hook, with_kwargs=True) for module, hook in hooks]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _record(
    forward: KnockoutForward, site: Site, acting: list[Knockout], module: nn.Module, args: tuple, kwargs: dict
) -> None:
    """Pre-hook: run ``module`` on its input with the keys' rows set to their means, recording its key and value."""
    hidden = _hidden(args, kwargs)
    replaced = hidden
    for ko in acting:
        rows = key_rows(ko, forward.layout, site, hidden.shape[1]).to(hidden.device)
        mean = ko.mean_at(site).to(hidden.device, hidden.dtype)
        replaced = torch.where(rows[..., None], mean, replaced)
    args, kwargs = _with_hidden(args, kwargs, replaced)
    forward.recording = module
    try:
        with torch.no_grad():
            module.forward(*args, **kwargs)
    finally:
        forward.recording = None


class MeanCollector:
    """The first pass: per mean knockout and site, the sum of the attention input at the knockout's keys."""

    def __init__(self, knockouts: Sequence[Knockout], modules: Sequence[tuple[Site, nn.Module]]) -> None:
        self.knockouts = mean_knockouts(knockouts)
        self.modules = list(modules)
        self.sums: dict[tuple[int, Site], torch.Tensor] = {}
        self.counts: dict[tuple[int, Site], int] = {}
        self.examples = 0

    @contextmanager
    def hooked(self, layout: LayoutProvider, batch_size: int) -> Iterator[None]:
        """While the block runs one forward of a batch of ``batch_size`` examples (``layout``: its roles), add the
        attention inputs at the keys to the sums."""
        hooks = []
        for site, module in self.modules:
            acting = [(i, ko) for i, ko in enumerate(self.knockouts) if ko.applies(site)]
            if acting:
                hooks.append((module, partial(self._add, layout, site, acting)))
        with _pre_hooks(hooks):
            yield
        self.examples += batch_size

    def _add(
        self, layout: LayoutProvider, site: Site, acting: list, module: nn.Module, args: tuple, kwargs: dict
    ) -> None:
        hidden = _hidden(args, kwargs).detach()
        for i, ko in acting:
            rows = key_rows(ko, layout, site, hidden.shape[1]).to(hidden.device)
            total = hidden[rows].double().sum(0)  # [d]
            key = (i, site)
            self.sums[key] = self.sums[key] + total if key in self.sums else total
            self.counts[key] = self.counts.get(key, 0) + int(rows.sum())

    def finish(self) -> list[dict[str, Any]]:
        """Give every knockout its means; one record per knockout (spec, examples, keys, mean norm per layer).

        UsageError when a knockout's keys never occurred in the pass.
        """
        out = []
        for i, ko in enumerate(self.knockouts):
            counts = {site: n for (j, site), n in self.counts.items() if j == i}
            if not counts or min(counts.values()) == 0:
                raise UsageError(
                    f"{ko.describe()}: the first pass over {self.examples} examples found no keys={ko.config.keys} "
                    "to average; choose keys the run's inputs have"
                )
            means = {(site.stack, site.layer): self.sums[(i, site)] / n for site, n in counts.items()}
            ko.set_means(means, {"examples": self.examples, "keys": max(counts.values())})
            out.append({"knockout": ko.describe(), **ko.first_pass})
        return out
