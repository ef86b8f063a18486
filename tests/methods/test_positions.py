"""Insertion positions land at the right index per example, for left- and right-padded batches."""

from __future__ import annotations

import pytest
import torch

from anchorlens.errors import UsageError
from anchorlens.methods import Capsule, GuidedModel, InstanceToken, Position
from anchorlens.roles.kinds import Role
from anchorlens.roles.layout import SequenceRoles

from .helpers import rte_batch


def _valid_positions(mask_row: torch.Tensor) -> list[int]:
    return mask_row.nonzero().view(-1).tolist()


def _expected(batch, row: int, position) -> int:
    """Where the inserted position should sit in the spliced sequence (hand computation)."""
    pos = _valid_positions(batch.attention_mask[row])
    roles = batch.roles[row].tolist()
    if position == "first":
        return pos[0]
    if position == "last":
        return pos[-1] + 1
    if position == "middle":
        return pos[len(pos) // 2]
    if position == "after_structural":
        i = next(p for p in pos if roles[p] == int(Role.STRUCTURAL))
        while i < len(roles) and roles[i] == int(Role.STRUCTURAL) and batch.attention_mask[row, i]:
            i += 1
        return i
    k = position if position >= 0 else len(pos) + position
    return pos[k] if k < len(pos) else pos[-1] + 1


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("position", ["first", "middle", "last", "after_structural", 0, 3, -2])
@pytest.mark.parametrize("method", ["capsule", "instance"])
def test_inserted_role_index(tiny_base, padding_side, position, method):
    base = tiny_base("tiny-llama")
    batch = rte_batch(base, padding_side)
    g = Capsule(position=position) if method == "capsule" else InstanceToken(position=position)
    layout = GuidedModel(base, [g]).layout(batch).layout("decoder", 1)
    role = int(g.role)
    for row in range(batch.batch_size):
        roles = layout.q.roles[row].tolist()
        assert roles.count(role) == 1
        assert roles.index(role) == _expected(batch, row, position), (row, roles)
        # everything else is the input in order
        rest = [r for i, r in enumerate(roles) if i != roles.index(role)]
        assert rest == batch.roles[row].tolist()


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("position", ["first", "middle", "last", 3, -2])
@pytest.mark.parametrize("fusion,count", [("add", 2), ("prepend", 3), ("project", 2)])
def test_capsule_count_positions_sit_together_at_every_layer(tiny_base, padding_side, position, fusion, count):
    """capsule:n=2 inserts n (prepend: n + 1) CAPSULE positions side by side where one capsule would go."""
    base = tiny_base("tiny-llama")
    batch = rte_batch(base, padding_side)
    g = Capsule(n=2, fusion=fusion, position=position)
    assert g.count() == count
    provider = GuidedModel(base, [g]).layout(batch)
    for layer in range(base.num_layers):
        layout = provider.layout("decoder", layer)
        assert layout.q.roles.shape == (batch.batch_size, batch.input_ids.shape[1] + count)
        for row in range(batch.batch_size):
            roles = layout.q.roles[row].tolist()
            at = _expected(batch, row, position)
            assert roles.count(int(Role.CAPSULE)) == count
            assert roles[at : at + count] == [int(Role.CAPSULE)] * count, (layer, row, roles)
            assert bool(layout.q.valid[row, at : at + count].all())
            assert roles[:at] + roles[at + count :] == batch.roles[row].tolist()


def test_integer_position_equal_to_length_means_after_last(tiny_base):
    base = tiny_base("tiny-llama")
    batch = rte_batch(base, "right")
    shortest = int(batch.attention_mask.sum(1).min())
    idx = Position(shortest).resolve(batch.input_sequence())
    row = int(batch.attention_mask.sum(1).argmin())
    assert int(idx[row]) == shortest


@pytest.mark.parametrize("position", [10_000, -10_000])
def test_position_beyond_sequence_is_usage_error(tiny_base, position):
    base = tiny_base("tiny-llama")
    batch = rte_batch(base, "left")
    guided = GuidedModel(base, [Capsule(position=position)])
    with pytest.raises(UsageError, match="beyond example"):
        guided.forward(batch)
    with pytest.raises(UsageError, match="beyond example"):
        guided.layout(batch)


def test_after_structural_without_structural_is_usage_error():
    seq = SequenceRoles(torch.tensor([[int(Role.CONTENT)] * 3]), torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(UsageError, match="structural"):
        Position("after_structural").resolve(seq)


@pytest.mark.parametrize("text", ["nowhere", "1.5", ""])
def test_bad_position_names(text):
    with pytest.raises(UsageError, match="first, after_structural"):
        Position.parse(text)


def test_start_is_before_left_padding(tiny_base):
    base = tiny_base("tiny-llama")
    batch = rte_batch(base, "left")
    assert Position.parse("start").resolve(batch.input_sequence()).tolist() == [0] * batch.batch_size
