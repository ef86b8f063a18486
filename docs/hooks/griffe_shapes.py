"""Griffe extension of the anchorlens API pages: tensor shapes in docstrings stay text.

The docstrings write shapes in brackets (``p[stack] [layers, d]``, ``[B, H, Q, K]``), which Markdown would read as
reference links. Every ``[`` outside a code span is escaped before the docstring is rendered.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

_CODE = re.compile(r"(``.*?``|`[^`]*`)", re.S)


def escape_brackets(text: str) -> str:
    """``text`` with ``[`` escaped outside code spans (inline ``code`` and ``literal`` kept as they are)."""
    parts = _CODE.split(text)
    return "".join(part if i % 2 else part.replace("[", "\\[") for i, part in enumerate(parts))


class ShapesAsText(Extension):
    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = escape_brackets(obj.docstring.value)
