"""Few-shot demonstrations: K labelled examples drawn per query, rendered with the task's own template.

Each query draws its demonstrations with a generator seeded by (``seed``, the query's ``idx``), so a query
gets the same demonstrations in every run, checkpoint, rank and resumed shard. When the demonstrations come
from the evaluated data itself the query is never its own demonstration. A demonstration is the template
filled with its example followed by its label's verbalizer; its tokens get role ``demo`` (its fields stay
tagged with their names) and its answer ``demo_label``, so attention to demonstrations and to the query can
be told apart. Demonstrations and the query are joined by the task's ``fewshot_delimiter``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from anchorlens.errors import DataError
from anchorlens.roles.templates import Rendered, literal
from anchorlens.tasks.explode import Row
from anchorlens.tasks.task import Task

DEMO = "demo"
DEMO_LABEL = "demo_label"


@dataclass(frozen=True)
class Demonstrations:
    """A pool of labelled examples and how many to draw per query.

    ``same_as_queries``: the pool is the evaluated data (a query's own row is then excluded).
    """

    pool: Sequence[Row]
    shots: int
    seed: int = 0
    source: str = ""
    same_as_queries: bool = False

    def __post_init__(self) -> None:
        """Refuse more shots than the pool can give."""
        usable = len(self.pool) - (1 if self.same_as_queries else 0)
        if self.shots > usable:
            raise DataError(
                f"{self.source}: --shots {self.shots} needs {self.shots} labelled demonstrations but the file holds "
                f"{usable}{' besides the query' if self.same_as_queries else ''}; lower --shots or pass --shots-from"
            )

    def draw(self, query: Mapping[str, Any]) -> list[Row]:
        """The demonstrations of one query (deterministic in ``seed`` and the query's ``idx``)."""
        rng = random.Random(f"{self.seed}:{query.get('idx')}")
        picks: list[Row] = []
        order = list(range(len(self.pool)))
        rng.shuffle(order)
        for i in order:
            demo = self.pool[i]
            if self.same_as_queries and demo.get("idx") == query.get("idx"):
                continue
            picks.append(demo)
            if len(picks) == self.shots:
                break
        return picks


def render_demo(task: Task, demo: Row) -> Rendered:
    """One demonstration: the template with role ``demo`` and the verbalizer of its label with ``demo_label``."""
    body = task.template.render(demo).with_role(DEMO)
    answer = literal(task.verbalizer(demo["label"]), DEMO_LABEL, DEMO_LABEL, slot=True)
    return Rendered.join([body, answer])


def with_demonstrations(task: Task, query: Rendered, demos: Sequence[Row]) -> Rendered:
    """The demonstrations, each followed by the task's delimiter (role ``demo``), then the query."""
    parts: list[Any] = []
    for demo in demos:
        parts.append(render_demo(task, demo))
        parts.append(literal(task.fewshot_delimiter, DEMO))
    parts.append(query)
    return Rendered.join(parts)


def check_pool(pool: Sequence[Row], task: Task, source: str) -> None:
    """Every demonstration must be labelled (its answer is shown); DataError names the first that is not."""
    if not task.has_labels:
        raise DataError(f"task {task.name} has no labels: few-shot demonstrations show answers; drop --shots")
    for i, demo in enumerate(pool):
        if not demo.get("labelled", demo.get("label") is not None):
            raise DataError(f"{source}: demonstration {i + 1} has no label; --shots-from needs labelled examples")
