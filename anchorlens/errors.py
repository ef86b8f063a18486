"""Errors a user can fix; the CLI prints them as one line and exits with code 2."""
from __future__ import annotations


class UsageError(ValueError):
    """Bad input from the user (spec, path, data, option); the message names the problem and the fix."""
