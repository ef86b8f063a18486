"""Causal knockouts: block attention to keys of a role or position at chosen layers and heads.

Spec ``knockout:keys=instance,layers=10-20,mode=renorm`` (composed after the methods that insert the keys:
``instance+knockout:keys=instance``). The knockout inserts nothing; during every forward of its GuidedModel
(plain forwards for evaluation and logits, and captures alike) the engine's attention function
(:mod:`anchorlens.engine.attention`) asks the active edit, :meth:`KnockoutForward.call_edit`, which (query, key)
weights to remove at the module it runs, and applies the mode:

- ``renorm``: the keys are masked before the softmax (the other keys share the mass; a query left with no key
  gets a zero output);
- ``zero``: the keys' weights are zeroed after the softmax, no renormalisation (the weights sum to less than 1);
- ``value``: the keys' values are zeroed for the selected queries and heads (the weights stay as they were, so
  a capture still reports them; the keys contribute nothing to the output);
- ``mean``: mean ablation of the keys. The selected queries and heads read the keys' key and value vectors as
  computed from a dataset mean instead of the key's own state: at each selected layer, the attention's input (the
  layer's hidden state after its input normalisation) at the selected keys is replaced by its mean over every
  selected key of every example of the run, from a first pass with the same model and inputs and no knockout
  (:mod:`anchorlens.methods.knockout_mean`). The keys' own rows (their queries, their residual stream, the layers
  above) are untouched: only what the selected queries read from them changes. The key and value are computed by
  the attention module itself from the mean (its projections, biases, key norm and rotary embedding at the key's
  own position), so with the usual linear projections this is exactly a position-independent mean ablation of the
  pre-rotary key and value (TransformerLens's ``hook_k``/``hook_v``, not ``hook_rot_k``); with a key norm (Qwen3,
  Gemma 3) the key is the norm of the mean input's projection, not the mean key. The mean is of the normalised
  input, not the residual stream (the normalisation is not linear: the two differ). It needs the first pass: the
  workflows make it (one extra forward over the run's inputs); a model loaded directly needs
  ``GuidedModel.prepare(batches)`` before it runs (a forward without it is a one-line UsageError).
  Not on encoder-decoder bases (T5); prefix keys (prefix tuning) have no hidden state and cannot be mean-ablated.

``zero`` and ``value`` give the same outputs (a key whose value is zero adds nothing, exactly as a key whose weight
is zero); they differ in the weights a capture reports.
Which keys: a role of the run (``instance``, ``capsule``, ``structural``, a task's own roles), ``first`` (each
example's first valid key) or ``pos=N`` (its N-th valid key, 0-based; negative counts from the end).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch
from torch import nn

from anchorlens.engine.attention import install
from anchorlens.engine.context import editing
from anchorlens.engine.edit import KnockoutEdit
from anchorlens.errors import UsageError
from anchorlens.methods.base import Guidance
from anchorlens.methods.config import MethodConfig
from anchorlens.models.adapters.site import Site
from anchorlens.roles.kinds import Role
from anchorlens.roles.layout import LayoutProvider, SequenceRoles
from anchorlens.roles.table import GUIDANCE_NAMES, RoleTable

KNOCKOUT_MODES = ("renorm", "zero", "value", "mean")
_ALL = "all"
_FIRST = "first"
_POS = "pos="


MOST_INDICES = 1 << 16  # more layers or heads than any model has: a longer list is refused before it is built


def parse_index_ranges(text: str, what: str) -> tuple[tuple[int, int], ...] | None:
    """``"all"`` -> None; ``"10-20"`` / ``"0/3/5-7"`` -> the inclusive ranges as written (``((10, 20),)``), checked
    for syntax and order but not expanded, so ``0-1000000000`` costs nothing until it is checked against a model."""
    text = text.strip().lower()
    if text in ("", _ALL):
        return None
    out: list[tuple[int, int]] = []
    for part in text.split("/"):
        lo, dash, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi if dash else lo)
        except ValueError:
            raise UsageError(
                f"knockout: {what}={text!r} is not a list of indices; write e.g. 10-20 or 0/3/5-7"
            ) from None
        if last < first:
            raise UsageError(f"knockout: {what}={part} is a reversed range; write {last}-{first}")
        out.append((first, last))
    return tuple(out)


def parse_index_list(text: str, what: str) -> tuple[int, ...] | None:
    """``"all"`` -> None; ``"10-20"`` / ``"0/3/5-7"`` -> sorted unique indices (ranges inclusive, ``/`` joins).

    A list of more indices than any model has layers or heads is refused before it is built."""
    ranges = parse_index_ranges(text, what)
    if ranges is None:
        return None
    if count_indices(ranges) > MOST_INDICES:
        raise UsageError(
            f"knockout: {what}={text.strip()} names more {what} than any model has; give indices within the model's "
            f"{what}"
        )
    return tuple(sorted({i for first, last in ranges for i in range(first, last + 1)}))


def count_indices(ranges: Sequence[tuple[int, int]]) -> int:
    """How many indices the inclusive ``ranges`` name (counted, not built)."""
    return sum(last - first + 1 for first, last in ranges)


def range_outside(ranges: Sequence[tuple[int, int]], low: int, high: int) -> tuple[int, int] | None:
    """The first inclusive range of ``ranges`` not within ``low..high`` (None when all are): the check of a range as
    written against a model's layers or heads, before any index of it is built."""
    return next(((first, last) for first, last in ranges if first < low or last > high), None)


def span_text(first: int, last: int) -> str:
    """A range as written (``0-1000000000``, ``5``)."""
    return str(first) if first == last else f"{first}-{last}"


def _nth_valid(valid: torch.Tensor, n: int) -> torch.Tensor:
    """[B, T] bool: True at each row's n-th valid position (negative n counts from the end); rows with too few
    valid positions have none."""
    rank = valid.long().cumsum(1) - 1  # 0-based rank of each valid position
    if n < 0:
        rank = rank - valid.long().sum(1, keepdim=True)
    return valid & (rank == n)


@dataclass(frozen=True)
class KnockoutConfig(MethodConfig):
    """Spec ``knockout``: remove attention from ``queries`` to ``keys`` at ``layers`` and ``heads`` (``mode``)."""

    name = "knockout"
    kind = "knockout"

    keys: str = field(
        default="instance",
        metadata={"doc": "keys knocked out: a role of the run (instance, capsule, structural, ...), first or pos=N"},
    )
    queries: str = field(default=_ALL, metadata={"doc": "queries that lose them: all or a role"})
    layers: str = field(default=_ALL, metadata={"doc": "all, a range 10-20 or a list 0/3/5-7 (inclusive)"})
    heads: str = field(default=_ALL, metadata={"doc": "all, a range or a list of head indices (0/2/4-7)"})
    mode: Literal["renorm", "zero", "value", "mean"] = field(
        default="renorm",
        metadata={
            "doc": "renorm (masked before the softmax), zero (after it), value (the keys' values zeroed), mean (the "
            "keys' key and value computed from their dataset-mean hidden state, from a first pass)"
        },
    )

    def __post_init__(self) -> None:
        """Check the choices, the index lists and the key/query names (before any model is touched)."""
        for name in ("keys", "queries", "layers", "heads"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise UsageError(f"knockout: option {name} needs a value; got {value!r}")
            value = value.strip().lower()
            if name in ("keys", "queries") and not value.startswith(_POS):  # role names: - is _ (pos=-1 stays)
                value = value.replace("-", "_")
            object.__setattr__(self, name, value)
        super().__post_init__()
        parse_index_ranges(self.layers, "layers")  # syntax only: the bounds are the model's (``bind``)
        parse_index_ranges(self.heads, "heads")
        self.key_position()

    def to_spec(self) -> str:
        """The spec text, ``keys`` always written (``knockout:keys=instance,layers=10-20``)."""
        text = super().to_spec()
        if f"keys={self.keys}" in text.split(":", 1)[-1].split(","):
            return text
        rest = text.partition(":")[2]
        return f"{self.name}:keys={self.keys}" + (f",{rest}" if rest else "")

    def count(self) -> int:
        """A knockout inserts no position."""
        return 0

    def key_position(self) -> int | None:
        """N of ``keys=pos=N`` (``first`` is 0); None when the keys are a role."""
        if self.keys == _FIRST:
            return 0
        if not self.keys.startswith(_POS):
            return None
        try:
            return int(self.keys[len(_POS) :])
        except ValueError:
            raise UsageError(f"knockout: keys={self.keys} needs an integer position; write e.g. keys=pos=0") from None

    def layer_indices(self) -> tuple[int, ...] | None:
        """The selected layers (None: all)."""
        return parse_index_list(self.layers, "layers")

    def head_indices(self) -> tuple[int, ...] | None:
        """The selected heads (None: all)."""
        return parse_index_list(self.heads, "heads")

    def role_names(self) -> tuple[str, ...]:
        """The role names this knockout reads (keys and queries that are roles)."""
        names = [] if self.key_position() is not None else [self.keys]
        return tuple(names + ([] if self.queries == _ALL else [self.queries]))


class Knockout(Guidance):
    """A knockout: no parameters, no positions; its masks are applied by the attention function."""

    kind = "knockout"
    spec_name = "knockout"
    role = Role.SPECIAL  # unused: a knockout inserts nothing
    level = "knockout"
    config: KnockoutConfig

    def __init__(
        self, keys: str = "instance", queries: str = _ALL, layers: str = _ALL, heads: str = _ALL, mode: str = "renorm"
    ) -> None:
        super().__init__(KnockoutConfig(keys=keys, queries=queries, layers=layers, heads=heads, mode=mode))  # type: ignore[arg-type]
        self.num_heads = 0
        # mode=mean: (stack, layer) -> [d] float32 mean of the attention input at the selected keys (first pass)
        self.means: dict[tuple[str, int], torch.Tensor] | None = None
        self.first_pass: dict[str, Any] = {}

    def bind(self, base, generator: torch.Generator) -> None:
        """Check the layers and heads against ``base`` (one line naming the valid range); nothing is allocated."""
        adapter = base.adapter
        if self.config.mode == "mean" and base.is_encoder_decoder:
            raise UsageError(
                f"{self.describe()}: mode=mean is not available on encoder-decoder bases ({base.spec}: its "
                "cross-attention keys are another stack's states); use mode=renorm, zero or value"
            )
        self.stacks = tuple(adapter.stacks())
        self.layers = {s: adapter.num_layers(base.model, s) for s in self.stacks}
        most = max(self.layers.values())
        bad = range_outside(parse_index_ranges(self.config.layers, "layers") or (), 0, most - 1)  # none built yet
        if bad is not None:
            raise UsageError(
                f"{self.describe()}: layers {span_text(*bad)} is outside the model; {base.spec} has {most} "
                f"layers (0-{most - 1})"
            )
        self.num_heads = int(base.num_heads)
        bad = range_outside(parse_index_ranges(self.config.heads, "heads") or (), 0, self.num_heads - 1)
        if bad is not None:
            raise UsageError(
                f"{self.describe()}: heads {span_text(*bad)} is outside the model; {base.spec} has "
                f"{self.num_heads} heads per layer (0-{self.num_heads - 1})"
            )
        self.bound = True

    def check_reach(self, lengths: Sequence[int], inserted: int = 0) -> None:
        """UsageError (one line) when ``keys=pos=N`` lies beyond every input of the run, so that the knockout would
        remove no key at all: ``lengths`` are the run's inputs' token counts (as encoded, truncation included),
        ``inserted`` the most positions the model's guidances add to a sequence. A position some input may reach
        passes (the knockout then acts on the inputs long enough)."""
        n = self.config.key_position()
        if n is None or not len(lengths):
            return
        longest = max(int(x) for x in lengths)
        reach = longest + max(int(inserted), 0)  # the most keys any example can have
        if (n >= reach) if n >= 0 else (-n > reach):
            extra = f", {reach} keys with the {inserted} inserted positions" if inserted > 0 else ""
            fix = f"N < {reach}" if n >= 0 else f"N >= -{reach}"
            raise UsageError(
                f"{self.describe()} removes no key in any of the {len(lengths):,} inputs (longest {longest:,} "
                f"tokens{extra}); choose keys=pos=N with {fix}, or first"
            )

    def check_roles(self, table: RoleTable | None, inserted: tuple[str, ...]) -> None:
        """UsageError (one line) when a role the knockout names is a guidance role no guidance of the model inserts
        (``inserted``), or is not in the run's ``table`` (None: not known yet)."""
        for name in self.config.role_names():
            if name in GUIDANCE_NAMES and name not in inserted:
                method = "prompt" if name == "soft_prompt" else name
                raise UsageError(
                    f"{self.describe()}: the model inserts no {name} positions; put the method that inserts them "
                    f"before the knockout (e.g. {method}+{self.describe()})"
                )
            if table is not None and name not in table.names:
                raise UsageError(
                    f"{self.describe()}: this run has no role {name!r}; its roles are {', '.join(table.names)} "
                    "(or use keys=first / keys=pos=N)"
                )

    # ------------------------------------------------------------------ mode=mean: the first pass's means
    @property
    def needs_first_pass(self) -> bool:
        """Whether this knockout needs dataset means it has not got yet (mode=mean before its first pass)."""
        return self.config.mode == "mean" and self.means is None

    def set_means(self, means: dict[tuple[str, int], torch.Tensor], facts: dict[str, Any]) -> None:
        """Keep the first pass's means ((stack, layer) -> [d]) and what the pass saw (``facts``: examples, keys)."""
        self.means = {site: m.detach().float() for site, m in means.items()}
        norms = {str(layer): round(float(m.norm()), 6) for (_, layer), m in sorted(self.means.items())}
        self.first_pass = {**facts, "mean_norm": norms}

    def check_prepared(self) -> None:
        """UsageError (one line naming the fix) when a mean knockout has not had its first pass."""
        if self.needs_first_pass:
            raise UsageError(
                f"{self.describe()} needs the dataset mean of the keys' hidden state from a first pass over the run's "
                "inputs: run it through anchorlens evaluate/compare/capture/sweep knockout (they make that pass), "
                "or call model.prepare(batches) before the forward"
            )

    def mean_at(self, site: Site) -> torch.Tensor:
        """[d] float32: the mean hidden state that replaces the keys at ``site`` (UsageError before a first pass)."""
        self.check_prepared()
        assert self.means is not None
        return self.means[(site.stack, site.layer)]

    # ------------------------------------------------------------------ masks
    def _role_mask(self, seq: SequenceRoles, name: str) -> torch.Tensor:
        """[B, T] bool: valid positions of role ``name``."""
        try:
            rid = seq.table.id(name)
        except ValueError:
            raise UsageError(
                f"{self.describe()}: this run has no role {name!r}; its roles are {', '.join(seq.table.names)}"
            ) from None
        return seq.valid.bool() & (seq.roles == rid)

    def key_mask(self, keys: SequenceRoles) -> torch.Tensor:
        """[B, K] bool: the keys knocked out."""
        n = self.config.key_position()
        return _nth_valid(keys.valid.bool(), n) if n is not None else self._role_mask(keys, self.config.keys)

    def query_mask(self, queries: SequenceRoles) -> torch.Tensor:
        """[B, Q] bool: the queries that lose the keys."""
        if self.config.queries == _ALL:
            return torch.ones_like(queries.valid, dtype=torch.bool)
        return self._role_mask(queries, self.config.queries)

    def applies(self, site: Site) -> bool:
        """Whether the knockout acts at ``site``."""
        layers = self.config.layer_indices()
        return layers is None or site.layer in layers

    def head_mask(self, num_heads: int, device: torch.device) -> torch.Tensor | None:
        """[H] bool of the selected heads, or None for all."""
        heads = self.config.head_indices()
        if heads is None:
            return None
        mask = torch.zeros(num_heads, dtype=torch.bool, device=device)
        mask[list(heads)] = True
        return mask


# ---------------------------------------------------------------------- the edit one attention call applies
@dataclass
class KnockoutForward:
    """The knockouts active for one forward: attention modules to sites, and the roles at every site.

    The engine's edit (:class:`~anchorlens.engine.edit.AttentionEditor`): :meth:`record` and :meth:`call_edit`."""

    knockouts: tuple[Knockout, ...]
    sites: dict[int, Site]
    layout: LayoutProvider
    cache: dict[tuple[int, int, int], KnockoutEdit | None] = field(default_factory=dict)
    # the edits of modules whose knockouts, roles and shapes agree are one object (capture keys work on its tensors)
    shared: dict[tuple, tuple[tuple, KnockoutEdit]] = field(default_factory=dict)
    # mode=mean: the module whose K/V are being recorded from the mean state, and id(module) -> (key, value) recorded
    recording: nn.Module | None = None
    mean_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def record(self, module: nn.Module, key: torch.Tensor, value: torch.Tensor) -> bool:
        """True when this call of ``module`` only computes a mean knockout's key/value (key, value [B, H_kv, K, D]):
        they are kept for the real call, and the attention function skips its own math."""
        if self.recording is not module:
            return False
        self.mean_kv[id(module)] = (key, value)
        return True

    def call_edit(self, module: nn.Module, query: torch.Tensor, key: torch.Tensor) -> KnockoutEdit | None:
        """The edit these knockouts make to the call of ``module`` (query [B, H, Q, D], key [B, H_kv, K, D])."""
        return self.edit(module, query.shape[1], query.shape[2], key.shape[2], query.device)

    def edit(
        self, module: nn.Module, num_heads: int, q_len: int, k_len: int, device: torch.device
    ) -> KnockoutEdit | None:
        """The edit of the call of ``module`` (None where no knockout acts)."""
        key = (id(module), q_len, k_len)
        if key not in self.cache:
            self.cache[key] = self._build(module, num_heads, q_len, k_len, device)
        edit = self.cache[key]
        if edit is None or edit.mean is None:
            return edit
        if id(module) not in self.mean_kv:
            raise RuntimeError("knockout mode=mean: the attention call ran without its recorded mean key/value")
        mean_key, mean_value = self.mean_kv[id(module)]
        return replace(edit, mean_key=mean_key, mean_value=mean_value)

    def _build(
        self, module: nn.Module, num_heads: int, q_len: int, k_len: int, device: torch.device
    ) -> KnockoutEdit | None:
        site = self.sites.get(id(module))
        if site is None:
            return None
        acting = [k for k in self.knockouts if k.applies(site)]
        if not acting:
            return None
        layout = self.layout.layout(site.stack, site.layer)
        kept = (layout.q.roles, layout.q.valid, layout.k.roles, layout.k.valid)
        same = (tuple(id(k) for k in acting), *(id(t) for t in kept), num_heads, q_len, k_len, str(device))
        hit = self.shared.get(same)
        if hit is not None and all(a is b for a, b in zip(hit[0], kept, strict=True)):
            return hit[1]
        masks: dict[str, torch.Tensor] = {}
        for ko in acting:
            keys = ko.key_mask(layout.k).to(device)[:, :k_len]
            queries = ko.query_mask(layout.q).to(device)[:, -q_len:]
            mask = queries[:, None, :, None] & keys[:, None, None, :]  # [B, 1, Q, K]
            heads = ko.head_mask(num_heads, device)
            if heads is not None:
                mask = mask & heads.view(1, -1, 1, 1)
            slot = {"renorm": "before", "zero": "after", "value": "value", "mean": "mean"}[ko.config.mode]
            masks[slot] = mask if slot not in masks else masks[slot] | mask
        edit = KnockoutEdit(**masks)
        self.shared[same] = (kept, edit)  # the layout tensors kept alive: their ids stay theirs
        return edit


def install_attention(model: nn.Module) -> None:
    """Switch ``model`` to the engine's attention function (:mod:`anchorlens.engine.attention`), which applies the
    active knockouts."""
    install(model)


@contextmanager
def knockouts_active(forward: KnockoutForward) -> Iterator[KnockoutForward]:
    """Make ``forward``'s knockouts the engine's active edit for the duration of the block."""
    with editing(forward):
        yield forward
