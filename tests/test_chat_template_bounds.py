"""Chat templates stay bounded all the way to the token ids, and blame the right party.

A 20-byte template once rendered 4,000,000 spaces (inside the old 4 MiB cap) and the tokenizer then
spent a minute and 1.7 GB on them; a BOS text of megabytes made that cap grow four times its size.
Now: the template's allowance (hipcore.tokenizer.chat_template) stops such a render at about 16 Ki
characters (exit 3, "the model's chat template ..."), the context's bound refuses a conversation
that cannot fit before anything is rendered or tokenized (exit 2), and text from the template
reaches an error message only escaped.
"""

from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

from support.gguf_factory import write_tiny_llama
from hipcore.errors import InvalidModelError, UsageError
from hipcore.tokenizer.chat_template import (
    CHATML_TEMPLATE, MAX_CHARS_PER_TOKEN, TEMPLATE_SLACK_CHARS, chat_prompt, render_chat,
)
from hipcore.tokenizer.tokenizer import Tokenizer
from hipcore.gguf.file import read_plan
from rocmforge_cli.app import app

USER = [{"role": "user", "content": "hi"}]
SPACES = "{{ ' ' * 4000000 }}"
MODES = pytest.mark.parametrize("isolated", [True, False], ids=["child", "in-process"])


@MODES
def test_a_template_that_writes_megabytes_is_stopped_at_its_allowance(isolated):
    start = time.perf_counter()
    with pytest.raises(InvalidModelError, match="the model's chat template was stopped") as caught:
        render_chat(SPACES, USER, bos_token="<s>", eos_token="</s>", isolated=isolated)
    assert time.perf_counter() - start < 10.0
    assert f"{TEMPLATE_SLACK_CHARS + 2 * (len(SPACES) + 7) + 4 * 6:,} characters" in str(caught.value)


@MODES
def test_a_huge_bos_text_does_not_widen_the_allowance(isolated):
    # Formerly the cap was 4 MiB + 4 x (conversation + BOS + EOS): an 8-million-character BOS let
    # this template write 30 MB. A BOS now counts once per message, and at most as long as the file
    # reader lets a token text be.
    template = "{{ bos_token[:10] }}{{ ' ' * 100000 }}"
    with pytest.raises(InvalidModelError, match="was stopped"):
        render_chat(template, USER, bos_token="x" * 8_000_000, eos_token="", isolated=isolated)
    # ... while printing a long (valid) BOS once per message stays allowed
    text = render_chat("{% for m in messages %}{{ bos_token }}{{ m.content }}{% endfor %}", USER * 8,
                       bos_token="b" * 4000, eos_token="", isolated=isolated)
    assert text == ("b" * 4000 + "hi") * 8


def test_a_real_template_keeps_far_more_room_than_it_needs(demo_model_path):
    plan = read_plan(demo_model_path)
    template = plan.metadata["tokenizer.chat_template"]
    conversation = [{"role": "system", "content": "s" * 3000}, {"role": "user", "content": "u " * 20_000},
                    {"role": "assistant", "content": "a" * 5000}, {"role": "user", "content": "q"}]
    text = render_chat(template, conversation, bos_token="<|im_start|>", eos_token="<|im_end|>", isolated=False)
    assert text.startswith("<|im_start|>system\n" + "s" * 3000) and text.endswith("<|im_start|>assistant\n")


@MODES
def test_a_conversation_longer_than_the_context_holds_is_refused_before_rendering(isolated):
    content = "x" * (256 * MAX_CHARS_PER_TOKEN + 1)
    start = time.perf_counter()
    with pytest.raises(UsageError, match="more than a context of 256 tokens can hold"):
        # a template that would run for its whole deadline: never started
        render_chat("{% for i in range(10**9) %}{% endfor %}", [{"role": "user", "content": content}],
                    bos_token="", eos_token="", context_tokens=256, isolated=isolated, timeout_s=5.0)
    assert time.perf_counter() - start < 1.0


@MODES
def test_a_formatted_prompt_past_the_context_is_a_usage_error(isolated):
    # Inside the template's allowance (the conversation x 3) but past 16 characters a token of context.
    content = "y" * 1000
    template = "{{ messages[0].content * 3 }}"
    with pytest.raises(UsageError, match="as the model's chat template formats it has 3,000 characters"):
        render_chat(template, [{"role": "user", "content": content}], bos_token="", eos_token="",
                    context_tokens=100, isolated=isolated)
    assert len(render_chat(template, [{"role": "user", "content": content}], bos_token="", eos_token="",
                           context_tokens=200, isolated=isolated)) == 3000


@MODES
def test_a_raise_exception_message_is_escaped(isolated):
    template = "{{ raise_exception('roles\\x1b[2J\\nmust alternate\\u202e [bold]now[/]') }}"
    with pytest.raises(UsageError) as caught:
        render_chat(template, USER, bos_token="", eos_token="", isolated=isolated)
    message = str(caught.value)
    assert message.isprintable(), message
    assert "roles\\x1b[2J must alternate\\u202e [bold]now[/]" in message


def test_chat_prompt_gives_the_ids_of_the_rendered_text(tmp_path):
    plan = read_plan(write_tiny_llama(tmp_path / "m.gguf"))
    tokenizer = Tokenizer.from_metadata(plan.metadata)
    messages = [{"role": "user", "content": "the cat sat"}]
    text, ids = chat_prompt(tokenizer, CHATML_TEMPLATE, messages, context_tokens=256, isolated=False)
    assert text == render_chat(CHATML_TEMPLATE, messages, bos_token=tokenizer.token_text(tokenizer.bos_id),
                               eos_token=tokenizer.token_text(tokenizer.eos_id), isolated=False)
    assert ids == tokenizer.encode(text) and len(ids) > 3


def test_a_template_that_drops_the_conversation_is_the_model_files_fault(tmp_path):
    plan = read_plan(write_tiny_llama(tmp_path / "m.gguf"))
    tokenizer = Tokenizer.from_metadata(plan.metadata)
    with pytest.raises(InvalidModelError, match="the model's chat template produced an empty prompt"):
        chat_prompt(tokenizer, "{% if false %}{{ messages }}{% endif %}  \n", USER, context_tokens=256,
                    isolated=False)


def test_generate_blames_the_model_file_for_a_runaway_template_and_tokenizes_nothing(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", context=4096, extra_metadata={"tokenizer.chat_template": SPACES})
    start = time.perf_counter()
    result = CliRunner().invoke(app, ["generate", "-m", str(path), "--device", "cpu", "--chat", "-n", "1", "-q", "hi"])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 3, result.output
    assert len(lines) == 1 and lines[0].startswith("error: the model's chat template was stopped"), lines
    assert time.perf_counter() - start < 15.0


def test_the_allowance_counts_bos_text_up_to_the_readers_cap():
    from hipcore.gguf.header import Limits
    from hipcore.tokenizer import chat_template

    assert chat_template.TOKEN_TEXT_CHARS == Limits().max_token_chars
