"""The engine's one context: an edit and an observer set and restored independently, in either order."""

from __future__ import annotations

import pytest

from anchorlens.engine.context import EngineContext, current, editing, observing


class _Edit:
    def record(self, module, key, value) -> bool:
        return False

    def call_edit(self, module, query, key):
        return None


class _Observer:
    pass  # only its identity matters here


def test_outside_every_block_nothing_acts():
    assert current() == EngineContext(edit=None, observer=None)


@pytest.mark.parametrize("edit_first", [True, False])
def test_edit_and_observer_nest_in_either_order_and_are_restored(edit_first):
    edit, observer = _Edit(), _Observer()
    outer, inner = (editing(edit), observing(observer)) if edit_first else (observing(observer), editing(edit))
    with outer:
        first = current()
        with inner:
            assert current().edit is edit and current().observer is observer
        assert current() is first
        assert (first.edit is edit) == edit_first and (first.observer is observer) != edit_first
    assert current() == EngineContext()


def test_an_inner_edit_replaces_the_outer_one_only_inside_its_block():
    outer, inner = _Edit(), _Edit()
    with editing(outer):
        with editing(inner):
            assert current().edit is inner
        assert current().edit is outer


def test_the_context_is_restored_when_the_block_raises():
    with pytest.raises(RuntimeError):
        with observing(_Observer()):
            raise RuntimeError("boom")
    assert current().observer is None
