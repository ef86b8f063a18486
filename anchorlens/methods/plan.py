"""A batch's insertion plan: where every guidance position goes, shared by layout and forward.

Computed from roles and padding only (never from hidden states), so ``GuidedModel.layout(batch)``
and ``GuidedModel.forward(batch)`` agree by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from anchorlens.errors import UsageError
from anchorlens.methods.base import Guidance
from anchorlens.methods.positions import Position
from anchorlens.models.adapters.splice import Splice
from anchorlens.roles.encoding import Encoded
from anchorlens.roles.kinds import Role
from anchorlens.roles.layout import Layout, SequenceRoles

_FIRST = Position("first")


@dataclass
class Spliced:
    """A splice of one sequence with its owners and the resulting roles.

    splice: old -> new geometry; owners: (guidance, first slot, end slot) in slot order;
    roles: roles and validity of the new sequence.
    """

    splice: Splice
    owners: list[tuple[Guidance, int, int]]
    roles: SequenceRoles

    def own(self, start: int, end: int) -> torch.Tensor:
        """[B, T+N] bool: positions holding slots [start, end)."""
        slot = self.splice.slot
        return (slot >= start) & (slot < end)


def splice_sequence(seq: SequenceRoles, guidances: list[Guidance], input_side: bool) -> Spliced | None:
    """Insert every guidance's positions into ``seq`` in order; positions resolve on the growing sequence.

    input_side: the sequence is the model input (positions as configured); otherwise (a T5
    decoder target) every insertion goes ``first``.
    """
    if not guidances:
        return None
    total: Splice | None = None
    owners: list[tuple[Guidance, int, int]] = []
    for g in guidances:
        n = g.count()
        index = (g.position if input_side else _FIRST).resolve(seq)
        step = Splice.insert(index, n, seq.roles.shape[1])
        seq = seq.spliced(step.apply, int(g.role), n)  # roles, validity and field groups alike
        start = 0 if total is None else total.num_slots
        owners.append((g, start, start + n))
        total = step if total is None else total.then(step)
    assert total is not None  # guidances is non-empty here
    return Spliced(total, owners, seq)


@dataclass
class Plan:
    """Everything inserted for one batch.

    inputs: the input-level splice (kept positions) or None; sequences: the kept sequences
    (``input``, ``target``); layers: per block stack, the per-layer splice at every layer (None
    where nothing is inserted); prefix: per stack, key-only positions per layer.
    """

    inputs: Spliced | None
    sequences: dict[str, SequenceRoles]
    layers: dict[str, list[Spliced | None]] = field(default_factory=dict)
    prefix: dict[str, int] = field(default_factory=dict)


def build_plan(base, guidances: list[Guidance], batch: Encoded) -> Plan:
    """The plan of ``guidances`` on ``batch`` (a UsageError if a position does not fit an example)."""
    adapter = base.adapter
    seqs = batch.sequences()
    inputs = splice_sequence(seqs["input"], [g for g in guidances if g.level == "input"], input_side=True)
    if inputs is not None:
        seqs["input"] = inputs.roles
    plan = Plan(inputs, seqs)
    for stack in adapter.guidance_stacks:
        mine = [g for g in guidances if g.level == "layer" and stack in g.stacks]
        if not mine:
            continue
        name = adapter.stack_sequences[stack][0]
        spliced = splice_sequence(seqs[name], mine, input_side=(name == "input"))
        plan.layers[stack] = [spliced] * adapter.num_layers(base.model, stack)
    prefixes = [g for g in guidances if g.level == "prefix"]
    if len(prefixes) > 1:
        raise UsageError("at most one prefix guidance can be active at a time")
    for g in prefixes:
        plan.prefix[g.stacks[0]] = g.count()
    return plan


class GuidedLayout:
    """Roles of queries and keys at every (stack, layer), inserted positions included."""

    def __init__(self, adapter, plan: Plan) -> None:
        self.adapter = adapter
        self.plan = plan

    def layout(self, stack: str, layer: int) -> Layout:
        """Layout of the attention call at ``stack``/``layer``."""
        q_name, k_name = self.adapter.stack_sequences[stack]
        block = self.adapter.block_stack(stack)
        flowing = self.adapter.stack_sequences[block][0]
        per_layer = self.plan.layers.get(block)
        spliced = per_layer[layer] if per_layer is not None else None

        def seq(name: str) -> SequenceRoles:
            if spliced is not None and name == flowing:
                return spliced.roles
            return self.plan.sequences[name]

        q, k = seq(q_name), seq(k_name)
        n = self.plan.prefix.get(stack, 0)
        if n:
            k = k.prepend(int(Role.SOFT_PROMPT), n)
        return Layout(q, k)
