"""SuperGLUE task definitions, jsonl loading and bundled examples."""

from __future__ import annotations

from anchorlens.tasks.bundled import bundled_examples, bundled_tasks
from anchorlens.tasks.jsonl import DataError, count_unlabelled, load_examples
from anchorlens.tasks.registry import (
    TASKS,
    RowError,
    Task,
    expand_multirc,
    expand_plain,
    flatten_row,
    get_task,
)

__all__ = [
    "TASKS",
    "DataError",
    "RowError",
    "Task",
    "bundled_examples",
    "bundled_tasks",
    "count_unlabelled",
    "expand_multirc",
    "expand_plain",
    "flatten_row",
    "get_task",
    "load_examples",
]
