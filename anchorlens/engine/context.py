"""The one context variable the attention function reads: the active edit and the active observer."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TypeVar

from anchorlens.engine.edit import AttentionEditor
from anchorlens.engine.observer import Observer

E = TypeVar("E", bound=AttentionEditor)
O = TypeVar("O", bound=Observer)  # noqa: E741


@dataclass(frozen=True)
class EngineContext:
    """What acts on the attention calls of this context: an edit (knockouts), an observer (a capture), or neither."""

    edit: AttentionEditor | None = None
    observer: Observer | None = None


_NOTHING = EngineContext()  # frozen: every context starts from this one
_CONTEXT: contextvars.ContextVar[EngineContext] = contextvars.ContextVar("anchorlens_engine", default=_NOTHING)


def current() -> EngineContext:
    """The engine context active here (both fields None outside every edit and observer)."""
    return _CONTEXT.get()


@contextmanager
def editing(editor: E) -> Iterator[E]:
    """Make ``editor`` the active edit for the duration of the block (the observer stays)."""
    token = _CONTEXT.set(replace(_CONTEXT.get(), edit=editor))
    try:
        yield editor
    finally:
        _CONTEXT.reset(token)


@contextmanager
def observing(observer: O) -> Iterator[O]:
    """Make ``observer`` the active observer for the duration of the block (the edit stays)."""
    token = _CONTEXT.set(replace(_CONTEXT.get(), observer=observer))
    try:
        yield observer
    finally:
        _CONTEXT.reset(token)
