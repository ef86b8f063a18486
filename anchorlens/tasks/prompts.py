"""What the model reads for each example: the task's template, demonstrations, the chat template, text windows.

:class:`PromptOptions` are the user's choices (``--chat``, ``--system``, ``--chat-template``,
``--chat-template-kwargs``, ``--shots``, ``--shots-from``, ``--seed``); :func:`build_prompts` binds them to a task and a tokenizer and returns a :class:`Prompts`: the
run's :class:`~anchorlens.roles.scheme.RoleScheme` (its role table: the built-ins, the task's roles,
``scaffold``/``system`` with a chat template, ``demo``/``demo_label`` with demonstrations; its token rules)
and ``render(example) -> Rendered``. Every consumer (capture, compare, evaluate, train, sweeps, inspect) renders
through it, so the same example gives the same tokens and roles everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from anchorlens.errors import DataError, UsageError
from anchorlens.roles.chat import SCAFFOLD, SYSTEM, ChatLayout, ChatTemplateError, chat_render
from anchorlens.roles.chat_template import ChatTemplateChoiceError, Kwargs, resolve_chat_template
from anchorlens.roles.scheme import RoleScheme
from anchorlens.roles.table import RoleTable
from anchorlens.roles.templates import Rendered, literal
from anchorlens.tasks.explode import Row
from anchorlens.tasks.fewshot import DEMO, DEMO_LABEL, Demonstrations, check_pool, with_demonstrations
from anchorlens.tasks.task import TEXT, Task
from anchorlens.tasks.windows import DEFAULT_WINDOW, Windows

ROLE_SOURCES = {
    SCAFFOLD: "text the chat template adds (control tokens, role names, separators)",
    SYSTEM: "the system prompt",
    DEMO: "few-shot demonstrations (template and fields)",
    DEMO_LABEL: "the answers of few-shot demonstrations",
}


@dataclass(frozen=True)
class PromptOptions:
    """How examples become model input beyond the task's template.

    chat: render through the tokenizer's chat template (None: the task's ``chat``); system: the system prompt
    (None: the task's); chat_template: which of the tokenizer's named templates (None: the task's, else
    ``default``); chat_template_kwargs: template arguments as sorted ``(key, value)`` pairs (``enable_thinking``;
    over the task's own, key by key); shots: demonstrations per query (None: the task's ``shots``); shots_from: their source
    (a data source; None: the evaluated data); seed: which demonstrations; window: tokens per window of a text
    task (None: ``--max-length`` or 512).
    """

    chat: bool | None = None
    system: str | None = None
    shots: int | None = None
    shots_from: str | None = None
    seed: int = 0
    window: int | None = None
    chat_template: str | None = None
    chat_template_kwargs: Kwargs = ()

    def resolved(self, task: Task) -> PromptOptions:
        """These options with the task's defaults filled in; UsageError for combinations that cannot work."""
        chat = task.chat if self.chat is None else self.chat
        system = self.system if self.system is not None else task.system
        shots = task.shots if self.shots is None else self.shots
        if shots < 0:
            raise UsageError(f"--shots must be 0 or more, got {shots}")
        if system is not None and not chat:
            if self.system is None:  # the task's own system prompt, with chat turned off on the command line
                raise UsageError(
                    f"task {task.name} sets a system prompt, which needs the chat template; drop --no-chat"
                )
            raise UsageError("--system needs --chat (the system prompt goes into the chat template)")
        if shots and task.kind == TEXT:
            raise UsageError("--shots needs a task with labels; the text task has none")
        if self.shots_from is not None and not shots:
            raise UsageError("--shots-from needs --shots K (how many demonstrations per query)")
        name = self.chat_template if self.chat_template is not None else task.chat_template
        kwargs = tuple(sorted({**dict(task.chat_template_kwargs), **dict(self.chat_template_kwargs)}.items()))
        if (self.chat_template is not None or self.chat_template_kwargs) and not chat:
            raise UsageError("--chat-template and --chat-template-kwargs need --chat (they choose the chat template)")
        return replace(self, chat=chat, system=system, shots=shots, chat_template=name, chat_template_kwargs=kwargs)

    def describe(self) -> dict[str, Any]:
        """What to record in a manifest."""
        return {
            "chat": bool(self.chat),
            "system": self.system,
            "shots": self.shots or 0,
            "shots_from": self.shots_from,
            "seed": self.seed,
            "window": self.window,
            **(
                {"chat_template": self.chat_template, "chat_template_kwargs": dict(self.chat_template_kwargs)}
                if self.chat
                else {}
            ),
        }


@dataclass
class Prompts:
    """A task bound to a tokenizer and options: the run's role scheme and how each example is rendered.

    ``demos``: the demonstrations (None without shots); ``layout``: the chat layout (None without chat).
    """

    task: Task
    options: PromptOptions
    scheme: RoleScheme
    demos: Demonstrations | None = None
    layout: ChatLayout | None = None
    tokenizer: Any = field(default=None, repr=False)
    _windows: dict[int, tuple[Sequence[Row], Windows]] = field(default_factory=dict, repr=False)

    @property
    def roles(self) -> RoleTable:
        """The run's role table."""
        return self.scheme.table

    def render(self, example: Mapping[str, Any]) -> Rendered:
        """The model input of one example with a role for every character."""
        text = self.task.template.render(example)
        if self.demos is not None:
            text = with_demonstrations(self.task, text, self.demos.draw(example))
        if self.task.preamble:
            text = Rendered.join([literal(self.task.preamble), text])
        if self.layout is not None:
            try:
                text = chat_render(text, self.tokenizer, self.layout)
            except ChatTemplateError as err:
                raise DataError(f"example {example.get('idx')}: {err}") from None
        return text

    def examples(self, examples: Sequence[Row]) -> Sequence[Row]:
        """What the model reads, one item per forward row: ``examples`` themselves, or a text task's windows."""
        if self.task.kind != TEXT:
            return examples
        kept = self._windows.get(id(examples))
        if kept is None or kept[0] is not examples:  # cut once per sequence of documents (a compare reads them often)
            kept = (examples, Windows(examples, self.tokenizer, self.options.window or DEFAULT_WINDOW))
            self._windows[id(examples)] = kept
        return kept[1]

    def chat_template(self) -> dict[str, Any] | None:
        """The chat template the prompts render with (text, sha256, name, source, arguments; None without chat):
        what a manifest records and a resume key hashes."""
        if self.layout is None or self.layout.template is None:
            return None
        return self.layout.template.facts()

    def demonstrations(self) -> dict[str, Any] | None:
        """The few-shot draw (shots, seed, the pool's source, size and digest; None without shots): what a manifest
        records and a resume key hashes, so that a resume whose demonstrations would differ is refused."""
        return None if self.demos is None else self.demos.facts()

    def describe(self) -> dict[str, Any]:
        """The roles and prompt options for a run's manifest."""
        return {"roles": self.roles.to_json(), **self.options.describe()}


def role_scheme(task: Task, chat: bool, shots: int, add_special_tokens: bool = True) -> RoleScheme:
    """The role scheme of a task with these prompt options (roles in a fixed order: the task's, then chat's, then
    few-shot's)."""
    added: list[str] = ([SCAFFOLD, SYSTEM] if chat else []) + ([DEMO, DEMO_LABEL] if shots else [])
    for role in task.roles:
        if role in added and role != SCAFFOLD:  # a template may tag its own scaffold words ``scaffold`` on purpose
            option = "--shots" if role in (DEMO, DEMO_LABEL) else "--chat"
            raise UsageError(
                f"task {task.name} tags its own text with role {role!r}, which {option} gives its added text too "
                f"(the two could not be told apart); rename the task's role, e.g. {role}_text"
            )
    about = {r: ROLE_SOURCES[r] for r in added}
    about.update({r: f"task {task.name}" for r in task.roles})  # the task's own word wins (its template's scaffold)
    extra = [*task.roles, *added]
    table = RoleTable.with_roles(extra, about).with_fields(task.template.fields)  # fields are groups too
    return RoleScheme(table, task.rules, add_special_tokens=add_special_tokens)


def build_prompts(
    task: Task,
    tokenizer: Any,
    options: PromptOptions = PromptOptions(),
    *,
    queries: Sequence[Row] | None = None,
    pool: Sequence[Row] | None = None,
    pool_source: str = "",
    queries_source: str = "",
    pool_is_queries: bool = False,
) -> Prompts:
    """Bind ``task`` and ``options`` to ``tokenizer``: the run's role scheme, chat layout and demonstrations.

    ``pool``: the demonstrations' examples (from ``--shots-from``); None takes them from ``queries`` (the
    evaluated data, a query never its own demonstration; ``queries_source`` names that data in errors);
    ``pool_is_queries``: the pool is the whole of the data the queries come from. Bad combinations are a one-line
    UsageError.
    """
    options = options.resolved(task)
    layout = None
    if options.chat:
        try:
            template = resolve_chat_template(tokenizer, options.chat_template, options.chat_template_kwargs)
            layout = ChatLayout.of(tokenizer, options.system, template)
        except (ChatTemplateError, ChatTemplateChoiceError) as err:
            raise UsageError(str(err)) from None
    scheme = role_scheme(task, bool(options.chat), options.shots or 0, add_special_tokens=not options.chat)
    demos = None
    if options.shots:
        same = pool is None or pool_is_queries
        source = pool_source if pool is not None else (queries_source or "the evaluated data")
        chosen = queries if pool is None else pool
        if chosen is None:
            raise UsageError("--shots needs examples to draw demonstrations from (--shots-from FILE)")
        check_pool(chosen, task, source)
        fields = tuple(getattr(task.template, "fields", ()))  # a Jinja template names none: every field counts
        demos = Demonstrations(chosen, options.shots, options.seed, source, same_as_queries=same, fields=fields)
    return Prompts(task, options, scheme, demos, layout, tokenizer)


def plain_prompts(task: Task, tokenizer: Any = None) -> Prompts:
    """The task's template alone (no chat, no demonstrations)."""
    return build_prompts(task, tokenizer, PromptOptions(chat=False, shots=0))
