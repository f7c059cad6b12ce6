"""--trace FILE.json: the Chrome trace event format (the fields Perfetto needs on every event), and allocations that
balance: on a clean leak-check every byte allocated is freed by the end; a planted device leak's bytes are not."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from support.gguf_factory import write_tiny_llama
from hipcore.runtime.ledger import Ledger
from profiles.trace_events import TraceRecorder
from rocmforge_cli.app import app

runner = CliRunner()
PHASES = {"M", "i", "C", "X", "b", "e"}


def validate(trace: dict) -> dict[str, int]:
    """Check the format; the bytes still live by tag at the end (allocations minus frees)."""
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    live: Counter = Counter()
    open_requests: set[int] = set()
    last_ts = 0.0
    for e in events:
        assert {"name", "ph", "pid", "tid", "ts"} <= set(e), e
        assert e["ph"] in PHASES and isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "M":
            continue
        if e["ph"] == "X":
            assert e["dur"] >= 0
        if e["ph"] == "i" and e["cat"] == "ledger":
            assert e["args"]["tag"] in e["name"] and e["args"]["bytes"] > 0
            live[e["args"]["tag"]] += e["args"]["bytes"] if e["name"].startswith("alloc") else -e["args"]["bytes"]
            assert e["ts"] >= last_ts  # the ledger's events in the order they happened
            last_ts = e["ts"]
        if e["ph"] == "C":
            assert e["args"] == {t: live.get(t, 0) for t in e["args"]}  # the counter agrees with the events
        if e["ph"] == "b":
            assert e["id"] not in open_requests
            open_requests.add(e["id"])
        if e["ph"] == "e":
            open_requests.remove(e["id"])
    assert not open_requests
    return {t: n for t, n in live.items() if n}


def test_events_from_a_ledger_balance_and_a_full_recorder_counts_what_it_dropped():
    ledger = Ledger()
    trace = TraceRecorder(max_events=8)
    ledger.observer = trace.ledger_event
    ledger.record(0x1000, 4096, "kv", "pool")
    ledger.record(0x2000, 512, "scratch", "step inputs")
    trace.request_started(7, "chat")
    trace.step(trace.started, trace.started + 0.001, 1, 0)
    trace.request_ended(7, "length")
    ledger.release(0x2000)
    assert validate(trace.to_json()) == {"kv": 4096}
    ledger.release(0x1000)
    ledger.record(0x3000, 64, "other")
    ledger.record(0x4000, 64, "other")
    data = trace.to_json()
    assert data["metadata"]["dropped_events"] == 1 and data["metadata"]["events"] == 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(write_tiny_llama(tmp_path_factory.mktemp("trace") / "tiny.gguf", tokenizer="gpt2"))


@pytest.mark.parametrize("bug, left", [(None, set()), ("device-leak", {"scratch"})])
def test_a_leak_check_trace_balances_unless_device_memory_leaked(tiny, tmp_path, bug, left):
    path = tmp_path / "trace.json"
    args = ["leak-check", "--model", tiny, "--device", "cpu", "--requests", "24", "--no-tracemalloc", "-q",
            "--trace", str(path)] + (["--plant-bug", bug] if bug else [])
    result = runner.invoke(app, args, env={"ROCMFORGE_TESTING": "1", "COLUMNS": "200"})
    assert result.exit_code == 1 if bug else result.exit_code in (0, 1), result.output[-2000:]
    trace = json.loads(path.read_text())
    assert set(validate(trace)) == left
    names = Counter(e["name"] for e in trace["traceEvents"])
    assert names["engine step"] > 10 and names["request"] >= 2 * 24 and names["alloc weights"] > 0
