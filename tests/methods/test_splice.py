"""Splice geometry: insert, compose, remove, positions and masks on small hand-checked cases."""

from __future__ import annotations

import torch

from anchorlens.models.adapters.splice import Splice


def test_insert_apply_remove_take():
    old = torch.arange(2 * 4).view(2, 4, 1).float()
    s = Splice.insert(torch.tensor([0, 3]), 2, 4)
    new = torch.tensor([[[100.0], [101.0]], [[200.0], [201.0]]])
    x = s.apply(old, new)
    assert x[..., 0].tolist() == [[100, 101, 0, 1, 2, 3], [4, 5, 6, 200, 201, 7]]
    assert torch.equal(s.remove(x), old)
    assert torch.equal(s.take(x), new)


def test_then_composes_slots_in_order():
    a = Splice.insert(torch.tensor([1]), 1, 3)  # [o0, s0, o1, o2]
    b = Splice.insert(torch.tensor([4]), 2, 4)  # after everything
    ab = a.then(b)
    assert ab.src.tolist() == [[0, -1, 1, 2, -1, -1]]
    assert ab.slot.tolist() == [[-1, 0, -1, -1, 1, 2]]


def test_positions_match_concatenation():
    s = Splice.insert(torch.tensor([2, 0]), 2, 5)
    assert s.positions(torch.arange(5).unsqueeze(0)).tolist() == [list(range(7))] * 2
    assert s.positions(torch.arange(5).unsqueeze(0) + 3).tolist() == [list(range(3, 10))] * 2


def test_mask_extends_causal_padding_and_prefix():
    # one example, T=3 with the first position padding (left padding), a 1-column prefix
    valid_old = torch.tensor([[False, True, True]])
    causal = torch.tril(torch.ones(3, 3, dtype=torch.bool))
    body = causal & valid_old[:, None, :]
    mask = torch.cat([torch.ones(1, 3, 1, dtype=torch.bool), body], -1).unsqueeze(1)  # [1,1,3,4]
    s = Splice.insert(torch.tensor([1]), 1, 3)  # before the first valid token
    valid_new = torch.tensor([[False, True, True, True]])
    got = s.mask(mask, causal=True, valid=valid_new)[0, 0]
    want_body = torch.tril(torch.ones(4, 4, dtype=torch.bool)) & valid_new[:, None, :][0]
    want = torch.cat([torch.ones(4, 1, dtype=torch.bool), want_body], -1)
    assert torch.equal(got, want)
    assert s.mask(None, causal=True, valid=valid_new) is None
