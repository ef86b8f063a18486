"""Specs: typed configs per method, round trips, composition, the one resolver, bounds and one-line errors."""

from __future__ import annotations

import dataclasses

import pytest

from anchorlens.errors import UsageError
from anchorlens.methods import (
    METHOD_CONFIGS,
    Capsule,
    CapsuleConfig,
    DeepPrompt,
    DeepPromptConfig,
    Directory,
    GuidedModel,
    InstanceConfig,
    InstanceToken,
    PromptConfig,
    SoftPrompt,
    Spec,
    load_guided,
    parse_spec,
)


def test_parse_gives_typed_configs():
    spec = parse_spec("prompt:n=10+instance:k=2,pos=middle+capsule:fusion=prepend,pos=last")
    assert spec.parts == (
        PromptConfig(n=10),
        InstanceConfig(k=2, position="middle"),
        CapsuleConfig(fusion="prepend", position="last"),
    )
    assert parse_spec("deep-prompt:n=5,pos=-1").parts == (DeepPromptConfig(n=5, position=-1),)
    assert parse_spec("base") == Spec() and str(Spec()) == "base"
    assert parse_spec("soft-prompt:n=3").parts == (PromptConfig(n=3),)  # aliases keep working


ROUND_TRIP = [
    "prefix:n=3",  # printed but not parseable before
    "prompt",
    "prompt:n=7,init=random,pos=after_structural",
    "deep-prompt:n=2,pos=-1,stacks=encoder/decoder",
    "instance:k=3,mode=chunks,pos=middle",
    "capsule:fusion=project,rank=3,pos=last,init=random,stacks=encoder",
    "capsule:mean=input",
    "capsule:mean=all",
    "capsule:fusion=prepend,mean=capsule+input",
    "capsule:n=2",
    "capsule:fusion=prepend,pos=middle,n=4",
    "capsule:fusion=project,rank=2,init=random,n=3,pos=7",
    "prompt:n=10+capsule:mean=input+instance:pos=last+prefix",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_every_method_round_trips(text):
    spec = parse_spec(text)
    assert parse_spec(str(spec)) == spec
    for part in spec.parts:
        assert parse_spec(part.to_spec()).parts == (part,)
        assert type(part).from_json(part.to_options()) == part  # the checkpoint form round-trips too


def test_every_registered_method_round_trips_with_non_default_values():
    for cls in METHOD_CONFIGS.values():
        config = cls()
        assert parse_spec(str(config)).parts == (config,)
        assert cls.option_names() and all(f.metadata.get("doc") for f in dataclasses.fields(cls)), cls.name


def test_capsule_count_defaults_to_one_and_is_left_out_of_specs():
    assert CapsuleConfig().n == 1 and Capsule().n == 1 and Capsule().count() == 1
    assert str(CapsuleConfig()) == "capsule" and str(parse_spec("capsule:n=1")) == "capsule"
    assert str(CapsuleConfig(fusion="prepend", position="last")) == "capsule:fusion=prepend,pos=last"
    assert str(CapsuleConfig(n=2)) == "capsule:n=2" and parse_spec("capsule:n=2").parts == (CapsuleConfig(n=2),)
    old = {"fusion": "add", "rank": 8, "position": "first", "init": "zeros", "stacks": None, "mean": "capsule+input"}
    assert CapsuleConfig.from_json(old) == CapsuleConfig()  # checkpoints saved before n existed
    fusions = ("add", "prepend", "project")
    assert [CapsuleConfig(fusion=f).count() for f in fusions] == [1, 2, 1]
    assert [CapsuleConfig(n=4, fusion=f).count() for f in fusions] == [4, 5, 4]
    assert Capsule(n=3, fusion="prepend").config == CapsuleConfig(n=3, fusion="prepend")


@pytest.mark.parametrize(
    "options,needle",
    [
        ({"n": 0}, "option n must be >= 1; got n=0"),
        ({"n": -2}, "option n must be >= 1"),
        ({"n": True}, "option n needs an integer"),
        ({"n": 2.0}, "option n needs an integer"),
    ],
)
def test_capsule_count_is_validated(options, needle):
    with pytest.raises(UsageError) as err:
        CapsuleConfig(**options)
    assert needle in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UsageError, match="option n of method capsule must be an integer"):
        CapsuleConfig.from_json({"n": "2"})


def test_capsule_plus_inside_an_option_value_is_not_a_composition():
    spec = parse_spec("capsule:mean=capsule+input+instance")
    assert spec.parts == (CapsuleConfig(mean="capsule+input"), InstanceConfig())


def test_paper_defaults_live_in_the_configs():
    assert PromptConfig().n == 100 and SoftPrompt().n == 100  # the paper's prompt length (was 20)
    assert CapsuleConfig().mean == "capsule+input" and CapsuleConfig().fusion == "add"


@pytest.mark.parametrize("text", ["", "  ", "+", "prompt++instance", "capsule+", "+instance"])
def test_empty_specs_are_refused(text):
    with pytest.raises(UsageError) as err:
        parse_spec(text)
    assert "\n" not in str(err.value) and "empty" in str(err.value)


def test_spec_objects_are_edited_as_objects():
    spec = parse_spec("prompt:n=10+instance")
    moved = spec.replace(1, position="last", k=2)
    assert str(moved) == "prompt:n=10+instance:k=2,pos=last"
    assert str(spec + CapsuleConfig(mean="input")) == "prompt:n=10+instance+capsule:mean=input"
    with pytest.raises(UsageError, match="choose one of"):
        spec.replace(1, mode="pairs")


def test_load_guided_builds_the_methods(tiny_base):
    base = tiny_base("tiny-llama")
    guided = load_guided("prompt:n=10+instance+capsule:fusion=prepend,pos=last+deep-prompt:n=5", base=base)
    assert [type(g) for g in guided.guidances] == [SoftPrompt, InstanceToken, Capsule, DeepPrompt]
    assert guided.guidances[2].fusion == "prepend" and str(guided.guidances[2].position) == "last"
    assert guided.guidances[0].n == 10 and guided.guidances[3].n == 5
    assert guided.guidances[2].config == CapsuleConfig(fusion="prepend", position="last")
    assert len(load_guided("base", base=base).guidances) == 0
    assert guided.config()["methods"][1] == {
        "kind": "instance",
        "options": {"k": 1, "mode": "copies", "position": "first"},
    }


def test_load_guided_resolves_every_kind_of_input(tiny_base):
    base = tiny_base("tiny-llama")
    plain = load_guided(base)
    assert isinstance(plain, GuidedModel) and plain.base is base and plain.num_trainable() == 0
    assert load_guided(plain) is plain
    assert [g.kind for g in load_guided(CapsuleConfig(), base).guidances] == ["capsule"]
    assert [g.kind for g in load_guided(parse_spec("instance+prefix:n=2"), base).guidances] == ["instance", "prefix"]
    assert load_guided("instance", "tiny-gpt2").base.spec == "tiny-gpt2"  # a base spec string


def test_hub_like_names_fall_back_to_no_such_directory(tiny_base):
    with pytest.raises(UsageError, match="no such directory"):
        load_guided("some-org/some-adapter", base=tiny_base("tiny-llama"))


@pytest.mark.parametrize(
    "spec,needle",
    [
        ("capsul", "use base, prompt, deep-prompt"),
        ("capsule:fusion=mix", "choose one of: add, prepend, project"),
        ("capsule:mean=capsule", "choose one of: capsule+input, input, all"),
        ("capsule:color=red", "valid options: fusion, rank, pos, init, stacks, mean, n"),
        ("capsule:n=0", "option n must be >= 1; got n=0"),
        ("capsule:n=two", "option n needs an integer"),
        ("instance:k=two", "needs an integer"),
        ("instance:k=0", "must be >= 1"),
        ("instance:pos=somewhere", "first, after_structural"),
        ("prompt:n", "valid options: n, init, pos"),
        ("prefix:pos=last", "valid options: n"),
        ("./no/such/dir", "no such directory"),
        ("deep-prompt:stacks=encoder", "choose from: decoder"),
        ("base:n=3", "takes no options"),
    ],
)
def test_errors_are_one_line_usage_errors(tiny_base, spec, needle):
    with pytest.raises(UsageError) as err:
        load_guided(spec, base=tiny_base("tiny-llama"))
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "spec,needle",
    [
        ("prompt:n=100000000", "n <= 512"),
        ("deep-prompt:n=100000000", "n <= 512"),
        ("instance:k=100000000", "k <= 512"),
        ("prefix:n=100000000", "n <= 512"),
        ("capsule:fusion=project,rank=100000000", "rank <= 64"),
        ("capsule:n=100000000", "n <= 512"),
    ],
)
def test_specs_bound_what_they_allocate(tiny_base, spec, needle):
    with pytest.raises(UsageError) as err:
        load_guided(spec, base=tiny_base("tiny-llama"))  # would need 1.6-102 GB: refused before allocating
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_bases_without_a_context_length_bound_positions_at_4096(tiny_base):
    base = tiny_base("tiny-t5")
    assert base.context_length is None
    with pytest.raises(UsageError, match="n <= 4096"):
        load_guided("prompt:n=5000", base=base)
    assert load_guided("prompt:n=3", base=base).num_trainable() == 3 * base.hidden_size


def test_memory_estimate_guards_allocation(tiny_base, monkeypatch):
    import anchorlens.methods.config as config

    base = tiny_base("tiny-llama")
    monkeypatch.setattr(config, "MAX_GUIDANCE_BYTES", 2 * 100 * 64 * 4)  # 50 KiB: two layers' worth of n=100, d=64
    with pytest.raises(UsageError, match=r"would allocate 100.0 KiB .* limit is 50.0 KiB"):
        DeepPromptConfig(n=100).check_fits(base)
    assert GuidedModel(base, [PromptConfig(n=100)]).num_trainable() == 100 * 64  # n x d fits


def test_name_round_trips_through_the_parser(tiny_base):
    base = tiny_base("tiny-t5")
    text = "prompt:n=2,init=random+instance:k=2,mode=chunks,pos=-1+capsule:fusion=project,rank=3,stacks=encoder+deep-prompt:n=1,stacks=encoder/decoder"
    guided = load_guided(text, base=base)
    spec = guided.name.split("+", 1)[1]
    assert parse_spec(spec) == parse_spec(text)
    again = load_guided(spec, base=base)
    assert again.config()["methods"] == guided.config()["methods"]


def test_plain_directory_is_refused(tmp_path, tiny_base):
    with pytest.raises(UsageError, match="neither an anchorlens checkpoint"):
        load_guided(str(tmp_path), base=tiny_base("tiny-llama"))


def test_directory_parts_print_their_path(tmp_path, tiny_base):
    from anchorlens.methods.checkpoints import save_checkpoint

    path = save_checkpoint(GuidedModel(tiny_base("tiny-llama"), [InstanceConfig()]), tmp_path / "ck")
    spec = parse_spec(f"{path}+capsule")
    assert spec.parts == (Directory(str(path), "checkpoint"), CapsuleConfig())
    assert parse_spec(str(spec)) == spec
