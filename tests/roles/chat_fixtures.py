"""Chat templates of real model families, written out here (no download): faithful abridged reproductions of
each family's ``tokenizer_config.json`` template (tool-calling branches left out; every branch a plain chat with
an optional system message reaches is the family's own), and tiny tokenizers that carry them."""

from __future__ import annotations

from anchorlens.models.tiny_tokenizers import tiny_tokenizer

# microsoft/Phi-3-medium-4k-instruct: no system role; a system message is dropped without a word, and the
# assistant header follows every user turn whatever add_generation_prompt says
PHI3_MEDIUM = (
    "{% for message in messages %}{% if (message['role'] == 'user') %}"
    "{{'<|user|>' + '\n' + message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}"
    "{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\n'}}{% endif %}{% endfor %}"
)

# mistralai/Mistral-7B-Instruct-v0.3 (the tool-calling revision): the system message is merged into the last
# user turn, "[INST] system\n\nuser[/INST]"
MISTRAL_V03 = """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

# a Mistral-v0.3-style conversion that takes the system message off the conversation and never writes it
MISTRAL_DROPS_SYSTEM = """{%- if messages[0]['role'] == 'system' %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message['role'] == 'user' %}
        {{- '[INST] ' + message['content'] + '[/INST]' }}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token }}
    {%- endif %}
{%- endfor %}
"""

# meta-llama/Llama-3.1-8B-Instruct: the system message is trimmed and written after the template's own
# knowledge-date lines; every message's content is trimmed
LLAMA31 = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# Qwen/Qwen3-8B: ChatML; with enable_thinking=false the generation prompt holds an empty think block
QWEN3 = """{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

# HuggingFaceTB/SmolLM3-3B: the system prompt's /think or /no_think sets the reasoning mode and is taken out of
# the text written (the date is fixed here; the real template asks strftime_now)
SMOLLM3 = """{%- if enable_thinking is not defined -%}
{%- set enable_thinking = true -%}
{%- endif -%}
{%- if enable_thinking -%}
  {%- set reasoning_mode = "/think" -%}
{%- else -%}
  {%- set reasoning_mode = "/no_think" -%}
{%- endif -%}
{{- "<|im_start|>system\\n" -}}
{%- if messages[0].role == "system" -%}
  {%- set system_message = messages[0].content -%}
  {%- if "/no_think" in system_message -%}
    {%- set reasoning_mode = "/no_think" -%}
  {%- elif "/think" in system_message -%}
    {%- set reasoning_mode = "/think" -%}
  {%- endif -%}
  {%- set custom_instructions = system_message.replace("/no_think", "").replace("/think", "").rstrip() -%}
{%- endif -%}
{{- "## Metadata\\n\\n" -}}
{{- "Knowledge Cutoff Date: June 2025\\n" -}}
{{- "Today Date: 01 July 2025\\n" -}}
{{- "Reasoning Mode: " + reasoning_mode + "\\n\\n" -}}
{{- "## Custom Instructions\\n\\n" -}}
{%- if custom_instructions -%}
  {{- custom_instructions + "\\n\\n" -}}
{%- elif reasoning_mode == "/think" -%}
  {{- "You are a helpful AI assistant named SmolLM, trained by Hugging Face. Your role as an assistant involves thoroughly exploring questions through a systematic thinking process before providing the final precise and accurate solution.\\n\\n" -}}
{%- else -%}
  {{- "You are a helpful AI assistant named SmolLM, trained by Hugging Face.\\n\\n" -}}
{%- endif -%}
{{- "<|im_end|>\\n" -}}
{%- for message in messages -%}
    {%- set content = message.content if message.content is string else "" -%}
    {%- if message.role == "user" -%}
        {{ "<|im_start|>" + message.role + "\\n"  + content + "<|im_end|>\\n" }}
    {%- elif message.role == "assistant" -%}
        {{ "<|im_start|>assistant\\n" + content + "<|im_end|>\\n" }}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {%- if reasoning_mode == "/think" -%}
        {{ "<|im_start|>assistant\\n" }}
    {%- else -%}
        {{ "<|im_start|>assistant\\n" + "<think>\\n\\n</think>\\n" }}
    {%- endif -%}
{%- endif -%}"""

TEMPLATES = {
    "phi3-medium": PHI3_MEDIUM,
    "mistral-v0.3": MISTRAL_V03,
    "mistral-drops-system": MISTRAL_DROPS_SYSTEM,
    "llama-3.1": LLAMA31,
    "qwen3": QWEN3,
    "smollm3": SMOLLM3,
}
CONTROL = {
    "phi3-medium": ["<|user|>", "<|end|>", "<|assistant|>"],
    "mistral-v0.3": ["[INST]", "[/INST]"],
    "mistral-drops-system": ["[INST]", "[/INST]"],
    "llama-3.1": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "qwen3": ["<|im_start|>", "<|im_end|>", "<think>", "</think>"],
    "smollm3": ["<|im_start|>", "<|im_end|>", "<think>", "</think>"],
}


def chat_tokenizer(family: str, template: str | dict[str, str] | None = None):
    """A tiny llama-style tokenizer with ``family``'s control tokens and chat template (or ``template``)."""
    tok = tiny_tokenizer("llama")
    tok.add_special_tokens({"additional_special_tokens": CONTROL[family]})
    tok.chat_template = TEMPLATES[family] if template is None else template
    return tok
