"""`rocmforge serve` through the official OpenAI client, against a live server on loopback (cpu backend)."""

from __future__ import annotations

import concurrent.futures

import openai
import pytest

from support.engine_testing import tiny_model
from support.serve_testing import MODEL_NAME, SHAPES, live_server, metrics, wait_idle


@pytest.fixture(scope="module", params=SHAPES)
def http_process(request) -> bool:
    """Each live server of this module runs in both of Server's shapes."""
    return request.param == "http process"


@pytest.fixture(scope="module")
def live(tmp_path_factory, http_process):
    with live_server(tiny_model(tmp_path_factory), max_seqs=8, http_process=http_process) as server:
        yield server


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]


def test_chat_completion_counts_usage_and_stops_at_max_tokens(client):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hello there"}],
                                           max_tokens=6, temperature=0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 6
    assert reply.usage.prompt_tokens > 2 and reply.usage.total_tokens == reply.usage.prompt_tokens + 6


def test_streamed_completion_equals_the_whole_one(client):
    whole = client.completions.create(model=MODEL_NAME, prompt="a b c d", max_tokens=8, temperature=0)
    chunks = list(client.completions.create(model=MODEL_NAME, prompt="a b c d", max_tokens=8, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text and text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 8


def test_streamed_chat_deltas_rebuild_the_message(client):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    whole = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=7, temperature=0)
    stream = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=7, temperature=0, stream=True)
    deltas = [c.choices[0].delta for c in stream]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == whole.choices[0].message.content


def test_stop_string_cuts_the_text_and_says_stop(client):
    full = client.completions.create(model=MODEL_NAME, prompt="x y z", max_tokens=12, temperature=0).choices[0].text
    assert len(full) > 4, full
    stop = full[len(full) // 2:len(full) // 2 + 2]
    cut = client.completions.create(model=MODEL_NAME, prompt="x y z", max_tokens=12, temperature=0, stop=[stop]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full[:full.index(stop)]


def test_seed_makes_sampling_reproducible(client):
    def sample(seed):
        return client.completions.create(model=MODEL_NAME, prompt="q r s", max_tokens=10, temperature=1.5,
                                         seed=seed).choices[0].text

    texts = {seed: [sample(seed), sample(seed)] for seed in (1, 2, 3)}
    assert all(a == b for a, b in texts.values())
    assert len({a for a, _ in texts.values()}) > 1  # and the seed matters: three seeds, not one text


def test_concurrent_requests_share_decode_steps(client, live):
    wait_idle(live.url)
    before = metrics(live.url)

    def one(i):
        return client.completions.create(model=MODEL_NAME, prompt=f"w {i}", max_tokens=16, temperature=0)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(one, range(6)))
    assert all(r.usage.completion_tokens == 16 for r in replies)
    after = wait_idle(live.url)
    steps = after["rocmforge_engine_steps_total"] - before["rocmforge_engine_steps_total"]
    # alone, 6 requests x 16 tokens take >= 96 steps; batched they share steps
    assert steps < 6 * 16 * 0.6, steps
