"""``--ckpt NAME=SPEC``: the rule that tells a checkpoint's name from a spec, and the names a comparison uses."""

from __future__ import annotations

import pytest

from anchorlens.errors import UsageError
from anchorlens.methods.spec import parse_spec, split_alias
from anchorlens.workflows.compare import named_checkpoints

KNOCKOUT = "instance+knockout:keys=instance,layers=0-4,mode=renorm"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"ko={KNOCKOUT}", ("ko", KNOCKOUT)),  # only the first '=' splits: the spec keeps its own
        ("my_ckpt.v2-a=prompt:n=10+instance", ("my_ckpt.v2-a", "prompt:n=10+instance")),
        (" b = base ", (None, " b = base ")),  # a space before '=' is not a name
        ("base", (None, "base")),
        (KNOCKOUT, (None, KNOCKOUT)),  # '=' after ':' is a method option
        ("instance:k=2,pos=middle", (None, "instance:k=2,pos=middle")),
        ("model=ORG/NAME+instance", (None, "model=ORG/NAME+instance")),  # model= is a spec (another base)
        ("MODEL=ORG/NAME", (None, "MODEL=ORG/NAME")),
        ("runs/a=b", (None, "runs/a=b")),  # a '/' before '=': a path
        ("2x=instance", (None, "2x=instance")),  # a name starts with a letter or '_'
        ("i=model=ORG/NAME+instance", ("i", "model=ORG/NAME+instance")),  # a named model= checkpoint
    ],
)
def test_split_alias_follows_the_rule(text, expected):
    assert split_alias(text) == expected


def test_an_existing_path_with_an_equals_sign_stays_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ko=instance").mkdir()
    assert split_alias("ko=instance") == (None, "ko=instance")
    (tmp_path / "ko=instance").rmdir()
    assert split_alias("ko=instance") == ("ko", "instance")


def test_a_name_without_a_spec_is_one_line():
    with pytest.raises(UsageError, match=r"names 'ko' but gives no spec after '='") as err:
        split_alias("ko=")
    assert "\n" not in str(err.value)


def test_the_spec_of_a_named_checkpoint_parses_like_the_spec_itself():
    name, spec = split_alias(f"ko={KNOCKOUT}")
    assert name == "ko" and parse_spec(spec) == parse_spec(KNOCKOUT)


def test_named_checkpoints_mix_names_and_spec_names():
    assert named_checkpoints(["base", f"ko={KNOCKOUT}", "instance"]) == (
        ["base", "ko", "instance"],
        ["base", KNOCKOUT, "instance"],
    )
    assert named_checkpoints({"b": "base", "ko": KNOCKOUT}) == (["b", "ko"], ["base", KNOCKOUT])


@pytest.mark.parametrize(
    ("ckpts", "message"),
    [
        (["a=base", "a=instance"], "two checkpoints are named 'a'"),
        (
            ["instance", "instance=base"],
            "the name 'instance' of --ckpt instance=base is also the checkpoint 'instance'",
        ),
        (["b=base", "base=instance"], "the name 'base' of --ckpt base=instance is also the checkpoint 'base'"),
        ({"b": "base", "two words": "instance"}, "checkpoint name 'two words' is not a name"),
        ({"b": "base", "model": "instance"}, "checkpoint name 'model' is not a name"),
    ],
)
def test_clashing_or_malformed_names_are_one_line(ckpts, message):
    with pytest.raises(UsageError) as err:
        named_checkpoints(ckpts)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_unnamed_checkpoints_keep_their_short_names():
    assert named_checkpoints(["base", "base"]) == (["base", "base#2"], ["base", "base"])
