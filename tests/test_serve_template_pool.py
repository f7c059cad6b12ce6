"""The server's long-lived chat-template renderers: the same prompts and the same failures as render_chat's
process per render, and a worker that hangs or dies is replaced without the next render noticing."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from hipcore.errors import InvalidModelError, UsageError
from hipcore.tokenizer.chat_template import render_chat
from rocmforge_serve.template_pool import TemplatePool

CONVERSATIONS = [
    [{"role": "user", "content": "hello"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "quote \" backslash \\ newline \n é 🙂"},
     {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}],
]
TEMPLATES = {
    "chatml fallback": None,
    "with bos": "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] | trim }}{{ eos_token }}\n"
                "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}",
}


@pytest.fixture(scope="module")
def pool():
    pool = TemplatePool(size=2)
    yield pool
    pool.close()


@pytest.mark.parametrize("name", list(TEMPLATES))
@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=["one message", "four messages"])
def test_the_pool_renders_what_render_chat_renders(pool, name, conversation):
    template = TEMPLATES[name]
    want = render_chat(template, conversation, bos_token="<s>", eos_token="</s>", isolated=False)
    assert pool.render(template, conversation, bos_token="<s>", eos_token="</s>") == want


def test_the_demo_models_template_renders_the_same(pool, demo_model_path):
    from hipcore.gguf.file import GGUFFile
    from hipcore.tokenizer.chat_template import chat_template_from_metadata

    with GGUFFile.open(str(demo_model_path)) as gguf:
        template = chat_template_from_metadata(gguf.metadata)
    for conversation in CONVERSATIONS:
        want = render_chat(template, conversation, bos_token="<|im_start|>", eos_token="<|im_end|>")
        assert pool.render(template, conversation, bos_token="<|im_start|>", eos_token="<|im_end|>") == want


def test_failures_are_the_same_errors_and_the_worker_keeps_serving(pool):
    user = CONVERSATIONS[0]
    with pytest.raises(UsageError, match="rejected the conversation: roles must alternate"):
        pool.render("{{ raise_exception('roles must alternate') }}", user, bos_token="", eos_token="")
    with pytest.raises(InvalidModelError, match="exceed"):
        pool.render("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", user, bos_token="", eos_token="")
    assert pool.render(None, user, bos_token="", eos_token="") == render_chat(None, user, bos_token="", eos_token="",
                                                                              isolated=False)


def test_a_runaway_c_level_render_is_killed_and_replaced(pool):
    """A single C-level operation never returns to the sandbox's checks: the deadline kills the worker."""
    exponential = ("{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(60) %}"
                   "{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}{{ ns.a == ns.b }}")
    pool.render(None, CONVERSATIONS[0], bos_token="", eos_token="")  # a started worker: the deadline is the render's
    start = time.perf_counter()
    with pytest.raises(InvalidModelError, match="stopped"):
        pool.render(exponential, CONVERSATIONS[0], bos_token="", eos_token="", timeout_s=0.5)
    assert time.perf_counter() - start < 15.0
    assert pool.render(None, CONVERSATIONS[0], bos_token="", eos_token="").startswith("<|im_start|>user")


def test_concurrent_renders_each_get_their_own_prompt(pool):
    conversations = [[{"role": "user", "content": f"message number {i}"}] for i in range(12)]
    with concurrent.futures.ThreadPoolExecutor(6) as threads:
        texts = list(threads.map(lambda c: pool.render(None, c, bos_token="", eos_token=""), conversations))
    assert texts == [render_chat(None, c, bos_token="", eos_token="", isolated=False) for c in conversations]


def test_a_warm_worker_renders_far_faster_than_a_process_per_render(pool):
    user = CONVERSATIONS[0]
    pool.render(None, user, bos_token="", eos_token="")
    start = time.perf_counter()
    for _ in range(5):
        pool.render(None, user, bos_token="", eos_token="")
    warm = (time.perf_counter() - start) / 5
    start = time.perf_counter()
    render_chat(None, user, bos_token="", eos_token="")
    fresh = time.perf_counter() - start
    assert warm < fresh / 5, (warm, fresh)


def test_after_close_renders_fail_clearly_and_no_worker_is_left():
    pool = TemplatePool(size=2)
    pool.render(None, CONVERSATIONS[0], bos_token="", eos_token="")
    workers = list(pool._all)
    pool.close()
    assert workers and all(not w.alive for w in workers)
    with pytest.raises(Exception, match="shut down"):
        pool.render(None, CONVERSATIONS[0], bos_token="", eos_token="")
