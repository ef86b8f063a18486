"""Tasks as data (built-in and user task files, harness YAML) and their examples from any data source."""

from __future__ import annotations

from anchorlens.tasks.bundled import bundled_examples, bundled_tasks
from anchorlens.tasks.examples import Examples, count_unlabelled, examples_from_rows, load_examples, parse_field_map
from anchorlens.tasks.explode import Explode, Row, RowError, expand_plain, flatten_row
from anchorlens.tasks.jsonl import DataError
from anchorlens.tasks.registry import TASKS, builtin_task_names, builtin_task_text, get_task, is_task_path
from anchorlens.tasks.sources import DataSource, parse_source
from anchorlens.tasks.task import CLASSIFICATION, TEXT, Task
from anchorlens.tasks.taskfile import load_task_file, parse_task_text

__all__ = [
    "CLASSIFICATION",
    "TASKS",
    "TEXT",
    "DataError",
    "DataSource",
    "Examples",
    "Explode",
    "Row",
    "RowError",
    "Task",
    "builtin_task_names",
    "builtin_task_text",
    "bundled_examples",
    "bundled_tasks",
    "count_unlabelled",
    "examples_from_rows",
    "expand_plain",
    "flatten_row",
    "get_task",
    "is_task_path",
    "load_examples",
    "load_task_file",
    "parse_field_map",
    "parse_source",
    "parse_task_text",
]
