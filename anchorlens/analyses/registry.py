"""Reducers by name: ``make_reducer("role_flow")`` works in any process, built-ins always registered.

The registry lives next to the built-in reducers (``role_flow``, ``first_token``, ``entropy``):
importing this module imports the ``anchorlens.analyses`` package, which registers them, so a fresh
process never sees an empty registry. Third-party reducers register with :func:`register_reducer`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from anchorlens.capture.reducer import Reducer
from anchorlens.errors import UnknownNameError, UsageError

_REGISTRY: dict[str, Callable[..., Any]] = {}
F = TypeVar("F", bound=Callable[..., Any])


def register_reducer(name: str) -> Callable[[F], F]:
    """Class decorator that makes a reducer constructible by ``make_reducer(name, **options)``."""

    def wrap(factory: F) -> F:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise UsageError(f"reducer {name!r} is already registered: choose another name")
        _REGISTRY[name] = factory
        return factory

    return wrap


def make_reducer(name: str, **options) -> Reducer:
    """Build a registered reducer by name; UnknownNameError lists the known names."""
    if name not in _REGISTRY:
        raise UnknownNameError(f"unknown reducer {name!r}: choose one of {', '.join(reducer_names())}")
    return cast(Reducer, _REGISTRY[name](**options))


def reducer_names() -> list[str]:
    """Names of all registered reducers."""
    return sorted(_REGISTRY)
