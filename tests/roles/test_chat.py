"""Chat templates: every token of a chat-rendered prompt gets scaffold / system / the task's own roles, checked
token by token against the rendered string, on tiny tokenizers with Llama-3-, Qwen- and Gemma-style templates and
on the embedded SmolLM2-Instruct's own template."""

from __future__ import annotations

import pytest

from anchorlens.models.tiny_tokenizers import tiny_tokenizer
from anchorlens.roles import encode
from anchorlens.roles.chat import ChatLayout, ChatTemplateError, chat_render
from anchorlens.tasks import get_task
from anchorlens.tasks.prompts import PromptOptions, build_prompts

# Jinja chat templates in the style of real ones (abridged; the control tokens and layout are the families')
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
QWEN = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are Qwen, a helpful assistant.<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set first = messages[0]['content'] + '\n\n' %}"
    "{% set rest = messages[1:] %}{% else %}{% set first = '' %}{% set rest = messages %}{% endif %}"
    "{% for m in rest %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ (first if loop.first else '') + m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
CONTROL = {
    "llama3": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "qwen": ["<|im_start|>", "<|im_end|>"],
    "gemma": ["<start_of_turn>", "<end_of_turn>"],
}
EXAMPLE = {"premise": "A dog ran in the park.", "hypothesis": "An animal moved.", "label": "entailment", "idx": 0}


def _tokenizer(style: str):
    tok = tiny_tokenizer("llama")
    tok.add_special_tokens({"additional_special_tokens": CONTROL[style]})
    tok.chat_template = {"llama3": LLAMA3, "qwen": QWEN, "gemma": GEMMA}[style]
    return tok


def _expected_roles(text: str, system: str | None, user: str, default_system: str = "") -> list[str]:
    """An independent reference: the role of every character of the rendered chat string."""
    roles = ["scaffold"] * len(text)
    u = text.index(user)
    user_roles = get_task("rte").template.render(EXAMPLE)
    for span in user_roles.spans:
        for i in range(span.start, span.end):
            roles[u + i] = span.role
    for s in (system, default_system):
        if s:
            at = text.index(s)
            roles[at : at + len(s)] = ["system"] * len(s)
    return roles


def _check_tokens(enc, rendered_text: str, char_roles: list[str]) -> int:
    """Each token's role = the role of its first non-whitespace character (its only one when no merge); returns
    how many tokens were checked."""
    names = enc.role_table.names
    offsets = enc.meta["offsets"][0]
    checked = 0
    for (start, end), role in zip(offsets, enc.roles[0].tolist()):
        if end <= start:
            continue
        chars = [i for i in range(start, end) if not rendered_text[i].isspace()] or list(range(start, end))
        want = {char_roles[i] for i in chars}
        assert names[role] in want, (rendered_text[start:end], names[role], want)
        checked += 1
    return checked


@pytest.mark.parametrize("style", ["llama3", "qwen", "gemma"])
@pytest.mark.parametrize("system", [None, "Answer briefly."])
def test_chat_roles_token_by_token(style, system, monkeypatch):
    tok = _tokenizer(style)
    prompts = build_prompts(get_task("rte"), tok, PromptOptions(chat=True, system=system))
    assert prompts.roles.extra == ("scaffold", "system") and not prompts.scheme.add_special_tokens
    rendered = prompts.render(EXAMPLE)
    assert rendered.text == tok.apply_chat_template(
        ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": rendered_user()}],
        tokenize=False,
        add_generation_prompt=True,
    )
    default = "You are Qwen, a helpful assistant." if style == "qwen" and system is None else ""
    char_roles = _expected_roles(rendered.text, system, rendered_user().strip(), default)
    enc = _encode_with_offsets(tok, rendered, prompts.scheme)
    assert _check_tokens(enc, rendered.text, char_roles) >= 20
    names = [enc.role_table.names[r] for r in enc.roles[0].tolist()]
    assert names.count("scaffold") >= 3 and "content" in names and "structural" in names
    assert ("system" in names) == bool(system or default)
    # the template writes its own BOS (Llama 3, Gemma) or none (Qwen); the tokenizer adds none on top
    assert enc.tokens[0].count("<s>") == (0 if style == "qwen" else 1)


def rendered_user() -> str:
    return get_task("rte").template.render(EXAMPLE).text


def _encode_with_offsets(tok, rendered, scheme):
    """encode() plus the offsets of the first example (for the reference check)."""
    enc = encode([rendered], tok, scheme=scheme)
    offsets = tok(rendered.text, add_special_tokens=scheme.add_special_tokens, return_offsets_mapping=True)[
        "offset_mapping"
    ]
    enc.meta["offsets"] = [offsets]
    return enc


def test_template_without_chat_or_system_role_is_refused():
    tok = tiny_tokenizer("llama")
    with pytest.raises(ChatTemplateError, match="has no chat template; drop --chat"):
        ChatLayout.of(tok)
    tok.chat_template = "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}<turn>{{ m['content'] }}{% endfor %}"
    assert ChatLayout.of(tok).system is None  # without --system it works
    with pytest.raises(ChatTemplateError, match="no system role; drop --system"):
        ChatLayout.of(tok, "be brief")


def test_a_template_that_rewrites_the_message_is_refused():
    tok = tiny_tokenizer("llama")
    tok.chat_template = "{% for m in messages %}<u>{{ m['content'] | upper }}{% endfor %}"
    layout = ChatLayout.of(tok)
    with pytest.raises(ChatTemplateError, match="rewrites the message"):
        chat_render(get_task("rte").template.render(EXAMPLE), tok, layout)


@pytest.mark.slow
def test_smollm2_instruct_template_roles_token_by_token(smollm2):
    """The embedded model's own ChatML template (its default system prompt is the template's: role system)."""
    tok = smollm2.tokenizer
    prompts = build_prompts(get_task("rte"), tok, PromptOptions(chat=True))
    rendered = prompts.render(EXAMPLE)
    default = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert rendered.text.startswith("<|im_start|>system\n" + default + "<|im_end|>\n<|im_start|>user\n")
    assert rendered.text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    enc = _encode_with_offsets(tok, rendered, prompts.scheme)
    char_roles = _expected_roles(rendered.text, None, rendered_user(), default)
    assert _check_tokens(enc, rendered.text, char_roles) == enc.input_ids.shape[1]
    names = [enc.role_table.names[r] for r in enc.roles[0].tolist()]
    assert names[:3] == ["scaffold", "scaffold", "scaffold"]  # <|im_start|> system \n
    assert names.count("system") == len(tok(default, add_special_tokens=False)["input_ids"])
