"""The reductions the built-in reducers share, against loops written out by hand."""

from __future__ import annotations

from dataclasses import replace

import torch
from analyses_helpers import random_event

from anchorlens.analyses import shared as S
from anchorlens.roles.kinds import NUM_ROLES, Role


def _fresh(event):
    return replace(event, cache={})


def test_key_columns_mark_roles_first_key_and_sink_per_example():
    """A left-padded example whose first valid key is a capsule: the first key is the capsule, the sink the
    first input key after it; padding keys belong to no column."""
    event = random_event(0, b=2, t=6, left_pad=True, lengths=[6, 4])
    roles = event.layout.k.roles.clone()
    roles[1, 2] = int(Role.CAPSULE)  # example 1: padding at 0-1, capsule at 2, input from 3
    roles[1, 3:] = int(Role.STRUCTURAL)
    event = replace(event, layout=replace(event.layout, k=replace(event.layout.k, roles=roles)))
    cols = S.key_columns(_fresh(event))
    valid = event.layout.k.valid
    for b in range(2):
        for k in range(6):
            want = torch.zeros(NUM_ROLES)
            if valid[b, k]:
                want[int(roles[b, k])] = 1.0
            assert torch.equal(cols[b, k, S.ROLE_COLUMNS], want), (b, k)
    first = [int(valid[b].nonzero()[0]) for b in range(2)]
    assert [int(cols[b, :, S.FIRST_KEY].argmax()) for b in range(2)] == first == [0, 2]
    assert int(cols[1, :, S.SINK_KEY].argmax()) == 3 and float(cols[1, :, S.SINK_KEY].sum()) == 1.0


def test_column_mass_and_plogp_are_sums_over_each_columns_keys():
    event = random_event(1, b=3, h=2, t=7)
    p = event.probs
    cols = S.key_columns(_fresh(event))
    mass = S.column_mass(_fresh(event))
    plogp = S.column_plogp(_fresh(event))  # no logits on this event: the xlogy route
    assert cols.shape[-1] == S.num_columns(NUM_ROLES)
    for c in range(S.num_columns(NUM_ROLES)):
        keys = cols[:, None, None, :, c]  # [B, 1, 1, K]
        torch.testing.assert_close(mass[..., c], (p * keys).sum(-1))
    assert plogp.shape[-1] == 2
    valid = event.layout.k.valid[:, None, None, :].float()
    content = valid * (event.layout.k.roles == int(Role.CONTENT))[:, None, None, :]
    for i, keys in enumerate((valid, content)):
        torch.testing.assert_close(plogp[..., i], (torch.xlogy(p, p) * keys).sum(-1), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(mass[..., S.VALID_KEY], (p * valid).sum(-1))
    torch.testing.assert_close(mass[..., S.CONTENT_KEY], (p * content).sum(-1))


def test_logits_route_gives_the_xlogy_value():
    """With logits and log_norm (log p = s - log Z where p > 0) no logarithm over [q, K] is taken."""
    event = random_event(2, b=2, h=3, t=6, left_pad=False)
    p = event.probs
    logits = torch.where(p > 0, p.clamp_min(1e-30).log() + 4.0, torch.finfo(torch.float32).min)
    with_logits = replace(event, scores=logits, log_norm=torch.full(p.shape[:3] + (1,), 4.0), cache={})
    torch.testing.assert_close(S.column_plogp(with_logits), S.column_plogp(_fresh(event)), atol=1e-5, rtol=1e-5)


def test_an_event_over_a_key_prefix_sums_like_the_full_event():
    """Causal chunks carry only the keys up to their last query; the hidden tail adds nothing."""
    event = random_event(3, b=2, h=2, t=8, left_pad=False, causal=True)
    head = replace(event, probs=event.probs[:, :, :4, :4], visible=event.visible[:, :, :4, :4], cache={})
    head = replace(head, layout=replace(head.layout, q=replace(head.layout.q, roles=head.layout.q.roles[:, :4])))
    head = replace(head, layout=replace(head.layout, q=replace(head.layout.q, valid=head.layout.q.valid[:, :4])))
    assert head.key_count == 4 and head.full_probs().shape[-1] == 8
    valid = head.layout.q.valid[:, None, :, None]  # padding queries hold garbage rows over every key
    assert valid.any()
    full = S.column_mass(_fresh(event))[:, :, :4]
    torch.testing.assert_close(S.column_mass(head) * valid, full * valid)


def test_column_mass_takes_the_captures_sums_only_over_its_own_columns():
    """The capture's fused sums are used when they are over the very tensor the reducers ask for; sums over other
    columns (another sink's) are ignored and the probabilities summed again."""
    event = random_event(4, b=2, h=2, t=6)
    ours = S.columns_of_layout(event.layout, event.probs.device, event.probs.dtype)
    assert ours is S.columns_of_layout(event.layout, event.probs.device, event.probs.dtype)  # one tensor per layout
    true = S.column_mass(_fresh(event))
    marker = torch.full_like(true, 7.0)  # not a sum of these probabilities: shows which route was taken
    taken = S.column_mass(replace(event, key_sums=marker, key_columns=ours, cache={}))
    assert torch.equal(taken, marker)
    other = ours.clone()
    ignored = S.column_mass(replace(event, key_sums=marker, key_columns=other, cache={}))
    torch.testing.assert_close(ignored, true)


def test_reducers_ask_for_the_columns_they_read():
    """Reducers reading the column sums ask for the layout's columns; an anchor gathered elsewhere asks for none."""
    from anchorlens.analyses.registry import make_reducer

    event = random_event(5, b=2, h=2, t=6)
    ours = S.columns_of_layout(event.layout, event.probs.device, event.probs.dtype)
    for name in ("role_flow", "first_token", "entropy", "decomposition"):
        assert make_reducer(name).key_columns(event.layout, event.probs.device, event.probs.dtype) is ours, name
    assert make_reducer("first_token", anchor_position=2).key_columns(event.layout, "cpu", torch.float32) is None
