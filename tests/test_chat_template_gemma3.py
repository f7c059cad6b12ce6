"""Gemma 3's published chat template (tokenizer_config.json of google/gemma-3-*-it, which GGUF conversions
embed as tokenizer.chat_template) renders through our sandboxed renderer as the template's own rules say:
the system message folded into the first user turn, "assistant" named "model", contents trimmed, turns
closed by <end_of_turn>, and alternation enforced with the template's own raise_exception. The expected
strings follow from the template text; plain jinja2 renders the same template as a second opinion."""

from __future__ import annotations

import jinja2
import pytest

from hipcore.runtime.errors import UsageError
from hipcore.tokenizer.chat_template import render_chat

GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

CASES = [
    ([{"role": "user", "content": "Hi there "}],
     "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n"),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"},
      {"role": "assistant", "content": "Rayleigh scattering."}, {"role": "user", "content": "And sunsets?"}],
     "<bos><start_of_turn>user\nBe brief.\n\nWhy is the sky blue?<end_of_turn>\n<start_of_turn>model\n"
     "Rayleigh scattering.<end_of_turn>\n<start_of_turn>user\nAnd sunsets?<end_of_turn>\n<start_of_turn>model\n"),
]


def _plain_jinja(messages) -> str:
    def raise_exception(message):
        raise jinja2.TemplateError(message)
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(GEMMA3_TEMPLATE).render(messages=messages, bos_token="<bos>", eos_token="<eos>",
                                                   add_generation_prompt=True, raise_exception=raise_exception)


@pytest.mark.parametrize("messages,expected", CASES)
def test_gemma3_template_renders_as_its_rules_say(messages, expected):
    assert render_chat(GEMMA3_TEMPLATE, messages, bos_token="<bos>", eos_token="<eos>") == expected
    assert _plain_jinja(messages) == expected


def test_gemma3_template_refuses_turns_that_do_not_alternate():
    with pytest.raises(UsageError, match="chat template rejected the conversation: Conversation roles must alternate"):
        render_chat(GEMMA3_TEMPLATE, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
                    bos_token="<bos>", eos_token="<eos>")
