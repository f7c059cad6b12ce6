"""Where a first token's wait goes: the latency histograms (hipcore/engine/latency.py) of the engine and of the
server's /metrics, checked against waits made long on purpose (the test hooks' 50 ms prompt steps)."""

from __future__ import annotations

import httpx
import pytest

from support.engine_testing import greedy, load_tiny, prompt_of, tiny_model
from support.serve_testing import SHAPES, SLOW_TOKEN, fault_hooks, live_server, metrics, wait_idle

from hipcore.engine.latency import BOUNDS, LatencyHistogram, quantile
from rocmforge_serve.metrics import LATENCY_HISTOGRAMS


def test_a_histogram_puts_each_wait_in_its_bucket_and_reads_cumulative():
    h = LatencyHistogram()
    for seconds in (0.0005, 0.001, 0.0011, 0.05, 100.0, -1e-9):
        h.observe(seconds)
    r = h.reading()
    assert r["count"] == 6 and r["sum"] == pytest.approx(100.0526)
    le = dict(zip(BOUNDS, r["cumulative"]))
    assert le[0.001] == 3  # 0.0005, 0.001 (a bound is its own bucket's upper end) and the negative read as 0
    assert le[0.0025] == 4 and le[0.04] == 4 and le[0.06] == 5 and le[60.0] == 5
    assert r["cumulative"][-1] == 6  # +Inf: the 100 s wait


def test_quantiles_interpolate_inside_their_bucket():
    h = LatencyHistogram()
    for _ in range(10):
        h.observe(0.012)  # the (0.01, 0.015] bucket
    assert quantile(h.reading(), 0.5) == pytest.approx(0.0125)
    assert quantile(LatencyHistogram().reading(), 0.5) is None
    h.observe(1e6)
    assert quantile(h.reading(), 1.0) == BOUNDS[-1]


def test_the_engine_times_each_request_once_from_its_submission(tmp_path_factory):
    """Three requests, one of them slow in its prompt's step: one queue and one first-token observation each
    (a request that waits behind a full batch is timed in the queue), the slow one's first token >= 50 ms."""
    with load_tiny(tiny_model(tmp_path_factory), max_seqs=2, hooks=fault_hooks()) as model:
        engine = model.engine
        engine.submit([SLOW_TOKEN, *prompt_of(4)], greedy(3))
        engine.submit(prompt_of(5, salt=1), greedy(3))
        engine.submit(prompt_of(6, salt=2), greedy(3))  # waits: max_seqs=2
        engine.run_until_idle()
        queue, first = engine.stats.queue_time.reading(), engine.stats.first_token_time.reading()
        assert queue["count"] == 3 and first["count"] == 3
        assert first["sum"] >= 0.05 + queue["sum"]
        le = dict(zip(BOUNDS, first["cumulative"]))
        assert le[0.04] <= 2  # the slow request's first token came after 50 ms
        assert queue["cumulative"][-1] == 3 and dict(zip(BOUNDS, queue["cumulative"]))[0.01] < 3  # the third waited
        records = {r.request_id: r for r in engine.finished_records()}
        assert first["sum"] == pytest.approx(sum(r.time_to_first_token for r in records.values()))


@pytest.mark.parametrize("shape", SHAPES)
def test_metrics_split_a_slow_first_token_between_the_http_layer_and_the_engine(tmp_path_factory, shape):
    names = [f"rocmforge_{name}" for name, *_ in LATENCY_HISTOGRAMS]
    with live_server(tiny_model(tmp_path_factory), max_seqs=4, http_process=shape == "http process") as live:
        before = wait_idle(live.url)
        for name in names:
            assert before[f"{name}_count"] == 0
        reply = httpx.post(live.url + "/v1/completions", timeout=30,
                           json={"prompt": [SLOW_TOKEN, 5, 6], "max_tokens": 2, "ignore_eos": True})
        assert reply.status_code == 200, reply.text
        after = metrics(live.url)
        prepare, queue, engine_first, http_first = ({"count": after[f"{n}_count"], "sum": after[f"{n}_sum"],
                                                     "le_0.04": after[f'{n}_bucket{{le="0.04"}}']} for n in names)
        assert all(h["count"] == 1 for h in (prepare, queue, engine_first, http_first))
        assert engine_first["sum"] >= 0.05 and engine_first["le_0.04"] == 0
        assert http_first["sum"] >= engine_first["sum"] >= queue["sum"]
        assert http_first["sum"] >= prepare["sum"] + 0.05
