"""Render a task's text through the tokenizer's own chat template, keeping every character's role.

``tokenizer.apply_chat_template`` (with the generation prompt) turns the user turn (the task's rendered
template, demonstrations included) and an optional system prompt into the model's chat format. The text the
template adds (control tokens such as ``<|im_start|>``, role names, separators) gets role ``scaffold``; the
system prompt gets ``system`` (also a default system prompt the template writes itself, such as SmolLM2's
"You are a helpful AI assistant named SmolLM..."); the user turn keeps the roles of its own spans (structural,
content, demo...). Spans come from character offsets of the rendered string: the template is rendered once
with sentinel messages to find where each message goes, and every example's render is checked against that
layout (templates that trim the message are followed; any other rewrite is refused, never guessed). A system
prompt is rendered between sentinels to find where it goes, then as itself to read the text the template
writes for it (Llama 3.1 trims it, SmolLM3 takes ``/no_think`` out): that text is ``system``. Templates without a
system role (Phi-3-medium drops system messages, others raise) run without one and refuse ``--system``. The
template text, its name among several and its arguments (``enable_thinking``) are a
:class:`~anchorlens.roles.chat_template.ChatTemplate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from anchorlens.roles.chat_template import ChatTemplate, ChatTemplateChoiceError, resolve_chat_template
from anchorlens.roles.templates import Rendered, literal

SCAFFOLD = "scaffold"
SYSTEM = "system"
_USER_MARK = "\ue000ANCHORLENS_USER\ue001"
_SYSTEM_MARK = "\ue000ANCHORLENS_SYSTEM\ue001"
_SYSTEM_END = "\ue000ANCHORLENS_SYSTEM_END\ue001"


class ChatTemplateError(ValueError):
    """The tokenizer has no chat template, or it cannot be followed character by character."""


def _render(tokenizer: Any, messages: list[dict[str, str]], template: ChatTemplate) -> str:
    """The chat template's text for ``messages`` with the generation prompt and the template's arguments."""
    try:
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **template.render_kwargs()
        )
    except Exception as err:  # jinja's TemplateError ("System role not supported"), missing templates...
        raise ChatTemplateError(f"the tokenizer's chat template fails: {' '.join(str(err).split())}") from None
    if not isinstance(text, str):
        raise ChatTemplateError("the tokenizer's chat template did not return text")
    return text


def _template(tokenizer: Any, template: ChatTemplate | None) -> ChatTemplate:
    """``template``, or the tokenizer's default one; ChatTemplateError when there is none or no default."""
    if template is not None:
        return template
    try:
        found = resolve_chat_template(tokenizer)
    except ChatTemplateChoiceError as err:
        raise ChatTemplateError(str(err)) from None
    if found is None:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ChatTemplateError(
            f"the tokenizer {name} has no chat template; drop --chat (or the task file's chat = true)"
        )
    return found


@dataclass(frozen=True)
class ChatLayout:
    """Where a chat template puts the system prompt and the user turn.

    ``before``/``between``/``after``: the template's own text around the system prompt and the user turn
    (``between`` is everything from the end of the system prompt to the start of the user turn);
    ``default_system``: the system text the template writes when none is given ("" when it writes none);
    ``system``: the system prompt given (None: the template's default, if any); ``written``: the system text as
    the template writes it (``system`` itself, or trimmed, or with directives such as SmolLM3's ``/no_think``
    taken out); ``template``: the chat template and its arguments.
    """

    before: str
    between: str
    after: str
    default_system: str
    system: str | None
    written: str | None = None
    template: ChatTemplate | None = None

    @classmethod
    def of(cls, tokenizer: Any, system: str | None = None, template: ChatTemplate | None = None) -> ChatLayout:
        """Find the layout by rendering sentinel messages (the given system prompt between sentinels); a
        ChatTemplateError naming the cause when there is no chat template or it cannot be followed."""
        chat = _template(tokenizer, template)
        plain = _render(tokenizer, [{"role": "user", "content": _USER_MARK}], chat)
        if plain.count(_USER_MARK) != 1:
            raise ChatTemplateError("the chat template does not write the user message exactly once")
        if system is not None:
            return cls._with_system(tokenizer, system, chat)
        try:
            with_system = _render(
                tokenizer,
                [{"role": "system", "content": _SYSTEM_MARK}, {"role": "user", "content": _USER_MARK}],
                chat,
            )
        except ChatTemplateError:  # no system role ("System role not supported"): the user turn alone
            with_system = ""
        lead, tail = plain.split(_USER_MARK)
        if with_system.count(_SYSTEM_MARK) != 1 or with_system.count(_USER_MARK) != 1:
            # the template refuses, drops or repeats system messages: without --system it writes none
            return cls(lead, "", tail, "", None, None, chat)
        before, rest = with_system.split(_SYSTEM_MARK)
        between, after = rest.split(_USER_MARK)
        if tail == after and lead.startswith(before) and lead.endswith(between) and len(lead) >= len(before + between):
            default = lead[len(before) : len(lead) - len(between)]
            return cls(before, between, after, default, None, None, chat)
        return cls(lead, "", tail, "", None, None, chat)  # no system block by default: all of it is scaffold

    @classmethod
    def _with_system(cls, tokenizer: Any, system: str, chat: ChatTemplate) -> ChatLayout:
        """The layout with the system prompt ``system``: where the template writes it and as what text."""
        try:
            marked = _render(
                tokenizer,
                [
                    {"role": "system", "content": _SYSTEM_MARK + system + _SYSTEM_END},
                    {"role": "user", "content": _USER_MARK},
                ],
                chat,
            )
        except ChatTemplateError as err:
            reason = str(err).removeprefix("the tokenizer's chat template fails: ")
            raise ChatTemplateError(
                f"the chat template has no system role; drop --system (it fails on a system message: {reason})"
            ) from None
        counts = (marked.count(_SYSTEM_MARK), marked.count(_SYSTEM_END), marked.count(_USER_MARK))
        if counts[0] == 0 and counts[1] == 0 and counts[2] == 1:
            raise ChatTemplateError("the chat template ignores system messages (it writes none); drop --system")
        if counts != (1, 1, 1) or marked.index(_SYSTEM_END) > marked.index(_USER_MARK):
            raise ChatTemplateError(
                "the chat template does not write the system prompt once before the user message; drop --system"
            )
        before = marked[: marked.index(_SYSTEM_MARK)]
        rest = marked[marked.index(_SYSTEM_END) + len(_SYSTEM_END) :]
        between, after = rest.split(_USER_MARK)
        real = _render(
            tokenizer, [{"role": "system", "content": system}, {"role": "user", "content": _USER_MARK}], chat
        )
        tail = between + _USER_MARK + after
        if not (real.startswith(before) and real.endswith(tail) and len(real) >= len(before) + len(tail)):
            at = next((i for i, (a, b) in enumerate(zip(before, real)) if a != b), min(len(real), len(before)))
            raise ChatTemplateError(
                f"the chat template writes its text around the system prompt differently for this prompt than for "
                f"a marked one (at character {at}: {real[max(0, at - 20) : at + 20]!r}); anchorlens cannot give its "
                "characters roles"
            )
        written = real[len(before) : len(real) - len(tail)]
        return cls(before, between, after, "", system, written, chat)

    def wrap(self, user: Rendered) -> Rendered:
        """The chat text around ``user`` with scaffold and system spans (system text is filled text when given)."""
        if self.system is not None:
            text = self.system if self.written is None else self.written
            system = literal(text, SYSTEM, SYSTEM, slot=True)
        else:
            system = literal(self.default_system, SYSTEM, SYSTEM)
        return Rendered.join(
            [
                literal(self.before, SCAFFOLD),
                system,
                literal(self.between, SCAFFOLD),
                user,
                literal(self.after, SCAFFOLD),
            ]
        )

    def messages(self, user_text: str) -> list[dict[str, str]]:
        """The messages whose render :meth:`wrap` lays out."""
        if self.system is None:
            return [{"role": "user", "content": user_text}]
        return [{"role": "system", "content": self.system}, {"role": "user", "content": user_text}]

    def render(self, tokenizer: Any, user_text: str) -> str:
        """The template's real text for ``user_text`` (with this layout's system prompt and arguments)."""
        return _render(tokenizer, self.messages(user_text), _template(tokenizer, self.template))


def strip_rendered(rendered: Rendered) -> Rendered:
    """``rendered`` with leading and trailing whitespace removed, spans cut to match (what ``| trim`` does)."""
    text = rendered.text
    start = len(text) - len(text.lstrip())
    end = len(text.rstrip())
    spans = []
    for span in rendered.spans:
        lo, hi = max(span.start, start), min(span.end, end)
        if hi > lo:
            spans.append(type(span)(lo - start, hi - start, span.role, span.field, span.slot))
    return Rendered(text[start:end], tuple(spans))


def chat_render(user: Rendered, tokenizer: Any, layout: ChatLayout) -> Rendered:
    """``user`` rendered through the tokenizer's chat template with every span's role (module docstring).

    The expected layout is checked against the template's real output for this text; a template that trims
    the message is followed; any other difference is a ChatTemplateError naming it.
    """
    real = layout.render(tokenizer, user.text)
    wrapped = layout.wrap(user)
    if wrapped.text == real:
        return wrapped
    trimmed = layout.wrap(strip_rendered(user))
    if trimmed.text == real:
        return trimmed
    at = next((i for i, (a, b) in enumerate(zip(wrapped.text, real)) if a != b), min(len(real), len(wrapped.text)))
    raise ChatTemplateError(
        f"the chat template rewrites the message (its output differs at character {at}: "
        f"{real[max(0, at - 20) : at + 20]!r}); anchorlens cannot give its characters roles"
    )
