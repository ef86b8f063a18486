"""Attention maps of chosen layers averaged over many examples, aligned by position (StreamingLLM's Fig. 2).

Each example's map of a layer is first averaged over the captured heads ([Q, K]); examples are then aligned
on their first position (the sequence the model attends over: a prefix guidance such as an ``<instance>`` token
or a soft prompt first, then the first input token, the sink, then the rest), so that position ``i`` of every
example lands in row/column ``i`` of one grid. A cell's mean is over the examples in which that query could see
that key: cells past an example's length, or hidden from the query by a mask (the causal upper triangle, a
window, a knockout), are not averaged in, and a cell no example could see is n/a (NaN), never 0.

The state is sums and counts on the grid ([layers, Q, K] float64 / int64), so memory is bounded by
``layers × max_positions²`` whatever the number of examples, and two states of the same options merge by
addition (distributed ranks, resumed shards). :class:`MeanMapReducer` is a streaming reducer of the capture
(``stream_statistics``); :func:`mean_attention_maps` runs it over encoded batches.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from anchorlens.capture.collect import stream_statistics
from anchorlens.capture.event import AttentionEvent
from anchorlens.capture.options import CaptureOptions
from anchorlens.capture.reducer import Reducer
from anchorlens.capture.run import CaptureTarget
from anchorlens.capture.selection import Selection
from anchorlens.roles.encoding import Encoded
from anchorlens.roles.kinds import GUIDANCE_ROLES, ROLE_NAMES
from anchorlens.tensorfile import load_tensors, save_tensors

GUIDANCE_IDS = frozenset(int(r) for r in GUIDANCE_ROLES)


def default_layers(num_layers: int) -> tuple[int, ...]:
    """StreamingLLM's choice: the first two layers, a middle one and the last (``(0, 1, 15, 29)`` for 30 layers)."""
    if num_layers <= 0:
        raise ValueError(f"a model has at least one layer, got {num_layers}")
    return tuple(sorted({0, min(1, num_layers - 1), num_layers // 2, num_layers - 1}))


def _grow(t: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """``t`` zero-padded at the end of every axis to at least ``shape``."""
    if all(have >= want for have, want in zip(t.shape, shape)):
        return t
    out = t.new_zeros(tuple(max(h, w) for h, w in zip(t.shape, shape)))
    out[tuple(slice(0, h) for h in t.shape)] = t
    return out


@dataclass
class MeanMaps:
    """Head-mean attention maps of chosen layers summed over examples on a position-aligned grid.

    sums: [L, Q, K] float64, per chosen layer (``layers``, model indices) the sum over examples of each example's
    head-mean probability of query ``i`` attending to key ``j`` (aligned positions), over the cells the query could
    see. counts: [L, Q, K] int64, how many examples each cell was visible in. q_examples / k_examples: [Q] / [K]
    int64, how many examples have a query / key at each aligned position. q_roles / k_roles: [Q, R] / [K, R]
    int64, how many examples have each role (ids of ``role_names``) at each aligned position. heads: the number of
    heads averaged; sink_positions / sink_tokens: counts of the aligned position and the text of each example's first
    input key (the sink: the first key that is not inserted guidance). ``max_positions``: the grid's query limit
    (None: the longest example). Learned-sink mass (gpt-oss) is not a key: such rows sum to less than 1.
    """

    stack: str
    layers: list[int]
    heads: int = 0
    sums: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0, 0, dtype=torch.float64))
    counts: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0, 0, dtype=torch.long))
    q_examples: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    k_examples: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    q_roles: torch.Tensor = field(default_factory=lambda: torch.zeros(0, len(ROLE_NAMES), dtype=torch.long))
    k_roles: torch.Tensor = field(default_factory=lambda: torch.zeros(0, len(ROLE_NAMES), dtype=torch.long))
    role_names: tuple[str, ...] = ROLE_NAMES
    example_ids: list[int] = field(default_factory=list)
    sink_positions: Counter = field(default_factory=Counter)
    sink_tokens: Counter = field(default_factory=Counter)
    max_positions: int | None = None

    def __post_init__(self) -> None:
        """Shape the empty state for the chosen layers."""
        if self.sums.shape[0] != len(self.layers):
            self.sums = torch.zeros(len(self.layers), 0, 0, dtype=torch.float64)
            self.counts = torch.zeros(len(self.layers), 0, 0, dtype=torch.long)

    @property
    def n_examples(self) -> int:
        """How many examples were averaged."""
        return len(self.example_ids)

    @property
    def shape(self) -> tuple[int, int]:
        """(aligned query positions, aligned key positions) of the grid."""
        return int(self.sums.shape[1]), int(self.sums.shape[2])

    def ensure(self, q: int, k: int, roles: int) -> None:
        """Grow the grid to at least ``q`` x ``k`` positions and ``roles`` role ids (zeros: no example there yet)."""
        self.sums = _grow(self.sums, (len(self.layers), q, k))
        self.counts = _grow(self.counts, (len(self.layers), q, k))
        self.q_examples = _grow(self.q_examples, (q,))
        self.k_examples = _grow(self.k_examples, (k,))
        self.q_roles = _grow(self.q_roles, (q, roles))
        self.k_roles = _grow(self.k_roles, (k, roles))

    def mean(self) -> np.ndarray:
        """[L, Q, K] float64 mean over the examples each cell was visible in; NaN where none saw it (n/a)."""
        sums, counts = self.sums.numpy(), self.counts.numpy()
        out = np.full(sums.shape, np.nan)
        np.divide(sums, counts, out=out, where=counts > 0)
        return out

    def layer(self, layer: int) -> np.ndarray:
        """[Q, K] mean map of one model layer (see :meth:`mean`)."""
        if layer not in self.layers:
            raise ValueError(f"layer {layer} was not averaged; averaged layers: {self.layers}")
        return self.mean()[self.layers.index(layer)]

    def key_role(self, position: int) -> str | None:
        """The role of aligned key ``position`` when every example that has it agrees, else None (mixed)."""
        return _agreed(self.k_roles, self.k_examples, position, self.role_names)

    def query_role(self, position: int) -> str | None:
        """The role of aligned query ``position`` when every example that has it agrees, else None (mixed)."""
        return _agreed(self.q_roles, self.q_examples, position, self.role_names)

    @property
    def sink_position(self) -> int | None:
        """The aligned position of the sink (first input key) when it is the same in every example, else None."""
        return next(iter(self.sink_positions)) if len(self.sink_positions) == 1 else None

    @property
    def sink_token(self) -> str | None:
        """The sink's token text when it is the same in every example, else None."""
        return next(iter(self.sink_tokens)) if len(self.sink_tokens) == 1 else None

    @property
    def complete_queries(self) -> int:
        """How many leading aligned query positions every example has (rows below are averaged over fewer)."""
        full = (self.q_examples == self.n_examples).tolist()
        return next((i for i, f in enumerate(full) if not f), len(full))

    def merge(self, other: MeanMaps) -> None:
        """Add the state of ``other`` (same stack, layers, heads and roles; disjoint examples)."""
        if (other.stack, other.layers, other.role_names) != (self.stack, self.layers, self.role_names):
            raise ValueError("cannot merge mean maps of other stacks, layers or role tables")
        if self.heads and other.heads and self.heads != other.heads:
            raise ValueError(f"cannot merge mean maps over {other.heads} heads into maps over {self.heads}")
        if set(self.example_ids) & set(other.example_ids):
            raise ValueError("cannot merge mean maps that share examples: each example would count twice")
        q, k = other.shape
        self.ensure(max(q, self.shape[0]), max(k, self.shape[1]), other.q_roles.shape[1])
        self.sums[:, :q, :k] += other.sums
        self.counts[:, :q, :k] += other.counts
        self.q_examples[:q] += other.q_examples
        self.k_examples[:k] += other.k_examples
        self.q_roles[:q, : other.q_roles.shape[1]] += other.q_roles
        self.k_roles[:k, : other.k_roles.shape[1]] += other.k_roles
        self.heads = self.heads or other.heads
        self.example_ids.extend(other.example_ids)
        self.sink_positions.update(other.sink_positions)
        self.sink_tokens.update(other.sink_tokens)

    def frame(self) -> pd.DataFrame:
        """Tidy rows of the visible cells: stack, layer, query, key (aligned positions), value (mean), count."""
        mean = self.mean()
        layer_i, q, k = np.nonzero(self.counts.numpy() > 0)
        return pd.DataFrame(
            {
                "stack": self.stack,
                "layer": np.asarray(self.layers, dtype=np.int64)[layer_i],
                "query": q,
                "key": k,
                "value": mean[layer_i, q, k],
                "count": self.counts.numpy()[layer_i, q, k],
            }
        )


def _agreed(counts: torch.Tensor, present: torch.Tensor, position: int, names: Sequence[str]) -> str | None:
    if position >= counts.shape[0] or int(present[position]) == 0:
        return None
    ids = torch.nonzero(counts[position]).flatten().tolist()
    return names[ids[0]] if len(ids) == 1 else None


class MeanMapReducer:
    """Streaming reducer of :class:`MeanMaps`: every event of ``stack`` at the chosen ``layers`` is averaged over its
    heads and added on the aligned grid (query chunks of one call continue where the previous chunk stopped).

    ``max_positions``: keep the first this many aligned query positions (and the keys they can see); None keeps
    every position of the longest example. Memory: layers × Q × K sums and counts, never a map per example.
    """

    name = "mean_maps"

    def __init__(self, layers: Iterable[int], stack: str = "decoder", max_positions: int | None = None) -> None:
        if max_positions is not None and max_positions < 1:
            raise ValueError(f"max_positions must be at least 1, got {max_positions}")
        self.state = MeanMaps(stack, sorted(set(int(x) for x in layers)), max_positions=max_positions)
        self._offsets: dict[int, torch.Tensor] = {}  # layer -> [B] aligned index of the next query of each row
        self._seen: set[int] = set()

    @property
    def first_layer(self) -> int:
        """The chosen layer whose events also count examples, positions and roles (once per example)."""
        return self.state.layers[0]

    def update(self, event: AttentionEvent) -> None:
        """Fold one event (or query chunk) of a chosen layer into the sums and counts."""
        state = self.state
        if event.stack != state.stack or event.layer not in state.layers:
            return
        if event.layout.table.names != state.role_names:
            if state.n_examples:
                raise ValueError("mean maps over examples of runs with other role tables")
            state.role_names = event.layout.table.names
        li = state.layers.index(event.layer)
        heads = int(event.shape[1])
        if state.heads and heads != state.heads:
            raise ValueError(f"layer {event.layer} has {heads} captured heads, layer {state.layers[0]} {state.heads}")
        state.heads = heads
        probs = event.full_probs()  # [B, H, q, K]
        b, _, q, k = probs.shape
        mean = probs.to(torch.float64).mean(dim=1).cpu()  # [B, q, K] head mean, each head weighted equally
        visible = event.visible_mask()[:, 0].cpu()  # [B|1, q, K']
        visible = torch.nn.functional.pad(visible, (0, k - visible.shape[-1])).expand(b, q, k)
        q_valid, k_valid = event.layout.q.valid.cpu(), event.layout.k.valid.cpu()
        q_roles, k_roles = event.layout.q.roles.cpu(), event.layout.k.roles.cpu()
        if event.is_first_chunk:
            self._offsets[event.layer] = torch.zeros(b, dtype=torch.long)
        offsets = self._offsets[event.layer]
        first = event.layer == self.first_layer
        cap = state.max_positions
        ids = event.example_ids.tolist()
        for row in range(b):
            qi = offsets[row] + torch.arange(int(q_valid[row].sum()))  # aligned indices of this chunk's queries
            ki = torch.arange(int(k_valid[row].sum()))
            offsets[row] += len(qi)
            qsel, ksel = torch.nonzero(q_valid[row]).flatten(), torch.nonzero(k_valid[row]).flatten()
            if cap is not None:
                keep = qi < cap
                qi, qsel = qi[keep], qsel[keep]
            if first and event.is_first_chunk:
                self._new_example(ids[row], k_roles[row][ksel], event)
            if not len(qi):
                continue
            sees = visible[row][qsel][:, ksel]  # [nq, nk]
            if cap is not None:  # keys no kept query can see are dropped (the causal triangle past the cap)
                width = int(torch.nonzero(sees.any(0)).max()) + 1 if bool(sees.any()) else 0
                ki, ksel, sees = ki[:width], ksel[:width], sees[:, :width]
            state.ensure(int(qi.max()) + 1, len(ki), len(state.role_names))
            block = mean[row][qsel][:, ksel] * sees
            state.sums[li, qi[0] : qi[-1] + 1, : len(ki)] += block
            state.counts[li, qi[0] : qi[-1] + 1, : len(ki)] += sees.long()
            if first:
                state.q_examples[qi] += 1
                state.q_roles[qi, q_roles[row][qsel]] += 1

    def _new_example(self, example: int, key_roles: torch.Tensor, event: AttentionEvent) -> None:
        """Count one example's key positions, key roles and sink position (on its first event of the first layer)."""
        state = self.state
        if example in self._seen:
            raise ValueError(f"example {example} was captured twice: its maps would count twice")
        self._seen.add(example)
        state.example_ids.append(example)
        n = len(key_roles)
        if state.max_positions is not None:  # keys a capped query can see: the first cap (+ key-only prefix)
            extra = max(0, n - int(event.layout.q.valid[event.example_ids.tolist().index(example)].sum()))
            n = min(n, state.max_positions + extra)
        state.ensure(state.shape[0], n, len(state.role_names))
        state.k_examples[:n] += 1
        state.k_roles[torch.arange(n), key_roles[:n]] += 1
        sink = next((i for i, r in enumerate(key_roles.tolist()) if r not in GUIDANCE_IDS), None)
        if sink is not None:
            state.sink_positions[sink] += 1

    def merge(self, other: Reducer) -> None:
        """Add another mean-map reducer's state (same layers, stack and cap)."""
        if not isinstance(other, MeanMapReducer):
            raise TypeError(f"cannot merge {type(other).__name__} into MeanMapReducer")
        if other.state.max_positions != self.state.max_positions:
            raise ValueError("cannot merge mean maps kept to other max_positions")
        self.state.merge(other.state)
        self._seen |= other._seen

    def state_dict(self) -> dict:
        """The state as tensors and plain values."""
        s = self.state
        return {
            "stack": s.stack,
            "layers": list(s.layers),
            "heads": s.heads,
            "sums": s.sums.clone(),
            "counts": s.counts.clone(),
            "q_examples": s.q_examples.clone(),
            "k_examples": s.k_examples.clone(),
            "q_roles": s.q_roles.clone(),
            "k_roles": s.k_roles.clone(),
            "role_names": list(s.role_names),
            "example_ids": list(s.example_ids),
            "sink_positions": dict(s.sink_positions),
            "sink_tokens": dict(s.sink_tokens),
            "max_positions": s.max_positions,
        }

    def load_state_dict(self, state: dict) -> None:
        """Replace the state with one from :meth:`state_dict`."""
        self.state = MeanMaps(
            state["stack"],
            list(state["layers"]),
            heads=int(state["heads"]),
            sums=state["sums"].clone(),
            counts=state["counts"].clone(),
            q_examples=state["q_examples"].clone(),
            k_examples=state["k_examples"].clone(),
            q_roles=state["q_roles"].clone(),
            k_roles=state["k_roles"].clone(),
            role_names=tuple(state["role_names"]),
            example_ids=list(state["example_ids"]),
            sink_positions=Counter({int(k): v for k, v in state["sink_positions"].items()}),
            sink_tokens=Counter(state["sink_tokens"]),
            max_positions=state["max_positions"],
        )
        self._seen = set(self.state.example_ids)

    def frame(self) -> pd.DataFrame:
        """The mean maps' tidy rows (see :meth:`MeanMaps.frame`)."""
        return self.state.frame()


_TENSORS = ("sums", "counts", "q_examples", "k_examples", "q_roles", "k_roles")


def save_mean_maps(maps: Mapping[str, MeanMaps], stem: str | Path) -> tuple[Path, Path]:
    """Write ``stem.safetensors`` (sums, counts, per-position example and role counts) and ``stem.json`` (the rest),
    checkpoints in order; :func:`load_mean_maps` reads them back."""
    stem = Path(stem)
    tensors: dict[str, torch.Tensor] = {}
    meta = []
    for i, (name, m) in enumerate(maps.items()):
        reducer = MeanMapReducer(m.layers, m.stack, m.max_positions)
        reducer.state = m
        state = reducer.state_dict()
        tensors.update({f"{i}/{key}": state.pop(key).contiguous() for key in _TENSORS})
        meta.append({"name": name, **state})
    st, js = stem.with_suffix(".safetensors"), stem.with_suffix(".json")
    save_tensors(tensors, st)
    js.write_text(json.dumps(meta))
    return st, js


def load_mean_maps(stem: str | Path) -> dict[str, MeanMaps]:
    """Mean maps written by :func:`save_mean_maps`, by checkpoint name in their saved order."""
    stem = Path(stem)
    tensors = load_tensors(stem.with_suffix(".safetensors"), "mean maps")
    out = {}
    for i, entry in enumerate(json.loads(stem.with_suffix(".json").read_text())):
        name = entry.pop("name")
        reducer = MeanMapReducer(entry["layers"], entry["stack"], entry["max_positions"])
        reducer.load_state_dict({**entry, **{key: tensors[f"{i}/{key}"] for key in _TENSORS}})
        out[name] = reducer.state
    return out


def _first_tokens(batch: Encoded) -> list[str]:
    """Each example's first input token (the sink's text: inserted guidance is not in ``batch.tokens``)."""
    out = []
    for row in range(batch.batch_size):
        valid = batch.attention_mask[row].bool().tolist()
        out.append(next((t for t, v in zip(batch.tokens[row], valid) if v), ""))
    return out


def mean_attention_maps(
    target: CaptureTarget,
    batches: Iterable[Encoded],
    layers: Sequence[int] | None = None,
    *,
    stack: str = "decoder",
    max_positions: int | None = None,
    options: CaptureOptions = CaptureOptions(),
) -> MeanMaps:
    """Mean attention maps of ``layers`` (default :func:`default_layers`) over every example of ``batches``.

    Only the chosen layers of ``stack`` are captured. Returns the summed state (:meth:`MeanMaps.mean` gives the maps).
    """
    if layers is None:
        layers = default_layers(int(target.adapter.num_layers(target.model, stack)))
    reducer = MeanMapReducer(layers, stack=stack, max_positions=max_positions)
    tokens: Counter = Counter()

    def recorded() -> Iterable[Encoded]:
        for batch in batches:
            tokens.update(_first_tokens(batch))
            yield batch

    selection = Selection(stacks=(stack,), layers=tuple(reducer.state.layers))
    stream_statistics(target, recorded(), [reducer], selection, options=options)
    reducer.state.sink_tokens = tokens
    return reducer.state
