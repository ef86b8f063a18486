"""Stages: the per-query values of several layers reduced at once give what one layer at a time gives."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import torch
from analyses_helpers import random_event

from anchorlens.analyses import default_reducers
from anchorlens.analyses.shared import query_roles
from anchorlens.analyses.stage import QueryStage, Stager
from anchorlens.capture.event import AttentionEvent
from anchorlens.roles.layout import Layout, SequenceRoles


def _forward(seed: int, layers: int, chunks: tuple[tuple[int, int], ...], b: int = 3, h: int = 2, t: int = 8):
    """The events of one captured forward: every layer's query chunks share the batch's id, head, layout and
    mask tensors (as the capture hands them out), only the probabilities differ."""
    base = random_event(seed, b=b, h=h, t=t, left_pad=True)
    slices = {}
    for start, stop in chunks:
        q = base.layout.q
        layout = Layout(SequenceRoles(q.roles[:, start:stop], q.valid[:, start:stop]), base.layout.k)
        slices[start, stop] = (layout, base.visible[:, :, start:stop, :stop].clone())
    events = []
    for layer in range(layers):
        probs = random_event(seed + 100 + layer, b=b, h=h, t=t, left_pad=True, lengths=base.key_valid.sum(1)).probs
        for start, stop in chunks:
            layout, visible = slices[start, stop]
            events.append(
                AttentionEvent(
                    base.stack,
                    layer,
                    base.heads,
                    probs[:, :, start:stop, :stop].contiguous(),
                    visible,
                    layout,
                    base.example_ids,
                    query_start=start,
                    query_total=t,
                )
            )
    return events


def _take_ready(stager: Stager) -> list[QueryStage]:
    ready = []
    while (stage := stager.next_ready()) is not None:
        ready.append(stage)
    return ready


def _frames(events, budget: int, slots: int) -> dict[str, pd.DataFrame]:
    """Every default reducer's frame after the events, checking that its stages held ``slots`` layers."""
    # learned_sink stages only events of modules with a learned sink, which these synthetic events are not
    reducers = [r for r in default_reducers() if r.name != "learned_sink"]
    for reducer in reducers:
        reducer._stager = Stager(budget_bytes=budget)
        for event in events:
            reducer.update(replace(event, cache={}))
        staged = [len(stage.sites) for _, stage in reducer._stager._open.values()]
        assert staged == [slots, slots] or slots == 1 and not staged, (reducer.name, staged)
    return {r.name: r.frame() for r in reducers}


def test_stacked_layers_and_chunks_reduce_like_one_event_at_a_time():
    events = _forward(0, layers=5, chunks=((0, 3), (3, 8)))
    stacked, one_by_one = _frames(events, budget=1 << 20, slots=5), _frames(events, budget=0, slots=1)
    for name, frame in stacked.items():
        want = one_by_one[name]
        assert len(frame) == len(want) > 0, name
        pd.testing.assert_frame_equal(frame, want, check_exact=False, rtol=1e-12, atol=1e-12)


def test_stages_of_one_call_hold_the_same_layers_and_a_new_batch_closes_them():
    events = _forward(1, layers=5, chunks=((0, 3), (3, 8)), b=2, h=2, t=8)
    width = 4
    per_layer = 2 * 8 * 2 * width * 4  # B · all queries · H · F · 4 bytes
    stager = Stager(budget_bytes=2 * per_layer)  # two layers per stage
    parts = lambda e: (torch.zeros(*e.probs.shape[:3], width),)  # noqa: E731
    for event in events[:6]:  # layers 0-2, both chunks
        stager.add(event, parts(event), dict)
    ready = _take_ready(stager)
    assert [(s.sites, s.query_hot_t.shape[-1]) for s in ready] == [([("decoder", 0), ("decoder", 1)], 3)] + [
        ([("decoder", 0), ("decoder", 1)], 5)
    ]
    assert len(stager._open) == 2  # layer 2's two chunks, waiting
    other_batch = replace(events[6], example_ids=events[6].example_ids.clone())
    stager.add(other_batch, parts(other_batch), dict)
    assert [s.sites for s in _take_ready(stager)] == [[("decoder", 2)], [("decoder", 2)]]
    stager.close_all()
    assert [s.sites for s in _take_ready(stager)] == [[("decoder", 3)]]


def test_role_sums_weigh_padding_queries_zero_even_when_nan():
    event = random_event(4, b=3, h=2, t=7, nan_padding=True)
    values = event.probs.double().sum(-1, keepdim=True)  # [B, H, q, 1], NaN on padding queries
    assert values.isnan().any()
    stage = QueryStage(event, capacity=2, constants={})  # float64 values: the sums are checked to 1e-7
    stage.add(event, (values,))
    stage.add(replace(event, layer=1), (2 * values,))
    sums = stage.role_sums(stage.stacked())[..., 0]  # [L, B, H, R]
    q_hot = query_roles(event)
    want = torch.einsum("bqr,bhq->bhr", q_hot, torch.nan_to_num(values[..., 0].double()) * (q_hot.sum(-1) > 0)[:, None])
    torch.testing.assert_close(sums, torch.stack([want, 2 * want]))
    assert values.isnan().any()  # the caller's tensor is not modified in place
    assert stage.full and stage.sites == [("decoder", 0), ("decoder", 1)]


def test_reducers_reading_the_same_stage_share_one_role_sum_product(monkeypatch):
    """Role flow, first token and decomposition stage the very same key-column sums; a stage that closes during an
    event is summed over query roles once for the three (the event's cache), one closed by a flush once each."""
    events = _forward(2, layers=5, chunks=((0, 3), (3, 8)))
    calls = []
    original = QueryStage.role_sums

    def counting(self, values):
        calls.append(values.shape[-1])
        return original(self, values)

    monkeypatch.setattr(QueryStage, "role_sums", counting)
    reducers = [r for r in default_reducers() if r.name not in ("entropy", "learned_sink")]
    per_layer = 3 * 2 * 8 * 10 * 4  # B · all queries · H · C key columns · 4 bytes
    for reducer in reducers:
        reducer._stager = Stager(budget_bytes=2 * per_layer)  # two layers per stage: 0-1, 2-3 full, 4 at the flush
    for event in events:
        event = replace(event, cache={})
        for reducer in reducers:
            reducer.update(event)
    assert len(calls) == 4  # (0-1, 2-3) x 2 chunks, once for all three reducers
    for reducer in reducers:
        assert "sites=5" in repr(reducer) and reducer._stager._open  # printing reduces nothing
        reducer.flush()
    assert len(calls) == 4 + 2 * 3  # layer 4's two chunk stages, once per reducer
