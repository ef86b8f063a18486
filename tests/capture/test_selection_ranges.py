"""Ranges on the command line (--layers, --heads, --map-layers) are checked against the model as written, before any
index is built: ``0-10000000`` is one line naming the flag, the range and the model's valid range, exit 2, with
nothing allocated for it; ranges within the model become the same tuples as before."""

from __future__ import annotations

import dataclasses
import tracemalloc

import pytest
from typer.testing import CliRunner

from anchorlens.capture.run import check_selection
from anchorlens.capture.selection import Selection, parse_indices, parse_ranges
from anchorlens.cli import app
from anchorlens.cli.options import MeanMapOptions, SelectionOptions
from anchorlens.errors import UsageError
from anchorlens.methods.spec import load_guided

HUGE = 10_000_000  # a list of these would take hundreds of MB; checked as a range it takes nothing


def refused_without_building(model, selection: Selection) -> str:
    """The one-line refusal of ``selection`` by ``model``, and that the check allocated under 1 MB."""
    tracemalloc.start()
    try:
        with pytest.raises(UsageError) as err:
            check_selection(model, selection)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"the check allocated {peak:,} bytes"
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize(
    ("layers", "heads", "message"),
    [
        (f"0-{HUGE}", None, f"--layers 0-{HUGE} is out of range: this base has 4 layers (0..3, or -4..-1)"),
        (f"1,-{HUGE}--1", None, f"--layers -{HUGE}--1 is out of range: this base has 4 layers (0..3, or -4..-1)"),
        (None, f"2-{HUGE}", f"--heads 2-{HUGE} is out of range: this base has 4 heads (0..3, or -4..-1)"),
    ],
)
def test_a_huge_range_is_refused_against_the_model_before_it_is_built(tiny_base, layers, heads, message):
    model = load_guided("base", tiny_base("tiny-llama"))
    selection = SelectionOptions(layers=layers, heads=heads).selection()
    assert refused_without_building(model, selection) == message


def test_map_layers_are_checked_as_written(tiny_base):
    model = load_guided("base", tiny_base("tiny-llama"))
    map_layers = MeanMapOptions(map_layers=f"0-{HUGE}").workflow_kwargs()["map_layers"]
    message = refused_without_building(model, Selection.written(layers=map_layers))
    assert message == f"--map-layers 0-{HUGE} is out of range: this base has 4 layers (0..3, or -4..-1)"


def test_ranges_within_the_model_are_the_indices_as_before(tiny_base):
    model = load_guided("base", tiny_base("tiny-llama"))
    selection = SelectionOptions(layers="0,2-3,-1", heads="1-2").selection()
    check_selection(model, selection)
    assert selection.layers == (0, 2, 3, -1) and type(selection.layers) is tuple and selection.heads == (1, 2)
    assert dataclasses.asdict(selection) == dataclasses.asdict(Selection(layers=(0, 2, 3, -1), heads=(1, 2)))
    assert parse_indices("0,2-3,-1") == (0, 2, 3, -1)


def test_a_range_without_a_model_is_never_built():
    ranges = parse_ranges("0-1000000000", "--layers")
    assert ranges is not None and len(ranges) == 1_000_000_001 and ranges.outside(30) == (0, 1_000_000_000)
    with pytest.raises(UsageError, match=r"^--heads 0-1000000000 names 1,000,000,001 indices, more than any model"):
        parse_indices("0-1000000000", "--heads")


def test_capture_refuses_a_huge_range_in_one_line(tmp_path):
    out = tmp_path / "out"
    args = ["capture", "--ckpt", "base", "--base", "tiny-llama", "--n", "2", "--layers", f"0-{HUGE}", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [f"error: --layers 0-{HUGE} is out of range: this base has 4 layers (0..3, or -4..-1)"]
    assert not out.exists() or not any(out.iterdir())
