"""leak-check with prefix caching (on by default, as serve runs): cached blocks are accounted, not called leaks
(counted and checked while cached, then evicted, after which every block must be free; the invariants, hash entries
against each live sequence's tokens, checked after every step too), and the three planted prefix-cache bugs of
profiles/leak_bugs.py each make it exit 1 naming what broke."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from support.gguf_factory import write_tiny_llama
from rocmforge_cli.app import app

runner = CliRunner()
TESTING = {"ROCMFORGE_TESTING": "1", "COLUMNS": "200"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(write_tiny_llama(tmp_path_factory.mktemp("leak-prefix") / "tiny.gguf", tokenizer="gpt2"))


def leak_check(model: str, *args: str) -> tuple[int, dict, str]:
    # The default (deliberately small) pool: cached blocks are evicted while others hold theirs.
    result = runner.invoke(app, ["leak-check", "--model", model, "--device", "cpu", "--requests", "40", "--seed", "3",
                                 "--no-tracemalloc", "--json", "-q", *args], env=TESTING)
    return result.exit_code, json.loads(result.stdout), result.stdout + result.stderr


def kv_findings(report: dict) -> list[str]:
    return [f["message"] for f in report["findings"] if f["severity"] == "leak" and f["layer"] in ("kv blocks", "engine")]


def test_cached_blocks_are_accounted_not_leaked(tiny):
    code, report, output = leak_check(tiny)
    assert report["settings"]["prefix_caching"] is True and "--no-prefix-cache" not in report["command"]
    assert not kv_findings(report), output[-2000:]
    assert not [f for f in report["findings"] if f["severity"] == "leak"]
    cached = [p["blocks"]["cached"] for p in report["phases"] if p["blocks"] is not None]
    assert max(cached) > 0  # blocks were cached at phase ends, and every one came back once evicted
    assert all(p["blocks"]["not_free"] == 0 for p in report["phases"] if p["blocks"] is not None)
    assert 0 < report["requests"]["prefix_hit_tokens"] < report["requests"]["prefix_query_tokens"]


def test_no_prefix_cache_caches_nothing(tiny):
    code, report, _ = leak_check(tiny, "--no-prefix-cache")
    assert report["settings"]["prefix_caching"] is False and "--no-prefix-cache" in report["command"]
    assert all(p["blocks"]["cached"] == 0 for p in report["phases"] if p["blocks"] is not None)
    assert "prefix_hit_tokens" not in report["requests"] and not kv_findings(report)


@pytest.mark.parametrize("bug, expected", [
    # the block keeps a reference after its table let it go: counted while cached, not free once evicted
    ("cached-reference-kept", ("has reference count 1 but 0 tables hold it", "KV blocks not returned")),
    # the index still names a block the eviction freed: seen at a phase end, or when the block, handed out again,
    # is hashed as its new contents (whichever comes first)
    ("hash-entry-on-freed-block", ("prefix index points at block|as another prefix than its own entry",)),
    # a block still held stays evictable: seen between two steps while it is held (or once an eviction freed it)
    ("eviction-of-held-block", ("is on the cached list but referenced|was on the free list with reference count 1"
                                "|is on the free list but referenced",)),
])
def test_planted_prefix_cache_bugs_are_caught(tiny, bug, expected):
    code, report, output = leak_check(tiny, "--plant-bug", bug)
    assert code == 1 and report["verdict"] == "leak", output[-3000:]
    assert report["planted_bug"] == bug
    messages = kv_findings(report)
    for alternatives in expected:  # each must show, in one of its spellings
        assert any(text in m for m in messages for text in alternatives.split("|")), (alternatives, messages)


def test_the_table_says_how_much_the_prefix_cache_found(tiny):
    result = runner.invoke(app, ["leak-check", "--model", tiny, "--device", "cpu", "--requests", "12", "--phases", "2",
                                 "--no-tracemalloc", "-q"], env={"COLUMNS": "200"})
    assert "prompt tokens found in the prefix cache" in result.stdout, result.stdout[-2000:]
    assert "KV blocks cached (evicted)" in result.stdout
