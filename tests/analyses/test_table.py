"""Per-site sum tables and the on-device batching of one batch's sums (for groups of sites) before they reach them."""

from __future__ import annotations

import torch
from analyses_helpers import random_event

from anchorlens.analyses.registry import make_reducer
from anchorlens.analyses.table import SiteSums, SiteTable

SHAPES = {"mass": (2,), "count": ()}


def _values(seed: int, b: int = 3, h: int = 2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"mass": torch.rand(b, h, 2, generator=g), "count": torch.rand(b, h, generator=g)}


def _reference(adds) -> SiteTable:
    table = SiteTable(SHAPES)
    for ids, heads, values in adds:
        table.add(ids, heads, values)
    return table


def _one(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Values of one site as a group of one: [1, B, H, *shape]."""
    return {k: v[None] for k, v in values.items()}


def test_sums_of_one_batch_wait_on_the_device_and_equal_direct_adds():
    """Three chunks of one batch (the same id and head tensors) sum in place; a new batch commits them."""
    ids, heads = torch.tensor([7, 3, 5]), torch.tensor([0, 1])
    later_ids = torch.tensor([3, 9, 1])
    adds = [(ids, heads, _values(i)) for i in range(3)] + [(later_ids, heads, _values(9))]
    sums = SiteSums(SHAPES)
    for i, (a, h, v) in enumerate(adds[:3]):
        sums.add([("decoder", 0)], a, h, _one(v))
        assert sums._tables == {} and len(sums._pending) == 1, i  # nothing reached a table yet
    sums.add([("decoder", 0)], later_ids, heads, _one(adds[3][2]))
    assert list(sums._tables) == [("decoder", 0)] and len(sums._pending) == 1  # the first batch was committed
    got = sums.tables()[("decoder", 0)]
    want = _reference(adds)
    assert got.examples.tolist() == want.examples.tolist() == [7, 3, 5, 9, 1]
    for name in SHAPES:
        torch.testing.assert_close(got.trimmed()[name], want.trimmed()[name], rtol=0, atol=1e-12)
    assert sums._pending == {}


def test_equal_but_distinct_id_tensors_are_separate_adds_and_still_sum():
    """Identity, not equality, decides batching; an example seen twice is summed either way."""
    heads = torch.tensor([0, 1])
    adds = [(torch.tensor([1, 2, 3]), heads, _values(i)) for i in range(2)]
    sums = SiteSums(SHAPES)
    for a, h, v in adds:
        sums.add([("decoder", 1)], a, h, _one(v))
    torch.testing.assert_close(sums.table(("decoder", 1)).trimmed()["mass"], _reference(adds).trimmed()["mass"])


def test_pending_values_are_copies_not_views_of_the_callers_tensors():
    ids, heads = torch.tensor([0, 1, 2]), torch.tensor([0, 1])
    values = _values(0)
    expected = {k: v.clone().double() for k, v in values.items()}
    sums = SiteSums(SHAPES)
    sums.add([("decoder", 0)], ids, heads, _one(values))
    for v in values.values():
        v.fill_(123.0)  # the capture reuses its buffers for the next layer
    for name in SHAPES:
        torch.testing.assert_close(sums.tables()[("decoder", 0)].trimmed()[name], expected[name])


def test_groups_of_sites_add_in_one_block_broadcast_and_commit_when_a_site_moves_on():
    """A stacked add covers several sites; size-1 dims broadcast; an overlapping group commits the old one."""
    ids, heads = torch.tensor([0, 1, 2]), torch.tensor([0, 1])
    sites = [("decoder", 0), ("decoder", 1), ("decoder", 2)]
    g = torch.Generator().manual_seed(0)
    mass = [torch.rand(3, 3, 2, 2, generator=g) for _ in range(2)]  # [L, B, H, 2]
    count = torch.rand(1, 3, 1, generator=g)  # the same for every site and head
    sums = SiteSums(SHAPES)
    for m in mass:  # two chunks of the same three layers
        sums.add(sites, ids, heads, {"mass": m, "count": count})
    assert len(sums._pending) == 1 and sums._tables == {}
    sums.add(sites[1:], ids, heads, {"mass": mass[0][1:], "count": count})  # overlaps: the first group commits
    assert set(sums._tables) == set(sites) and list(sums._pending) == [tuple(sites[1:])]
    tables = sums.tables()
    for i, site in enumerate(sites):
        want_mass = mass[0][i] + mass[1][i] + (mass[0][i] if i else 0)
        want_count = count[0].expand(3, 2) * (3 if i else 2)
        torch.testing.assert_close(tables[site].trimmed()["mass"], want_mass.double())
        torch.testing.assert_close(tables[site].trimmed()["count"], want_count.double())


def test_a_site_twice_in_one_group_adds_both_slots():
    ids, heads = torch.tensor([0, 1, 2]), torch.tensor([0, 1])
    mass = torch.rand(2, 3, 2, 2)
    sums = SiteSums(SHAPES)
    sums.add([("decoder", 0), ("decoder", 0)], ids, heads, {"mass": mass, "count": torch.ones(1, 1, 1)})
    got = sums.tables()[("decoder", 0)].trimmed()
    torch.testing.assert_close(got["mass"], (mass[0] + mass[1]).double())
    torch.testing.assert_close(got["count"], torch.full((3, 2), 2.0, dtype=torch.float64))


def test_reading_merging_and_loading_a_reducer_see_pending_sums():
    """frame, state_dict and merge include the batch still pending; load_state_dict drops it."""
    events = [random_event(s, example_ids=[4, 5, 6], layer=s % 2) for s in range(4)]
    a = make_reducer("role_flow")
    for event in events:
        a.update(event)
    assert a._stager._open  # the last events are still staged
    frame = a.frame()
    assert set(frame["layer"]) == {0, 1} and not a._sums._pending and not a._stager._open
    b = make_reducer("role_flow")
    b.update(events[0])
    merged = make_reducer("role_flow")
    merged.merge(b)  # b's pending sums travel with the merge
    assert merged.state_dict()["sites"][0]["arrays"]["count"].sum() > 0
    b.update(events[1])
    b.load_state_dict(a.state_dict())
    assert not b._sums._pending and not b._stager._open
    assert b.frame().equals(frame)
