"""chat_template_kwargs (llama-server's and vLLM's request field): its keys reach the model's chat template (Qwen3's real
template and enable_thinking, on a tiny random qwen3 model, through the official OpenAI client), never replace what the
request itself gives the template, and a bad one is a 400 naming the field, after which the server serves on."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from support.family_models import FAMILY_MODELS
from support.gguf_factory import write_tiny_llama
from support.serve_testing import MODEL_NAME, live_server

from hipcore.errors import UsageError
from hipcore.tokenizer.chat_template import render_chat
from rocmforge_serve.template_pool import TemplatePool

QWEN3 = (Path(__file__).parent / "support" / "templates" / "qwen3.jinja").read_text(encoding="utf-8")
ASK = [{"role": "user", "content": "Is 7 prime?"}]
NO_THINKING = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
ECHO = "{% for m in messages %}{{ m['content'] }}{% endfor %}|{{ style | default('plain') }}|{{ add_generation_prompt }}"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    path = tmp_path_factory.mktemp("kwargs") / "qwen3.gguf"
    write_tiny_llama(path, **{**FAMILY_MODELS["qwen3-f32"], "context": 512},
                     extra_metadata={"tokenizer.chat_template": QWEN3})
    with live_server(path, max_seqs=2, max_step_tokens=256) as server:
        yield server


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _render(**kwargs) -> str:
    return render_chat(QWEN3, ASK, bos_token="", eos_token="<|im_end|>", **kwargs)


def test_the_kwargs_change_the_rendered_prompt_in_both_renderers():
    plain, off = _render(), _render(template_kwargs={"enable_thinking": False})
    assert plain.endswith("<|im_start|>assistant\n") and off == plain.removesuffix("<|im_start|>assistant\n") + NO_THINKING
    assert _render(template_kwargs={"enable_thinking": True}) == plain  # the template's default is thinking on
    pool = TemplatePool(size=1)
    try:
        assert pool.render(QWEN3, ASK, bos_token="", eos_token="<|im_end|>",
                           template_kwargs={"enable_thinking": False}) == off
        assert pool.render(ECHO, ASK, bos_token="", eos_token="", template_kwargs={"style": "terse"}) == \
            "Is 7 prime?|terse|True"
    finally:
        pool.close()


def test_a_kwarg_never_replaces_the_renders_own_variables():
    for name in ("messages", "tools", "add_generation_prompt", "bos_token", "raise_exception"):
        with pytest.raises(UsageError, match=name):
            render_chat(ECHO, ASK, bos_token="", eos_token="", template_kwargs={name: False})


def test_enable_thinking_false_reaches_qwen3s_template(client, live):
    """The prompt the server tokenized is the one the template renders with the kwargs: its token count is the
    rendered text's, and differs from the prompt without them."""
    def prompt_tokens(**extra) -> int:
        return client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=1, temperature=0,
                                              **extra).usage.prompt_tokens

    def tokens_of(text: str) -> int:
        return len(httpx.post(live.url + "/tokenize", json={"content": text}, timeout=30).json()["tokens"])

    without = prompt_tokens()
    off = prompt_tokens(extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert without == tokens_of(_render())
    assert off == tokens_of(_render(template_kwargs={"enable_thinking": False})) and off > without
    stream = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=1, temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert [c.usage.prompt_tokens for c in stream if c.usage] == [off]


@pytest.mark.parametrize("kwargs, says", [
    ("enable_thinking", "must be an object"),
    ([{"enable_thinking": False}], "must be an object"),
    ({"messages": []}, "messages is set by the render"),
    ({"add_generation_prompt": False}, "add_generation_prompt is set by the render"),
    ({"tools": [], "enable_thinking": False}, "tools is set by the render"),
])
def test_a_bad_chat_template_kwargs_is_a_400_and_the_server_serves_on(client, kwargs, says):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=1,
                                       extra_body={"chat_template_kwargs": kwargs})
    assert caught.value.body["param"] == "chat_template_kwargs" and says in caught.value.body["message"]
    reply = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=2, temperature=0,
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_chat_template_kwargs_on_completions_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=1,
                                  extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert caught.value.body["param"] == "chat_template_kwargs"
    assert client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=1).choices[0].text is not None
