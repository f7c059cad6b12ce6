"""n > 1 choices, /tokenize and /detokenize (llama-server's shapes), GET /v1/models/{id} and the access log, through
the official OpenAI client and httpx against a live server (cpu backend, the tiny random model)."""

from __future__ import annotations

import logging
import math

import httpx
import openai
import pytest

from support.engine_testing import tiny_model
from support.serve_testing import MODEL_NAME, live_server


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with live_server(tiny_model(tmp_path_factory), max_seqs=8, access_log=True) as server:
        yield server


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_n_choices_are_distinct_samples_of_one_prompt(client):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], n=4,
                                           max_tokens=6, temperature=1.0, seed=11, extra_body={"ignore_eos": True})
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    texts = [c.message.content for c in reply.choices]
    assert len(set(texts)) > 1, texts  # each sample has its own seed
    assert all(c.finish_reason == "length" for c in reply.choices)
    assert reply.usage.completion_tokens == 4 * 6
    greedy = client.completions.create(model=MODEL_NAME, prompt="a b c", n=3, max_tokens=5, temperature=0)
    assert len({c.text for c in greedy.choices}) == 1 and len(greedy.choices) == 3  # greedy: the same answer thrice


def test_streamed_n_choices_rebuild_the_whole_ones(client):
    kwargs = dict(model=MODEL_NAME, prompt="x y", n=3, max_tokens=5, temperature=1.0, seed=5, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kwargs)
    texts, reasons = ["", "", ""], [None, None, None]
    for chunk in client.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    assert texts == [c.text for c in whole.choices] and reasons == ["length"] * 3


def test_n_out_of_range_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL_NAME, prompt="x", n=17, max_tokens=2)
    assert caught.value.body["param"] == "n"


def test_tokenize_and_detokenize_round_trip(live):
    tokens = httpx.post(live.url + "/tokenize", json={"content": "hello world"}, timeout=30).json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    pieces = httpx.post(live.url + "/tokenize", json={"content": "hello world", "with_pieces": True},
                        timeout=30).json()["tokens"]
    assert [p["id"] for p in pieces] == tokens and "".join(p["piece"] for p in pieces) == "hello world"
    assert httpx.post(live.url + "/detokenize", json={"tokens": tokens}, timeout=30).json() == {"content": "hello world"}
    bad = httpx.post(live.url + "/detokenize", json={"tokens": [1, 10**9]}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_model_by_id(client):
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_one_access_line_per_request_with_its_tokens(client, caplog):
    with caplog.at_level(logging.INFO, logger="rocmforge.serve.access"):
        client.completions.create(model=MODEL_NAME, prompt="a b", max_tokens=3, temperature=0)
        list(client.completions.create(model=MODEL_NAME, prompt="a b", max_tokens=2, temperature=0, stream=True))
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("gone\n")
    lines = [r.getMessage() for r in caplog.records if r.name == "rocmforge.serve.access"]
    assert len(lines) == 3, lines
    assert " POST /v1/completions 200 prompt_tokens=" in lines[0] and "completion_tokens=3 " in lines[0]
    assert "completion_tokens=2 " in lines[1] and lines[1].endswith("ms")
    assert " GET /v1/models/gone\\n 404 " in lines[2] and "\n" not in lines[2]


def test_no_access_lines_when_off(tmp_path_factory, caplog):
    with live_server(tiny_model(tmp_path_factory), max_seqs=2) as server:  # access_log off, as serve -q
        with caplog.at_level(logging.INFO, logger="rocmforge.serve.access"):
            httpx.post(server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 1}, timeout=30)
    assert not [r for r in caplog.records if r.name == "rocmforge.serve.access"]


def test_chat_logprobs_are_the_samplers_distribution(client):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=5, temperature=0, logprobs=True, top_logprobs=20,
                                           extra_body={"ignore_eos": True})
    entries = reply.choices[0].logprobs.content
    assert len(entries) == 5
    assert bytes(b for e in entries for b in e.bytes).decode("utf-8", "replace") == reply.choices[0].message.content
    for entry in entries:
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 20 and tops == sorted(tops, reverse=True) and all(v <= 0 for v in tops)
        assert entry.top_logprobs[0].token == entry.token and entry.logprob == tops[0]  # greedy: the most likely
        assert sum(math.exp(v) for v in tops) <= 1 + 1e-9


def test_logprobs_under_a_grammar_are_over_the_allowed_tokens(live):
    """The mask is part of the sampler's distribution: the allowed tokens' probabilities sum to 1."""
    reply = httpx.post(live.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "?"}], "max_tokens": 4, "temperature": 1.0, "seed": 2,
        "logprobs": True, "top_logprobs": 20, "grammar": 'root ::= "yes" | "no"'}, timeout=60).json()
    first = reply["choices"][0]["logprobs"]["content"][0]
    assert all(t["token"] and ("yes".startswith(t["token"]) or "no".startswith(t["token"])) for t in first["top_logprobs"])
    assert abs(sum(math.exp(t["logprob"]) for t in first["top_logprobs"]) - 1.0) < 1e-6


def test_completion_logprobs_and_streamed_ones(client):
    kwargs = dict(model=MODEL_NAME, prompt="a b", max_tokens=4, temperature=0, logprobs=3,
                  extra_body={"ignore_eos": True})
    whole = client.completions.create(**kwargs).choices[0]
    assert len(whole.logprobs.tokens) == len(whole.logprobs.token_logprobs) == 4
    assert all(len(top) <= 3 and max(top.values()) == lp
               for top, lp in zip(whole.logprobs.top_logprobs, whole.logprobs.token_logprobs))
    assert whole.logprobs.text_offset[0] == 0 and whole.logprobs.text_offset == sorted(whole.logprobs.text_offset)
    streamed = [c.choices[0].logprobs for c in client.completions.create(stream=True, **kwargs)
                if c.choices and c.choices[0].logprobs]
    assert [lp for part in streamed for lp in part.token_logprobs] == whole.logprobs.token_logprobs


@pytest.mark.parametrize("body, param", [({"messages": [{"role": "user", "content": "x"}], "logprobs": True,
                                           "top_logprobs": 21}, "top_logprobs"),
                                         ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
                                          "top_logprobs")])
def test_bad_logprobs_are_400s(live, body, param):
    reply = httpx.post(live.url + "/v1/chat/completions", json={**body, "max_tokens": 2}, timeout=30)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param
