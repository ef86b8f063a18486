"""``--evidence`` specs parsed in one place: names, options, and one-line refusals."""

from __future__ import annotations

import pytest

from anchorlens.analyses import EVIDENCE_REDUCERS, default_reducers
from anchorlens.analyses.evidence import evidence_record, parse_evidence
from anchorlens.errors import UsageError


def test_all_is_every_evidence_reducer_in_order():
    assert parse_evidence("all") == {name: {} for name in EVIDENCE_REDUCERS}
    assert parse_evidence(None) == {} and parse_evidence([]) == {}


def test_names_and_options_after_a_colon_or_a_comma():
    spec = parse_evidence("value_mass,sink_battery:eps=0.1/0.3/0.5,top=5")
    assert spec == {"sink_battery": {"eps": [0.1, 0.3, 0.5], "top": 5}, "value_mass": {}}
    assert parse_evidence(["all", "massive_activations:abs_threshold=50"])["massive_activations"] == {
        "abs_threshold": 50.0
    }
    assert parse_evidence({"sink_battery": {"eps": [0.2]}}) == {"sink_battery": {"eps": [0.2]}}


def test_the_parsed_spec_builds_the_reducers_it_names():
    reducers = default_reducers(extra=parse_evidence("sink_battery:eps=0.1/0.5,massive_activations:ratio=10"))
    record = evidence_record(reducers)
    assert record == {
        "sink_battery": {"eps": [0.1, 0.5], "top": 3},
        "massive_activations": {"top": 3, "abs_threshold": 100.0, "ratio": 10.0},
    }


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("bogus", "unknown reducer 'bogus'"),
        ("sink_battery:eps=1.5", "outside (0, 1)"),
        ("sink_battery:eps=0", "outside (0, 1)"),
        ("sink_battery:eps=abc", "not a number"),
        ("sink_battery:top=0", "positive whole number"),
        ("sink_battery:nope=1", "has no option 'nope'"),
        ("value_mass:eps=0.3", "has no option 'eps'"),
        ("eps=0.3", "follows no reducer"),
        ("all:eps=0.3", "'all' takes no options"),
        ("sink_battery:eps", "is not KEY=VALUE"),
        (",", "is empty"),
        ("massive_activations:ratio=-1", "must be a positive number"),
    ],
)
def test_bad_specs_are_one_line_usage_errors(spec, says):
    with pytest.raises(UsageError) as err:
        parse_evidence(spec)
    assert says in str(err.value) and "\n" not in str(err.value)
