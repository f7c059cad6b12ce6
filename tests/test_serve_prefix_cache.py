"""serve's prefix cache through the OpenAI client (cpu backend, both server shapes): a prompt that repeats an
earlier one's start says so in usage.prompt_tokens_details.cached_tokens, /metrics counts the lookups and hits
(vLLM's names, with this project's prefix) and the cached blocks, and the output is the one computed whole."""

from __future__ import annotations

import openai
import pytest

from support.engine_testing import tiny_model
from support.serve_testing import MODEL_NAME, SHAPES, live_server, metrics, wait_idle

HISTORY = "the harbour town woke slowly while the fishing boats rocked against the old pier " * 3


@pytest.fixture(scope="module", params=SHAPES)
def http_process(request) -> bool:
    return request.param == "http process"


def ask(client, prompt: str):
    return client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=5, temperature=0)


def test_a_repeated_prefix_is_reported_cached_and_gives_the_same_text(tmp_path_factory, http_process):
    path = tiny_model(tmp_path_factory)
    with live_server(path, block_size=16, http_process=http_process) as live:  # prefix caching: LoadOptions'
        assert live.server.loaded.cache.prefix is None  # the library default is off; serve's CLI turns it on
    with live_server(path, block_size=16, http_process=http_process, prefix_caching=True) as live:
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        first = ask(client, HISTORY + "and then")
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        second = ask(client, HISTORY + "and then")
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert second.choices[0].text == first.choices[0].text
        # every full block but the one holding the last prompt token
        assert cached == (second.usage.prompt_tokens - 1) // 16 * 16 > 0
        wait_idle(live.url)
        m = metrics(live.url)
        assert m["rocmforge_prefix_cache_hits_total"] == cached
        assert m["rocmforge_prefix_cache_queries_total"] == first.usage.prompt_tokens + second.usage.prompt_tokens
        assert m["rocmforge_kv_cached_blocks"] > 0 and m["rocmforge_kv_physical_blocks"] == 0
        assert m["rocmforge_kv_free_blocks"] + m["rocmforge_kv_cached_blocks"] == \
            m["rocmforge_kv_total_blocks"] - m["rocmforge_kv_reserved_blocks"]
    assert live.server.report.clean  # the shutdown check evicts the cached blocks and finds every block free


def test_streamed_usage_carries_the_cached_tokens(tmp_path_factory, http_process):
    with live_server(tiny_model(tmp_path_factory), block_size=16, http_process=http_process, prefix_caching=True) as live:
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        messages = [{"role": "system", "content": HISTORY}, {"role": "user", "content": "hello"}]
        client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=3, temperature=0)
        chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=3, temperature=0,
                                                     stream=True, stream_options={"include_usage": True}))
        usage = chunks[-1].usage
        assert usage.prompt_tokens_details.cached_tokens == (usage.prompt_tokens - 1) // 16 * 16 > 0
