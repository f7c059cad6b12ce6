"""leak-check on a cpu-backend mixture of experts whose warm-up routes to few of its experts: the decoded experts'
cache (hipcore/ops/moe_expert_cache.py) fills during the measured phases. It is its own host layer (emptied at the
baseline and before the final snapshot, subtracted from the samples between, judged against its budget), so it is
no host growth; without that, tracemalloc judged the run a leak (the planted revert). A cache that does not evict
past its budget, memory an eviction does not free, or host memory kept per request beside the cache is still a
leak."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import support.moe_models as moe_models
from hipcore.ops import moe_expert_cache
from hipcore.ops.moe_expert_cache import EXPERTS
from profiles.leak_bugs import TESTING_ENV
from rocmforge_cli.app import app

runner = CliRunner()
EXPERT_COUNT = 256  # the router's most: 2 used a token, the warm-up's tokens route to part of them


@pytest.fixture(scope="module")
def many_experts(tmp_path_factory) -> str:
    patch = pytest.MonkeyPatch()
    patch.setattr(moe_models, "N_EXPERTS", EXPERT_COUNT)
    try:
        return str(moe_models.write_moe_model("qwen3moe-f32", tmp_path_factory.mktemp("moe")))
    finally:
        patch.undo()


def leak_check(model: str, *extra: str) -> dict:
    result = runner.invoke(app, ["leak-check", "--model", model, "--device", "cpu", "--requests", "60", "--seed", "5",
                                 "--prompt-tokens", "2-10", "--max-tokens", "4", "--json", "-q", *extra],
                           env={"COLUMNS": "200", TESTING_ENV: "1"})
    report = json.loads(result.stdout)
    assert result.exit_code == report["exit_code"], result.stdout[-2000:] + result.stderr[-2000:]
    return report


def host_findings(report: dict) -> list[str]:
    return [f["message"] for f in report["findings"] if f["layer"] == "host" and f["severity"] == "leak"]


def test_experts_first_used_after_the_baseline_are_no_host_growth(many_experts):
    report = leak_check(many_experts)
    cache = report["host"]["expert_cache"]
    assert cache is not None and cache["entries"] > 0  # decoded after the baseline (emptied there)
    assert report["verdict"] == "clean", report["findings"]
    assert EXPERTS.entries == 0  # emptied before the final snapshot
    assert cache["rss_given_back"] >= cache["held_bytes"] > 0  # its mappings, unmapped
    rows = [r for r in report["layers"] if r["layer"] == "host (decoded experts' cache)"]
    assert rows and rows[0]["count"] == cache["entries"] and rows[0]["peak"] == cache["peak_bytes"]


def test_planted_revert_the_cache_counted_as_host_growth(many_experts, monkeypatch):
    monkeypatch.setattr(EXPERTS, "clear", lambda: None)
    monkeypatch.setattr(EXPERTS, "traced_bytes", lambda: 0)
    report = leak_check(many_experts)
    assert report["verdict"] == "leak"
    assert any("host memory kept since the baseline" in m for m in host_findings(report))


def test_planted_a_cache_that_does_not_evict_past_its_budget(many_experts, monkeypatch):
    monkeypatch.setattr(EXPERTS, "budget_bytes", 1 << 20)
    monkeypatch.setattr(moe_expert_cache.ExpertCache, "_evict_past_budget", lambda self: None)
    report = leak_check(many_experts)
    assert report["verdict"] == "leak"
    assert any("past its budget of 1,048,576" in m for m in host_findings(report))


def test_planted_entries_the_cache_drops_but_keeps(many_experts, monkeypatch):
    kept: list = []
    real_clear = moe_expert_cache.ExpertCache.clear

    def clear_keeping(self):
        kept.extend(self._entries.values())
        real_clear(self)

    monkeypatch.setattr(moe_expert_cache.ExpertCache, "clear", clear_keeping)
    report = leak_check(many_experts)
    assert kept and report["verdict"] == "leak"
    assert any("host memory kept since the baseline" in m for m in host_findings(report))
    # tracemalloc sees the entries' Python objects; their mappings (the bytes) only the RSS does
    assert any("their mappings are kept elsewhere" in m for m in host_findings(report)), host_findings(report)


def test_planted_matrices_the_cache_drops_but_keeps(many_experts, monkeypatch):
    """Only the decoded matrices kept (a few hundred bytes of Python objects each, their 48 KiB mappings alive):
    the RSS the cache's emptying gives back tells."""
    kept: list = []
    real_clear = moe_expert_cache.ExpertCache.clear

    def clear_keeping_matrices(self):
        kept.extend(matrix for _, matrix, _ in self._entries.values())
        real_clear(self)

    monkeypatch.setattr(moe_expert_cache.ExpertCache, "clear", clear_keeping_matrices)
    report = leak_check(many_experts)
    assert kept and report["verdict"] == "leak"
    assert any("their mappings are kept elsewhere" in m for m in host_findings(report)), host_findings(report)


def test_planted_host_memory_kept_per_request_is_caught_beside_the_cache(many_experts):
    """The cache's bytes taken out of the host layer take nothing else with them: profiles/leak_bugs.py's host-leak
    (10 KiB kept a request) on this mixture is a leak."""
    report = leak_check(many_experts, "--plant-bug", "host-leak")
    assert report["verdict"] == "leak" and report["host"]["expert_cache"]["entries"] > 0
    assert any("host memory kept since the baseline" in m and "profiles/leak_bugs.py" in m for m in host_findings(report))
