"""Render a task's text through the tokenizer's own chat template, keeping every character's role.

``tokenizer.apply_chat_template`` (with the generation prompt) turns the user turn (the task's rendered
template, demonstrations included) and an optional system prompt into the model's chat format. The text the
template adds (control tokens such as ``<|im_start|>``, role names, separators) gets role ``scaffold``; the
system prompt gets ``system`` (also a default system prompt the template writes itself, such as SmolLM2's
"You are a helpful AI assistant named SmolLM..."); the user turn keeps the roles of its own spans (structural,
content, demo...). Spans come from character offsets of the rendered string: the template is rendered once
with sentinel messages to find where each message goes, and every example's render is checked against that
layout (templates that trim the message are followed; any other rewrite is refused, never guessed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from anchorlens.roles.templates import Rendered, literal

SCAFFOLD = "scaffold"
SYSTEM = "system"
_USER_MARK = "\ue000ANCHORLENS_USER\ue001"
_SYSTEM_MARK = "\ue000ANCHORLENS_SYSTEM\ue001"


class ChatTemplateError(ValueError):
    """The tokenizer has no chat template, or it cannot be followed character by character."""


def _render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The chat template's text for ``messages`` with the generation prompt."""
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as err:  # jinja's TemplateError ("System role not supported"), missing templates...
        raise ChatTemplateError(f"the tokenizer's chat template fails: {' '.join(str(err).split())}") from None
    if not isinstance(text, str):
        raise ChatTemplateError("the tokenizer's chat template did not return text")
    return text


@dataclass(frozen=True)
class ChatLayout:
    """Where a chat template puts the system prompt and the user turn.

    ``before``/``between``/``after``: the template's own text around the system prompt and the user turn
    (``between`` is everything from the end of the system prompt to the start of the user turn);
    ``default_system``: the system text the template writes when none is given ("" when it writes none);
    ``system``: the system prompt given (None: the template's default, if any).
    """

    before: str
    between: str
    after: str
    default_system: str
    system: str | None

    @classmethod
    def of(cls, tokenizer: Any, system: str | None = None) -> ChatLayout:
        """Find the layout by rendering sentinel messages; ChatTemplateError when there is no chat template."""
        if not getattr(tokenizer, "chat_template", None):
            name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            raise ChatTemplateError(f"the tokenizer {name} has no chat template; drop --chat (or chat = true)")
        plain = _render(tokenizer, [{"role": "user", "content": _USER_MARK}])
        if plain.count(_USER_MARK) != 1:
            raise ChatTemplateError("the chat template does not write the user message exactly once")
        try:
            with_system = _render(
                tokenizer, [{"role": "system", "content": _SYSTEM_MARK}, {"role": "user", "content": _USER_MARK}]
            )
        except ChatTemplateError:
            if system is not None:
                raise ChatTemplateError("the chat template has no system role; drop --system") from None
            before, after = plain.split(_USER_MARK)
            return cls(before, "", after, "", None)
        if with_system.count(_SYSTEM_MARK) != 1 or with_system.count(_USER_MARK) != 1:
            raise ChatTemplateError("the chat template does not write the system and user messages once each")
        before, rest = with_system.split(_SYSTEM_MARK)
        between, after = rest.split(_USER_MARK)
        lead, tail = plain.split(_USER_MARK)
        default = ""
        if tail == after and lead.startswith(before) and lead.endswith(between) and len(lead) >= len(before + between):
            default = lead[len(before) : len(lead) - len(between)]
        elif system is None:  # the template writes no system block by default: all of it is scaffold
            return cls(lead, "", tail, "", None)
        return cls(before, between, after, default, system)

    def wrap(self, user: Rendered) -> Rendered:
        """The chat text around ``user`` with scaffold and system spans (system text is filled text when given)."""
        if self.system is not None:
            system = literal(self.system, SYSTEM, SYSTEM, slot=True)
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
    real = _render(tokenizer, layout.messages(user.text))
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
