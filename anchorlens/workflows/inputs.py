"""Resolve a task, its examples and how they are prompted from the user's options."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from anchorlens.errors import DataError, UsageError
from anchorlens.tasks import Examples, Task, bundled_examples, bundled_tasks, get_task, load_examples
from anchorlens.tasks.prompts import PromptOptions, Prompts, build_prompts


@dataclass(frozen=True)
class Inputs:
    """The task, its examples, where they came from, and how they are prompted.

    ``pool``: the few-shot demonstrations read from ``--shots-from``, or the whole of the evaluated data when
    ``--n``/``--limit`` took only its first examples (``pool_is_data``), so that a query's demonstrations do not
    depend on the limit (None: drawn from ``examples``); ``data_facts``: what the data source recorded (format,
    rows, hub commit, field map).
    """

    task: Task
    examples: Sequence[dict]
    source: str
    prompt: PromptOptions = PromptOptions()
    pool: Sequence[dict] | None = None
    pool_source: str = ""
    data_facts: Mapping[str, Any] = field(default_factory=dict)
    pool_is_data: bool = False

    def prompts(self, tokenizer: Any, max_length: int | None = None) -> Prompts:
        """The prompts of these inputs for ``tokenizer`` (role scheme, chat layout, demonstrations); a text task's
        windows have ``max_length`` tokens unless the options name a window."""
        options = self.prompt if self.prompt.window or not max_length else replace(self.prompt, window=max_length)
        return build_prompts(
            self.task,
            tokenizer,
            options,
            queries=self.examples,
            pool=self.pool,
            pool_source=self.pool_source,
            queries_source=self.source,
            pool_is_queries=self.pool_is_data,
        )

    def predict(
        self, model: Any, *, batch_size: int, max_length: int | None, progress: bool = False, scoring: str = "auto"
    ) -> Any:
        """Predictions of ``model`` on these examples, rendered by these inputs' prompts for its tokenizer, labels
        ranked by ``scoring`` (:func:`~anchorlens.evaluation.predict`)."""
        from anchorlens.evaluation import predict

        return predict(
            model,
            self.examples,
            self.task,
            batch_size=batch_size,
            max_length=max_length,
            progress=progress,
            prompts=self.prompts(model.base.tokenizer),
            scoring=scoring,
        )

    def facts(self, prompts: Prompts | None = None) -> dict[str, Any]:
        """The task, data and prompt facts a run records in its manifest; with the run's ``prompts``, the chat
        template it rendered with too (text, sha256, name, source, arguments) and its few-shot draw (shots, seed,
        the pool's source and digest: :meth:`~anchorlens.tasks.prompts.Prompts.demonstrations`)."""
        chat = prompts.chat_template() if prompts is not None else None
        demos = prompts.demonstrations() if prompts is not None else None
        return {
            "task_source": self.task.describe_source(),
            "data_facts": {"source": self.source, **dict(self.data_facts)},
            "prompt": self.prompt.resolved(self.task).describe(),
            **({"chat_template": chat} if chat is not None else {}),
            **({"demonstrations": demos} if demos is not None else {}),
        }


def _read(task: Task, data: str | Path | None, n: int | None, need_labels: bool, field_map: Any) -> Examples:
    """Examples of ``task`` from ``data``, the task's own default data, or the bundled set."""
    source = data if data is not None else task.data
    if source is None:
        if field_map:
            raise UsageError("--field-map renames columns of --data; pass --data FILE too")
        if task.name not in bundled_tasks():
            raise UsageError(
                f"task {task.name} has no bundled examples; pass --data FILE (jsonl, csv, tsv, parquet, txt, "
                f"a saved dataset or hf:ORG/NAME); bundled: {', '.join(bundled_tasks())}"
            )
        return bundled_examples(task, limit=n)
    return load_examples(source, task, limit=n, require_labels=need_labels, field_map=field_map)


def _check_groups(task: Task, examples: Sequence[Mapping[str, Any]], source: str) -> None:
    """Evaluation and training group a task's examples by its finest group field (exact match, the train/eval
    split): the data must have it; DataError naming the field and the fix otherwise (before any model runs)."""
    if not task.group_fields or not len(examples):
        return
    field = task.group_fields[-1]
    if field not in examples[0]:
        raise DataError(
            f"{source}: missing field {field!r}: task {task.name} groups its examples by it (group_field: exact "
            f"match, the train/eval split); add the column or rename one with --field-map {field}=COLUMN"
        )


def resolve_inputs(
    task: str | Path | Task = "rte",
    data: str | Path | None = None,
    n: int | None = None,
    *,
    need_labels: bool = False,
    field_map: str | Sequence[str] | Mapping[str, str] | None = None,
    prompt: PromptOptions | None = None,
) -> Inputs:
    """Task + up to ``n`` examples from ``data`` (a file, a saved dataset, ``hf:ORG/NAME``) or the bundled set,
    with the prompt options (chat, system prompt, few-shot) checked against the task.

    ``need_labels``: every example must be labelled (evaluate, train); the error names the file and line or row
    of the first unlabelled one. Demonstrations from ``prompt.shots_from`` are read and checked here too. Every
    problem is a one-line UsageError.
    """
    spec = get_task(task)
    if n is not None and n < 1:
        raise UsageError(f"--n must be at least 1, got {n}")
    if need_labels and not spec.has_labels:
        raise UsageError(
            f"task {spec.name} has no labels ({spec.kind} task): evaluate and train need a task with labels; "
            "capture, compare, figures and inspect work on it"
        )
    prompt = (prompt or PromptOptions()).resolved(spec)
    examples = _read(spec, data, n, need_labels, field_map)
    source = str(data) if data is not None else (spec.data or f"bundled:{spec.name}")
    if need_labels:
        _check_groups(spec, examples, source)
    pool: Sequence[dict] | None = None
    pool_source = ""
    shots_from = prompt.shots_from
    if prompt.shots and shots_from is None and spec.fewshot_data is not None and spec.fewshot_data != source:
        shots_from = spec.fewshot_data  # a harness task's fewshot_split
    pool_is_data = False
    if prompt.shots and shots_from is not None:
        pool = load_examples(shots_from, spec, require_labels=True, field_map=field_map)
        pool_source = str(shots_from)
    elif prompt.shots and n is not None:  # demonstrations from the whole data, whatever the limit
        every = _read(spec, data, None, False, field_map)
        pool = [e for e in every if e.get("labelled", e.get("label") is not None)]
        pool_source, pool_is_data = source, True
    facts = dict(getattr(examples, "facts", {}) or {})
    return Inputs(spec, examples, source, prompt, pool, pool_source, facts, pool_is_data)
