"""scripts/bench/chat_turns_bench.py's side-by-side table (--compare): per turn TTFT p50 / p99, and per run the
throughput, the TTFT p50 from turn 3 on, and the share of prompt tokens the server reported cached ("not reported"
where a server's usage has no prompt_tokens_details), on runs written here."""

from __future__ import annotations

import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts" / "bench"
sys.path.insert(0, str(SCRIPTS))

import chat_turns_bench as bench  # noqa: E402


def fake_run(label: str, cached: list[int | None], ttfts: list[float]) -> dict:
    """Two conversations, one turn per TTFT; every prompt 100 tokens, the given cached tokens per request."""
    turns = [{"turn": i + 1, "seconds": 1.0, "ttft_p50": ttft, "ttft_p99": 2 * ttft,
              "requests": [{"prompt_tokens": 100, "completion_tokens": 4, "cached_tokens": c} for c in cached]}
             for i, ttft in enumerate(ttfts)]
    return {"label": label, "conversations": 2, "turns_count": len(ttfts), "turn_tokens": 96, "reply_tokens": 4,
            "turns": turns, "seconds": float(len(ttfts)), "prompt_tokens": 200 * len(ttfts),
            "tokens_per_second": 208.0, "generated_per_second": 8.0}


def test_the_table_gives_each_runs_late_ttft_and_cached_share():
    cached = fake_run("cached", [50, 25], [0.4, 0.2, 0.1, 0.3])
    other = fake_run("other", [None, 25], [0.5, 0.5, 0.5, 0.7])
    text = bench.table([cached, other])
    assert "| 1 | 400 / 800 ms | 500 / 1,000 ms |" in text
    assert "| cached | 4.00 | 208.0 | 8.0 | 200.0 ms | 300 of 800 (38%) |" in text  # turns 3 and 4: 0.1, 0.3
    assert "| other | 4.00 | 208.0 | 8.0 | 600.0 ms | not reported |" in text
