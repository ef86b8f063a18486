"""Argument checks for the public Python API: a wrong type is one UsageError naming the argument and the accepted types.

``anchorlens.compare("base")`` would iterate the characters of ``"base"``; ``anchorlens.inspect(5, ...)``
fails deep inside with ``'int' object is not iterable``. :func:`checked` wraps a public function so
each argument is checked against its annotation before the function runs::

    anchorlens.compare(): argument 'ckpts' must be a sequence of str, got str 'base' (a single string
    is not a sequence of them: pass ['base', ...])

Annotations that cannot be checked at runtime (``Any``, protocols, type variables, names that do not
resolve) accept everything: the checks never refuse what the function itself would take.
"""

from __future__ import annotations

import collections.abc as cabc
import functools
import inspect
import numbers
import os
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from anchorlens.errors import ArgumentTypeError

_UNKNOWN = object()  # an annotation that cannot be checked: accept
_CONTAINERS = {
    list: "a list",
    tuple: "a tuple",
    set: "a set",
    frozenset: "a set",
    cabc.Sequence: "a sequence",
    cabc.MutableSequence: "a sequence",
    cabc.Collection: "a collection",
    cabc.Iterable: "an iterable",
}
_MAPPINGS = (dict, cabc.Mapping, cabc.MutableMapping)
_MAX_ELEMENTS = 1000  # longer containers are checked by type only


def _resolve(annotation: Any, namespace: Mapping[str, Any]) -> Any:
    """The annotation as an object (string annotations evaluated in the function's module); _UNKNOWN when it fails."""
    if not isinstance(annotation, str):
        return annotation
    try:
        return eval(annotation, dict(namespace))  # noqa: S307 - annotations of anchorlens's own functions
    except Exception:
        return _UNKNOWN


def _args(annotation: Any) -> tuple[Any, ...]:
    return typing.get_args(annotation)


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def matches(value: Any, annotation: Any) -> bool | None:
    """True / False when ``value`` does / does not fit ``annotation``; None when the annotation cannot be checked."""
    if annotation is _UNKNOWN or annotation is Any or annotation is object or annotation is inspect.Parameter.empty:
        return None
    if annotation is None or annotation is type(None):
        return value is None
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return matches(value, _args(annotation)[0])
    if _is_union(annotation):
        results = [matches(value, a) for a in _args(annotation)]
        return True if True in results else None if None in results else False
    if origin is typing.Literal:
        return value in _args(annotation)
    if origin is not None:
        return _matches_generic(value, origin, _args(annotation))
    if isinstance(annotation, type):
        return _matches_class(value, annotation)
    return None


def _matches_class(value: Any, cls: type) -> bool | None:
    """isinstance with the numeric tower (numpy ints are ints, bools are not), any PathLike for Path."""
    if cls is bool:
        return isinstance(value, bool) or type(value).__name__ == "bool_"
    if cls is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if cls is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if cls is str:
        return isinstance(value, str)
    if issubclass(cls, Path):
        return isinstance(value, os.PathLike)
    if cls in _CONTAINERS or cls in _MAPPINGS:
        return _matches_generic(value, cls, ())
    try:
        return isinstance(value, cls)
    except TypeError:  # a protocol that is not runtime-checkable, a special form
        return None


def _matches_generic(value: Any, origin: Any, args: tuple[Any, ...]) -> bool | None:
    """Containers (a string is never a container of strings), mappings, callables; other generics unchecked."""
    if origin in _MAPPINGS:
        return isinstance(value, cabc.Mapping)
    if origin in (cabc.Callable, Callable):
        return callable(value)
    if origin in _CONTAINERS:
        if isinstance(value, (str, bytes)):
            return False
        if origin is cabc.Iterable:
            ok = isinstance(value, cabc.Iterable)
        else:  # a list where a tuple is annotated (or the reverse) works the same; sets only as sets
            ok = isinstance(value, (set, frozenset)) if origin in (set, frozenset) else isinstance(value, cabc.Sequence)
        if not ok:
            return False
        element = args[0] if args and (origin is not tuple or len(args) == 2 and args[1] is Ellipsis) else None
        if element is None or not isinstance(value, cabc.Collection) or len(value) > _MAX_ELEMENTS:
            return True  # an iterator is not checked element by element: that would consume it
        return all(matches(v, element) is not False for v in value)
    return None


def describe(annotation: Any) -> str:
    """Readable accepted types: ``str or Path or None``, ``a sequence of str``, ``'mean' or int``."""
    if annotation is None or annotation is type(None):
        return "None"
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return describe(_args(annotation)[0])
    if _is_union(annotation):
        return " or ".join(dict.fromkeys(describe(a) for a in _args(annotation)))
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in _args(annotation))
    if origin in _MAPPINGS:
        return "a mapping (e.g. a dict)"
    if origin in (cabc.Callable, Callable):
        return "a callable"
    if origin in _CONTAINERS:
        args = _args(annotation)
        element = args[0] if args and (origin is not tuple or len(args) == 2 and args[1] is Ellipsis) else None
        return _CONTAINERS[origin] + (f" of {describe(element)}" if element is not None else "")
    if isinstance(annotation, type):
        if annotation in _MAPPINGS:
            return "a mapping (e.g. a dict)"
        return annotation.__name__
    return str(annotation)


def _got(value: Any) -> str:
    """``int 5``, ``str 'base'``, ``list [1, 2]``: the type and a short repr of a refused value."""
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"


def _fix(value: Any, annotation: Any) -> str:
    """A hint for the usual slip: one string where a sequence of strings is expected."""
    text = describe(annotation)
    if isinstance(value, str) and any(f"{kind} of" in text for kind in set(_CONTAINERS.values())):
        return f" (one string is not a sequence of them: pass [{value!r}, ...])"
    return ""


def check_argument(where: str, name: str, value: Any, annotation: Any) -> None:
    """Raise ArgumentTypeError (a UsageError and a TypeError) when ``value`` certainly does not fit ``annotation``."""
    if matches(value, annotation) is False:
        raise ArgumentTypeError(
            f"{where}: argument {name!r} must be {describe(annotation)}, got {_got(value)}{_fix(value, annotation)}"
        )


def checked(fn: Callable, *, public_name: str | None = None, overrides: Mapping[str, Any] | None = None) -> Callable:
    """``fn`` with its arguments checked against its annotations (``overrides``: parameter -> annotation)."""
    signature = inspect.signature(fn)
    where = f"{public_name or fn.__module__ + '.' + fn.__qualname__}()"
    namespace = getattr(fn, "__globals__", {})
    resolved: dict[str, Any] = {}

    def annotation(name: str) -> Any:
        if name not in resolved:
            param = signature.parameters[name]
            given = (overrides or {}).get(name, param.annotation)
            resolved[name] = _resolve(given, namespace)
        return resolved[name]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as err:  # a missing or unexpected argument: the same words, as a UsageError
            raise ArgumentTypeError(f"{where}: {err}; see help({where[:-2]})") from None
        for name, value in bound.arguments.items():
            kind = signature.parameters[name].kind
            if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                continue
            check_argument(where, name, value, annotation(name))
        return fn(*args, **kwargs)

    wrapper.__anchorlens_checked__ = True  # type: ignore[attr-defined]
    return wrapper
