"""Real chat templates (written out in chat_fixtures.py): templates without a system role, merged and trimmed
system prompts, SmolLM3's /no_think, Qwen3's enable_thinking, named templates. Every prompt's token ids equal
HF's ``apply_chat_template`` with the same arguments, and every token's role equals an independent reference
built from where the user turn and the system text sit in HF's own output."""

from __future__ import annotations

import hashlib

import pytest

from anchorlens.errors import UsageError
from anchorlens.roles import encode
from anchorlens.roles.chat_template import ChatTemplateChoiceError, parse_kwargs, resolve_chat_template
from anchorlens.tasks import get_task
from anchorlens.tasks.prompts import PromptOptions, build_prompts
from tests.roles.chat_fixtures import MISTRAL_V03, QWEN3, chat_tokenizer

EXAMPLE = {"premise": "A dog ran in the park.", "hypothesis": "An animal moved.", "label": "entailment", "idx": 0}
USER = get_task("rte").template.render(EXAMPLE)

# (family, --system, template arguments, the system text the template writes: None = no system span)
CASES = [
    ("phi3-medium", None, {}, None),
    ("mistral-v0.3", None, {}, None),
    ("mistral-v0.3", "Answer briefly.", {}, "Answer briefly."),
    ("mistral-drops-system", None, {}, None),
    ("llama-3.1", None, {}, None),
    ("llama-3.1", "Answer briefly.\n", {}, "Answer briefly."),  # a TOML """...""" string: Llama 3.1 trims it
    ("llama-3.1", "  Answer briefly.\n\n", {"date_string": "01 Jan 2025"}, "Answer briefly."),
    ("qwen3", None, {}, None),
    ("qwen3", None, {"enable_thinking": False}, None),
    ("qwen3", "Answer briefly.\n", {"enable_thinking": False}, "Answer briefly.\n"),
    ("smollm3", "Be brief. /no_think", {}, "Be brief."),
    ("smollm3", "Be brief.", {"enable_thinking": False}, "Be brief."),
]


def _messages(system: str | None) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": USER.text}
    ]


def _reference_roles(text: str, written: str | None, default: str | None) -> list[str]:
    """The role of every character of HF's output: the user turn's own spans where it sits, ``system`` on the
    system text the template writes, ``scaffold`` elsewhere."""
    roles = ["scaffold"] * len(text)
    assert text.count(USER.text) == 1
    at = text.index(USER.text)
    for span in USER.spans:
        roles[at + span.start : at + span.end] = [span.role] * (span.end - span.start)
    for system in (written, default):
        if system:
            assert text[:at].count(system) == 1
            s = text.index(system)
            roles[s : s + len(system)] = ["system"] * len(system)
    return roles


@pytest.mark.parametrize(("family", "system", "kwargs", "written"), CASES)
def test_real_templates_give_hf_tokens_and_exact_roles(family, system, kwargs, written):
    tok = chat_tokenizer(family)
    options = PromptOptions(
        chat=True, system=system, chat_template_kwargs=parse_kwargs(f"{k}={v}" for k, v in kwargs.items())
    )
    prompts = build_prompts(get_task("rte"), tok, options)
    rendered = prompts.render(EXAMPLE)
    hf_text = tok.apply_chat_template(_messages(system), tokenize=False, add_generation_prompt=True, **kwargs)
    assert rendered.text == hf_text
    hf_ids = tok.apply_chat_template(_messages(system), tokenize=True, add_generation_prompt=True, **kwargs)
    hf_ids = hf_ids["input_ids"] if not isinstance(hf_ids, list) else hf_ids
    enc = encode([rendered], tok, scheme=prompts.scheme)
    assert enc.input_ids[0].tolist() == list(hf_ids)
    default = "You are a helpful AI assistant named SmolLM" if family == "smollm3" and system is None else None
    chars = _reference_roles(hf_text, written, default)
    offsets = tok(hf_text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    names = [enc.role_table.names[r] for r in enc.roles[0].tolist()]
    assert len(offsets) == len(names)
    checked = 0
    for (start, end), role in zip(offsets, names):
        if end <= start:  # a token whose offsets cover no character (a byte-level piece of the one before)
            continue
        checked += 1
        span = [i for i in range(start, end) if not hf_text[i].isspace()] or list(range(start, end))
        assert role in {chars[i] for i in span}, (hf_text[start:end], role)
    assert checked >= 0.8 * len(names)
    assert ("system" in names) == (written is not None)
    assert names.count("content") >= 2 and "structural" in names and "scaffold" in names


@pytest.mark.parametrize("family", ["phi3-medium", "mistral-drops-system"])
def test_templates_that_ignore_system_messages_run_without_and_refuse_system(family):
    tok = chat_tokenizer(family)
    prompts = build_prompts(get_task("rte"), tok, PromptOptions(chat=True))
    assert prompts.layout is not None and prompts.layout.system is None
    assert prompts.render(EXAMPLE).text == tok.apply_chat_template(
        _messages(None), tokenize=False, add_generation_prompt=True
    )
    with pytest.raises(
        UsageError, match=r"^the chat template ignores system messages \(it writes none\); drop --system$"
    ):
        build_prompts(get_task("rte"), tok, PromptOptions(chat=True, system="Be brief."))


def test_mistral_merges_the_system_prompt_into_the_user_turn():
    tok = chat_tokenizer("mistral-v0.3")
    rendered = build_prompts(get_task("rte"), tok, PromptOptions(chat=True, system="Be brief.")).render(EXAMPLE)
    system = [rendered.text[s.start : s.end] for s in rendered.spans if s.role == "system"]
    assert system == ["Be brief."] and rendered.text.startswith("<s>[INST] Be brief.\n\n" + USER.text)


def test_enable_thinking_false_changes_qwen3_rendering_only_in_scaffold():
    tok = chat_tokenizer("qwen3")
    on = build_prompts(get_task("rte"), tok, PromptOptions(chat=True)).render(EXAMPLE)
    off_opts = PromptOptions(chat=True, chat_template_kwargs=parse_kwargs(["enable_thinking=false"]))
    off_prompts = build_prompts(get_task("rte"), tok, off_opts)
    off = off_prompts.render(EXAMPLE)
    assert off.text == on.text + "<think>\n\n</think>\n\n"
    assert off.spans[-1].role == "scaffold" and off.spans[-1].end == len(off.text)
    assert [s for s in off.spans if s.role != "scaffold"] == [s for s in on.spans if s.role != "scaffold"]
    facts = off_prompts.chat_template()
    assert facts is not None and facts["kwargs"] == {"enable_thinking": False}
    assert facts["sha256"] == hashlib.sha256(QWEN3.encode()).hexdigest() and facts["text"] == QWEN3


def test_named_templates_are_chosen_by_name():
    plain = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    tok = chat_tokenizer("qwen3", {"tool_use": QWEN3, "plain": plain})
    with pytest.raises(
        UsageError,
        match=r"several chat templates \(plain, tool_use\) and none named 'default'; choose one with --chat-template NAME",
    ):
        build_prompts(get_task("rte"), tok, PromptOptions(chat=True))
    chosen = build_prompts(get_task("rte"), tok, PromptOptions(chat=True, chat_template="plain"))
    assert chosen.render(EXAMPLE).text == tok.apply_chat_template(
        _messages(None), tokenize=False, chat_template="plain"
    )
    assert chosen.chat_template()["name"] == "plain"
    with pytest.raises(UsageError, match=r"no chat template named 'nope'; it has: plain, tool_use"):
        build_prompts(get_task("rte"), tok, PromptOptions(chat=True, chat_template="nope"))
    single = chat_tokenizer("mistral-v0.3")
    with pytest.raises(UsageError, match="single chat template, not one named 'tool_use'; drop --chat-template"):
        build_prompts(get_task("rte"), single, PromptOptions(chat=True, chat_template="tool_use"))
    assert resolve_chat_template(single, "default").text == MISTRAL_V03
    with pytest.raises(UsageError, match="need --chat"):
        PromptOptions(chat=False, chat_template="plain").resolved(get_task("rte"))


def test_template_kwargs_parse_as_json_or_text():
    assert parse_kwargs(["enable_thinking=false", "n=3", "name=Bob", "x=True", "l=[1, 2]"]) == (
        ("enable_thinking", False),
        ("l", [1, 2]),
        ("n", 3),
        ("name", "Bob"),
        ("x", True),
    )
    for bad, why in [
        ("enable_thinking", "not KEY=VALUE"),
        ("1x=2", "not a template argument name"),
        ("messages=1", "set by anchorlens"),
    ]:
        with pytest.raises(ChatTemplateChoiceError, match=why):
            parse_kwargs([bad])


def test_the_template_source_is_the_file_transformers_reads(tmp_path):
    import json

    from transformers import AutoTokenizer

    tok = chat_tokenizer("qwen3")
    tok.save_pretrained(tmp_path)
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = QWEN3
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    found = resolve_chat_template(loaded)
    assert (
        found is not None
        and found.text == QWEN3
        and found.source == f"{tmp_path / 'tokenizer_config.json'} (chat_template)"
    )
    (tmp_path / "chat_template.jinja").write_text(MISTRAL_V03)  # transformers prefers this file to the config's
    found = resolve_chat_template(AutoTokenizer.from_pretrained(tmp_path))
    assert found is not None and found.text == MISTRAL_V03 and found.source == str(tmp_path / "chat_template.jinja")
    assert resolve_chat_template(tok).source.startswith("set on the tokenizer")


def test_a_task_file_sets_the_template_and_its_arguments(tmp_path):
    from anchorlens.tasks.taskfile import parse_task_text

    text = (
        'name = "nli"\ntemplate = "{premise} / {hypothesis}"\nlabels = { entailment = " yes", other = " no" }\n'
        'chat = true\nsystem = """Be brief.\n"""\nchat_template = "tool_use"\n'
        "chat_template_kwargs = { enable_thinking = false }\n"
    )
    task = parse_task_text(text, "nli.toml", "nli.toml")
    tok = chat_tokenizer("qwen3", {"tool_use": QWEN3})
    prompts = build_prompts(task, tok, PromptOptions())
    messages = [{"role": "system", "content": "Be brief.\n"}, {"role": "user", "content": "A / B"}]
    assert prompts.render({"premise": "A", "hypothesis": "B", "idx": 0}).text == tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, chat_template="tool_use", enable_thinking=False
    )
    assert prompts.chat_template()["kwargs"] == {"enable_thinking": False}
    # the command line wins key by key
    over = PromptOptions(chat_template_kwargs=parse_kwargs(["enable_thinking=true"]))
    assert build_prompts(task, tok, over).options.chat_template_kwargs == (("enable_thinking", True),)
    from anchorlens.errors import DataError

    for bad, why in [
        (text.replace("chat = true", "chat = false").replace('system = """Be brief.\n"""\n', ""), "needs chat = true"),
        (text.replace("enable_thinking = false", "messages = 1"), "set by anchorlens"),
    ]:
        with pytest.raises(DataError, match=why):
            parse_task_text(bad, "nli.toml", "nli.toml")
