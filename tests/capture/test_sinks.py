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


def test_no_columns_when_no_reducer_asks_or_they_disagree():
    assert StreamSink([]).key_columns(LAYOUT, CPU, torch.float32) is None
    gathered = make_reducer("first_token", anchor_position=1)  # reads no column sum
    assert StreamSink([gathered]).key_columns(LAYOUT, CPU, torch.float32) is None
    mine = torch.ones(2, 4, 3)
    assert StreamSink([gathered, _Asks(mine)]).key_columns(LAYOUT, CPU, torch.float32) is mine
    assert StreamSink([*default_reducers(), _Asks(mine)]).key_columns(LAYOUT, CPU, torch.float32) is None
