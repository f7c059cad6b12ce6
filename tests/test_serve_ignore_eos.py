"""Fixed output lengths over HTTP for load generators: the `ignore_eos` extra (vLLM's) in a request body, and
`rocmforge serve --ignore-eos` as the default of requests that do not say (llama-server's flag)."""

from __future__ import annotations

import httpx
import pytest

from support.engine_testing import prompt_of, tiny_model
from support.serve_testing import live_server

# Seeds with which the tiny model samples its end-of-sequence token within 40 tokens at temperature 1.5
# (tests/test_engine_endings.py::test_eos uses the same ones).
SEEDS = range(14, 26)
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def finishes(url: str, **extra) -> list[tuple[str, int]]:
    """(finish_reason, completion_tokens) of each seed's completion."""
    out = []
    for seed in SEEDS:
        body = {"prompt": prompt_of(5), "max_tokens": MAX_TOKENS, "temperature": 1.5, "seed": seed, **extra}
        reply = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        choice, usage = reply.json()["choices"][0], reply.json()["usage"]
        out.append((choice["finish_reason"], usage["completion_tokens"]))
    return out


def test_the_ignore_eos_extra_runs_each_request_to_max_tokens(model_path):
    with live_server(model_path, max_seqs=4) as live:
        plain = finishes(live.url)
        assert any(reason == "stop" for reason, _ in plain), "no seed reached EOS: the test proves nothing"
        assert finishes(live.url, ignore_eos=True) == [("length", MAX_TOKENS)] * len(SEEDS)


def test_serve_ignore_eos_is_the_default_a_request_can_turn_off(model_path):
    with live_server(model_path, max_seqs=4, ignore_eos=True) as live:
        assert finishes(live.url) == [("length", MAX_TOKENS)] * len(SEEDS)
        assert any(reason == "stop" for reason, _ in finishes(live.url, ignore_eos=False))


def test_ignore_eos_that_is_not_a_boolean_is_a_400_naming_it(model_path):
    with live_server(model_path, max_seqs=2) as live:
        reply = httpx.post(live.url + "/v1/completions", json={"prompt": "hi", "ignore_eos": "yes"}, timeout=30)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "ignore_eos"
