"""The public Python API checks its arguments: a wrong type names the argument and the accepted types."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import numpy as np
import pytest

import anchorlens as al
from anchorlens.arguments import checked, describe, matches
from anchorlens.errors import ArgumentTypeError, UsageError


def test_every_public_function_checks_its_arguments():
    functions = [n for n in al.__all__ if n != "__version__" and inspect.isfunction(getattr(al, n))]
    assert {"compare", "inspect", "load_base", "train", "evaluate", "sweep_positions"} <= set(functions)
    assert all(getattr(getattr(al, n), "__anchorlens_checked__", False) for n in functions)


def test_a_string_for_a_list_of_checkpoints_is_named():
    with pytest.raises(ArgumentTypeError) as info:
        al.compare("base")
    err = info.value
    assert isinstance(err, UsageError) and isinstance(err, TypeError)  # catchable either way
    assert str(err) == (
        "anchorlens.compare(): argument 'ckpts' must be a sequence of str or a mapping (e.g. a dict), got str 'base' "
        "(one string is not a sequence of them: pass ['base', ...])"
    )


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: al.load_base(123), "anchorlens.load_base(): argument 'spec' must be str, got int 123"),
        (lambda: al.compare(["base", "instance"], n="3"), "argument 'n' must be int or None, got str '3'"),
        (lambda: al.compare(["base", "instance"], data=5), "argument 'data' must be str or Path or None, got int 5"),
        (lambda: al.train(steps=2.5), "argument 'steps' must be int or None, got float 2.5"),
        (lambda: al.get_task(3), "argument 'name' must be str or Path or Task, got int 3"),
        (lambda: al.load_examples(), "missing a required argument: 'data'"),
        (lambda: al.inspect("base", 5), "argument 'text_or_example' must be str or a mapping"),
        (lambda: al.inspect(5, "text"), "argument 'model_or_spec' must be a spec string (e.g. 'instance'), a Base"),
        (lambda: al.inspect(["base"], "text"), "got list ['base']"),
    ],
)
def test_wrong_types_are_refused_before_any_work(call, words):
    with pytest.raises(ArgumentTypeError) as info:
        call()
    assert words in str(info.value)


def test_annotations_narrower_than_the_function_are_widened():
    # "first,last" is what the command line passes; the error is about n, so positions passed the check
    with pytest.raises(ArgumentTypeError, match="argument 'n'"):
        al.sweep_positions("capsule", "first,last", n="two")


@pytest.mark.parametrize(
    "example, words",
    [
        ({"premise": None, "hypothesis": "x"}, "field 'premise' of the example is missing (its value is None)"),
        ({"premise": "a"}, "field 'hypothesis' of the example is missing; template 'rte' needs premise, hypothesis"),
        ({"premise": ["a"], "hypothesis": "x"}, "field 'premise' of the example must be text or a number, got list"),
    ],
)
def test_inspect_names_a_missing_field_instead_of_rendering_none(example, words):
    with pytest.raises(UsageError) as info:
        al.inspect("base", example, task="rte", base="tiny-llama")
    assert words in str(info.value)


def test_checks_follow_the_numeric_tower_and_containers():
    assert matches(np.int64(3), int) and not matches(True, int) and matches(3, float)
    assert matches([0, 1], tuple[int, ...]) and not matches([0, "a"], tuple[int, ...])
    assert not matches("ab", Sequence[str]) and matches(["a"], Sequence[str])
    assert matches(PurePosixPath("x"), Path) and matches(Path("x"), Path) and not matches("x", Path)
    assert matches("mean", Literal["mean"] | int) and not matches("max", Literal["mean"] | int)
    assert matches(None, int | None) and matches({"a": 1}, dict[str, int])
    assert matches(object(), Any) is None and matches(3, "NotAName") is None  # unknown: never refused


def test_descriptions_read_as_prose():
    assert describe(str | Path | None) == "str or Path or None"
    assert describe(Sequence[str]) == "a sequence of str"
    assert describe(tuple[int, ...] | None) == "a tuple of int or None"
    assert describe(Literal["mean"] | int) == "'mean' or int"


def test_checked_keeps_the_function_and_its_behaviour():
    def f(a: int, b: str = "x", *rest: Any, **kw: Any) -> str:
        """Doc."""
        return f"{a}{b}{len(rest)}{sorted(kw)}"

    g = checked(f, public_name="demo.f")
    assert g(1, "y", 2, 3, z=4) == f(1, "y", 2, 3, z=4) and g.__doc__ == "Doc." and g.__name__ == "f"
    with pytest.raises(ArgumentTypeError, match=r"demo.f\(\): argument 'a' must be int, got str '1'"):
        g("1")
