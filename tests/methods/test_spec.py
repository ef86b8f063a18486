"""The spec parser: methods, options, composition, and one-line errors listing the choices."""
from __future__ import annotations

import pytest

from anchorlens.errors import UsageError
from anchorlens.methods import Capsule, DeepPrompt, InstanceToken, SoftPrompt, load_guided, parse_spec


def test_parse_methods_and_options():
    parts = parse_spec("prompt:n=10+instance:k=2,pos=middle+capsule:fusion=prepend,pos=last")
    assert [p.name for p in parts] == ["prompt", "instance", "capsule"]
    assert parts[0].options == {"n": 10}
    assert parts[1].options == {"k": 2, "position": "middle"}
    assert parts[2].options == {"fusion": "prepend", "position": "last"}
    assert parse_spec("deep-prompt:n=5,pos=-1")[0].options == {"n": 5, "position": -1}
    assert parse_spec("base")[0].kind == "base"


def test_load_guided_builds_the_methods(tiny_base):
    base = tiny_base("tiny-llama")
    guided = load_guided("prompt:n=10+instance+capsule:fusion=prepend,pos=last+deep-prompt:n=5", base=base)
    assert [type(g) for g in guided.guidances] == [SoftPrompt, InstanceToken, Capsule, DeepPrompt]
    assert guided.guidances[2].fusion == "prepend" and str(guided.guidances[2].position) == "last"
    assert guided.guidances[0].n == 10 and guided.guidances[3].n == 5
    assert load_guided("base", base=base).guidances.__len__() == 0
    assert guided.config()["methods"][1] == {"kind": "instance", "options": {"k": 1, "mode": "copies", "position": "first"}}


@pytest.mark.parametrize(
    "spec,needle",
    [
        ("capsul", "use base, instance, capsule"),
        ("capsule:fusion=mix", "choose one of: add, prepend, project"),
        ("capsule:color=red", "valid options: fusion, rank, init, stacks, pos"),
        ("instance:k=two", "needs an integer"),
        ("instance:pos=somewhere", "first, after_structural"),
        ("prompt:n", "valid options: n, init, pos"),
        ("./no/such/dir", "no such directory"),
        ("deep-prompt:stacks=encoder", "choose from: decoder"),
    ],
)
def test_errors_are_one_line_usage_errors(tiny_base, spec, needle):
    with pytest.raises(UsageError) as err:
        load_guided(spec, base=tiny_base("tiny-llama"))
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_plain_directory_is_refused(tmp_path, tiny_base):
    with pytest.raises(UsageError, match="neither an anchorlens checkpoint"):
        load_guided(str(tmp_path), base=tiny_base("tiny-llama"))


def test_name_round_trips_through_the_parser(tiny_base):
    base = tiny_base("tiny-t5")
    guided = load_guided("prompt:n=2,init=random+instance:k=2,mode=chunks,pos=-1+capsule:fusion=project,rank=3,stacks=encoder+deep-prompt:n=1,stacks=encoder/decoder", base=base)
    spec = guided.name.split("+", 1)[1]
    again = load_guided(spec, base=base)
    assert again.config()["methods"] == guided.config()["methods"]
