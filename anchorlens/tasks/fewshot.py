"""Few-shot demonstrations: K labelled examples drawn per query, rendered with the task's own template.

Each query draws its demonstrations with a generator seeded by (``seed``, the query's ``idx``), so a query
gets the same demonstrations in every run, checkpoint, rank and resumed shard. A query is never shown
with its own answer: a demonstration that shows the same text as the query (its own row when the
demonstrations come from the evaluated data, or a copy of it in another file) is never drawn for it. A demonstration is the template
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
from anchorlens.rundir import examples_digest
from anchorlens.tasks.explode import Row
from anchorlens.tasks.task import Task

DEMO = "demo"
DEMO_LABEL = "demo_label"


@dataclass(frozen=True)
class Demonstrations:
    """A pool of labelled examples and how many to draw per query.

    ``same_as_queries``: the pool is the evaluated data. ``fields``: what a prompt shows of an example (the task
    template's fields); a demonstration that shows the same as the query is never drawn for it, whichever file it
    comes from (the query's own row, a copy of it in ``--shots-from``, a duplicate row): it would show the
    query's own answer. Rows are told apart by what they show, not by ``idx``, which files need not keep unique.
    """

    pool: Sequence[Row]
    shots: int
    seed: int = 0
    source: str = ""
    same_as_queries: bool = False
    fields: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Refuse more shots than the pool can give."""
        usable = len(self.pool) - (1 if self.same_as_queries else 0)
        if self.shots > usable:
            raise DataError(
                f"{self.source}: --shots {self.shots} needs {self.shots} labelled demonstrations but the file holds "
                f"{usable}{' besides the query' if self.same_as_queries else ''}; lower --shots or pass --shots-from"
            )

    def draw(self, query: Mapping[str, Any]) -> list[Row]:
        """The demonstrations of one query (deterministic in ``seed`` and the query's ``idx``); DataError when the
        pool holds fewer than ``shots`` that differ from the query."""
        rng = random.Random(f"{self.seed}:{query.get('idx')}")
        own = self._shown(query)
        picks: list[Row] = []
        order = list(range(len(self.pool)))
        rng.shuffle(order)
        for i in order:
            demo = self.pool[i]
            if self._shown(demo) == own:
                continue
            picks.append(demo)
            if len(picks) == self.shots:
                return picks
        raise DataError(
            f"{self.source}: --shots {self.shots} but only {len(picks)} demonstration(s) differ from the query "
            f"with idx {query.get('idx')!r} (the others show the same text); lower --shots or drop duplicate rows"
        )

    def facts(self) -> dict[str, Any]:
        """What decides every query's draw, for a manifest and a resume key: the shots, the seed, the pool's source,
        size and digest (:func:`~anchorlens.rundir.examples_digest`: a file's content and selection, else the
        rows), and whether the pool is the evaluated data."""
        return {
            "shots": self.shots,
            "seed": self.seed,
            "source": self.source,
            "pool_size": len(self.pool),
            "pool_digest": examples_digest(self.pool),
            "same_as_queries": self.same_as_queries,
        }

    def _shown(self, example: Mapping[str, Any]) -> tuple:
        """What a prompt shows of ``example``: its template fields' values (every field but the bookkeeping ones when
        the template names none)."""
        if self.fields:
            return tuple(str(example.get(name)) for name in self.fields)
        return tuple(sorted((k, str(v)) for k, v in example.items() if k not in _BOOKKEEPING))


_BOOKKEEPING = frozenset({"idx", "label", "labelled"})


def render_demo(task: Task, demo: Row) -> Rendered:
    """One demonstration: the template with role ``demo`` and its answer with ``demo_label`` (its label's verbalizer,
    or its own choice at its label when choices vary per document: :meth:`~anchorlens.tasks.task.Task.example_answer`)."""
    body = task.template.render(demo).with_role(DEMO)
    answer = literal(task.example_answer(demo), DEMO_LABEL, DEMO_LABEL, slot=True)
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
