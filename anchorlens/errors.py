"""The one error hierarchy: everything a user can fix is an ``AnchorlensError``.

The CLI prints a ``UsageError`` (and its subclasses) as one line and exits with code 2; library
code raises these, never a bare ``ValueError``/``KeyError`` for bad input, so no workflow has to
rewrap exceptions by hand.
"""

from __future__ import annotations


class AnchorlensError(Exception):
    """Base of every error anchorlens raises on purpose."""


class UsageError(AnchorlensError, ValueError):
    """Bad input from the user (spec, path, data, option); the message names the problem and the fix."""


class UnknownNameError(UsageError, KeyError):
    """A name (method, option, task, reducer, base, position...) that anchorlens does not know."""

    def __str__(self) -> str:
        """The message itself (KeyError would quote it)."""
        return str(self.args[0]) if self.args else ""


class ArgumentTypeError(UsageError, TypeError):
    """A public function called with an argument of a type it does not take (names the argument and the types)."""


class DataError(UsageError):
    """An input file (jsonl, tensors, config) that is unreadable, malformed or of the wrong type."""


class TemplateError(UsageError):
    """A task template that cannot render an example."""


class CheckpointError(DataError):
    """A checkpoint or adapter directory that is malformed or belongs to another base."""


class PathError(UsageError):
    """A path that cannot be read or written (missing, permission, not a directory, disk full)."""
