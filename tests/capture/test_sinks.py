"""Sinks: which key columns a stream of reducers asks the capture to sum."""

from __future__ import annotations

import torch

from anchorlens.analyses import default_reducers
from anchorlens.analyses.registry import make_reducer
from anchorlens.analyses.shared import columns_of_layout
from anchorlens.capture.sinks import StreamSink
from anchorlens.roles.layout import Layout, SequenceRoles

LAYOUT = Layout.self_attention(SequenceRoles(torch.tensor([[0, 1, 2, 2], [1, 2, 2, 0]]), torch.ones(2, 4).bool()))
CPU = torch.device("cpu")


class _Asks:
    """A custom reducer that wants sums over columns of its own."""

    name = "custom"

    def __init__(self, columns) -> None:
        self.columns = columns

    def update(self, event) -> None:
        pass

    def key_columns(self, layout, device, dtype):
        return self.columns


def test_the_reducers_shared_columns_are_asked_for():
    sink = StreamSink(default_reducers())
    assert sink.key_columns(LAYOUT, CPU, torch.float32) is columns_of_layout(LAYOUT, CPU, torch.float32)


def test_no_columns_when_no_reducer_asks():
    assert StreamSink([]).key_columns(LAYOUT, CPU, torch.float32) is None
    gathered = make_reducer("first_token", anchor_position=1)  # reads no column sum
    assert StreamSink([gathered]).key_columns(LAYOUT, CPU, torch.float32) is None
    mine = torch.ones(2, 4, 3)
    sink = StreamSink([gathered, _Asks(mine)])
    assert sink.key_columns(LAYOUT, CPU, torch.float32) is mine
    assert sink.column_parts(mine) == ()  # one reducer's own tensor: nothing joined


def test_columns_that_differ_are_joined_and_each_reducer_finds_its_own():
    """The defaults' columns and a custom reducer's sit side by side in one tensor; the sink says where each starts,
    so one pass of the engine sums both."""
    mine = torch.rand(2, 4, 3)
    sink = StreamSink([*default_reducers(), _Asks(mine)])
    joined = sink.key_columns(LAYOUT, CPU, torch.float32)
    shared = columns_of_layout(LAYOUT, CPU, torch.float32)
    assert joined is not None and joined.shape == (2, 4, shared.shape[-1] + 3)
    parts = sink.column_parts(joined)
    assert [(part is shared, part is mine, start) for part, start in parts] == [
        (True, False, 0),
        (False, True, shared.shape[-1]),
    ]
    assert torch.equal(joined[..., shared.shape[-1] :], mine) and torch.equal(joined[..., : shared.shape[-1]], shared)
    assert sink.column_parts(torch.ones(2, 4, 1)) == ()  # a tensor it did not join


class _ValueSumsReader:
    """A reducer that reads the value-weighted key sums alone (not the norms themselves)."""

    name = "value_sums_reader"
    reads = frozenset({"value_sums", "visible"})

    def update(self, event):  # pragma: no cover - never run here
        pass


def test_value_norms_are_computed_for_a_reader_of_value_sums_alone():
    """The engine weighs key columns by the value norms, so a sink whose reducers read ``value_sums`` wants the norms
    computed even when none reads ``value_norms`` by name; the default reducers want neither."""
    assert StreamSink([_ValueSumsReader()]).wants_value_norms
    assert StreamSink([make_reducer("value_mass")]).wants_value_norms
    assert not StreamSink(default_reducers()).wants_value_norms
