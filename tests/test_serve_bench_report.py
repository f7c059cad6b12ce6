"""scripts/bench/serve_bench_report.py: the summary of one server's run (rocmforge serve or llama-server) and
the comparison of two, from files in llm-benchmark-runner's output format written here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts" / "bench"
sys.path.insert(0, str(SCRIPTS))

import serve_bench_report as report  # noqa: E402


def _stats(median: float) -> dict:
    return {"mean": median, "median": median, "p95": median, "p99": median * 2, "min": median, "max": median,
            "stdDev": 0.0}


def write_level(outdir: Path, clients: int, requests: int, chunks: int, seconds: float, ttft_ms: float,
                server_tokens: tuple[int, int] | None, errors: int = 0) -> None:
    """A level whose requests start at t=0 and whose last chunk comes at t=`seconds`."""
    raw = []
    for i in range(requests):
        ok = i >= errors
        raw.append({"endpointId": "e", "requestStart": 0.0, "requestEnd": seconds,
                    "tokenTimestamps": [seconds * (k + 1) / chunks for k in range(chunks)] if ok else [],
                    "outputTokenCount": chunks if ok else 0, "status": "success" if ok else "error",
                    "error": None if ok else "HTTP 503: busy"})
    level = {"concurrency": clients, "requestThroughput": requests / seconds,
             "tokenThroughput": requests * chunks / seconds,
             "metrics": {"ttft": _stats(ttft_ms), "itl": _stats(1.0), "e2eLatency": _stats(seconds * 1000),
                         "tps": _stats(chunks / seconds)}}
    (outdir / f"level_{clients}.json").write_text(json.dumps({"results": [{"concurrencyResults": [level],
                                                                          "rawResults": raw}]}))
    if server_tokens is not None:
        (outdir / f"level_{clients}.server_tokens").write_text(f"{server_tokens[0]} {server_tokens[1]}\n")


def write_meta(outdir: Path, server: str | None, prompt_tokens: int = 128, model: str = "/tmp/models/m.gguf") -> None:
    meta = {"model": model, "prompt_tokens": prompt_tokens, "max_tokens": 16, "serve_args": f"{server} -m x"}
    if server is not None:
        meta["server"] = server
    (outdir / "meta.json").write_text(json.dumps(meta))


def test_compare_uses_each_servers_own_token_count_and_the_ratio_per_level(tmp_path):
    ours, theirs = tmp_path / "rocmforge", tmp_path / "llama"
    ours.mkdir(), theirs.mkdir()
    write_meta(ours, None)  # serve_bench.sh runs from before meta.json named the server
    write_meta(theirs, "llama-server", model="models/m.gguf")
    # 1 client: 4 requests x 15 chunks in 2 s, the server counted 64 tokens (an empty-text token each).
    write_level(ours, 1, 4, 15, 2.0, 10.0, (100, 164))
    write_level(theirs, 1, 4, 16, 4.0, 30.0, (0, 64))
    # 8 clients: only llama-server's count is missing; one of our requests failed.
    write_level(ours, 8, 16, 16, 1.0, 20.0, (164, 404), errors=1)
    write_level(theirs, 8, 16, 16, 2.0, 40.0, None)
    write_level(theirs, 32, 32, 16, 2.0, 50.0, (64, 576))
    text = report.compare(ours, theirs)
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()}
    assert "# rocmforge serve vs llama-server" in text
    assert "same load: prompt 128 tokens" in text  # the same model file by name, though the paths differ
    # requests ok, TTFT p50, TTFT p99, ITL p50, ITL p99, E2E p50, aggregate t/s (ours / theirs), ratio
    assert rows["1"] == ["4/4 / 4/4", "10.0 / 30.0", "20.0 / 60.0", "1.0 / 1.0", "2.0 / 2.0", "2000.0 / 4000.0",
                         "32.0 / 16.0", "2.00"]
    # llama-server's 8-client level falls back to the chunk count: 16 x 16 / 2 s = 128 t/s; ours 240 / 1 s.
    assert rows["8"][0] == "15/16 / 16/16"
    assert rows["8"][6:] == ["240.0 / 128.0", "1.88"]
    assert rows["32"] == ["- / 32/32", "- / 50.0", "- / 100.0", "- / 1.0", "- / 2.0", "- / 2000.0", "- / 256.0", "-"]
    assert 'errors at 8 clients (rocmforge serve): "HTTP 503: busy"' in text


def test_compare_says_when_the_loads_differ(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    write_meta(a, "rocmforge serve", prompt_tokens=128)
    write_meta(b, "llama-server", prompt_tokens=127)
    write_level(a, 1, 2, 16, 1.0, 5.0, (0, 32))
    write_level(b, 1, 2, 16, 1.0, 5.0, (0, 32))
    text = report.compare(a, b)
    assert "NOT the same load" in text and "same load: prompt" not in text


def test_summary_of_llama_server_names_it_and_has_no_rocmforge_bench(tmp_path):
    write_meta(tmp_path, "llama-server")
    write_level(tmp_path, 2, 4, 16, 1.0, 5.0, (10, 74))
    (tmp_path / "server_exit.txt").write_text("0\n")
    text = report.summary(tmp_path)
    assert text.startswith("# llama-server under llm-benchmark-runner")
    assert "rocmforge bench" not in text
    assert "| 2 | 4/4 | 16.0 (16.0) |" in text and "| 64.0 (64.0) |" in text
    assert "server exit code after SIGTERM: 0" in text


def test_summary_of_rocmforge_serve_still_reports_its_bench_and_ratio(tmp_path):
    write_meta(tmp_path, None)
    write_level(tmp_path, 32, 32, 16, 1.0, 5.0, (0, 512))
    (tmp_path / "bench_b32.json").write_text(json.dumps({"results": [{"test": "b32x16", "mean": 1024.0, "sd": 3.0}]}))
    text = report.summary(tmp_path)
    assert text.startswith("# rocmforge serve under llm-benchmark-runner")
    assert "rocmforge bench b32x16: 1024.0 ± 3.0 t/s" in text
    assert "HTTP aggregate at 32 clients / bench b32x16: 0.50 (target >= 0.80: NOT met" in text


def _part(path: Path, clients: int, requests: list[tuple[float, list[float]]]) -> Path:
    """A load-generator output of one process: each request as (start, chunk times)."""
    raw = [{"endpointId": "e", "requestStart": start, "requestEnd": stamps[-1] + 0.001 if stamps else start,
            "tokenTimestamps": stamps, "outputTokenCount": len(stamps),
            "status": "success" if stamps else "error", "error": None if stamps else "HTTP 503: busy"}
           for start, stamps in requests]
    level = {"concurrency": clients, "requestThroughput": 0.0, "tokenThroughput": 0.0, "metrics": {}}
    path.write_text(json.dumps({"results": [{"concurrencyResults": [level], "rawResults": raw}]}))
    return path


def test_merge_pools_the_processes_requests_on_one_time_line(tmp_path):
    a = _part(tmp_path / "a.json", 2, [(10.0, [10.1, 10.2, 10.3]), (10.0, [10.2, 10.4])])
    b = _part(tmp_path / "b.json", 2, [(10.5, [10.9, 11.0, 11.5]), (10.5, [])])
    merged = report.merge([a, b])
    level = merged["results"][0]["concurrencyResults"][0]
    raw = merged["results"][0]["rawResults"]
    assert level["concurrency"] == 4 and level["processes"] == 2 and len(raw) == 4
    m = level["metrics"]
    # TTFTs 100, 200, 400 ms (the failed request has none): median 200, p99 interpolated toward 400
    assert abs(m["ttft"]["median"] - 200.0) < 1e-6
    assert abs(m["ttft"]["p99"] - (200.0 + 0.98 * 200.0)) < 1e-6
    assert m["totalRequests"] == 4 and abs(m["successRate"] - 75.0) < 1e-9
    # ITLs pooled over every request: 100, 100 | 200 | 100, 500 ms
    assert abs(m["itl"]["max"] - 500.0) < 1e-6 and abs(m["itl"]["min"] - 100.0) < 1e-6
    assert abs(m["itl"]["median"] - 100.0) < 1e-6
    # wall: the first start (10.0) to the last chunk of any process (11.5); 8 chunks in all
    assert abs(level["tokenThroughput"] - 8 / 1.5) < 1e-9
    # and the summary reads the merged file like a single process's
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "level_4.json").write_text(json.dumps(merged))
    rows = report.level_rows(tmp_path / "out")
    assert rows[0]["clients"] == 4 and rows[0]["ok"] == 3 and rows[0]["requests"] == 4


def test_merge_of_one_part_computes_what_the_load_generator_computes(tmp_path):
    """The statistics of llm-benchmark-runner 0.2.0 (linear percentiles, population stdDev), by hand."""
    part = _part(tmp_path / "a.json", 3, [(0.0, [0.05, 0.06]), (0.0, [0.15, 0.17]), (0.0, [0.30, 0.31])])
    m = report.merge([part])["results"][0]["concurrencyResults"][0]["metrics"]
    ttfts = [50.0, 150.0, 300.0]
    mean = sum(ttfts) / 3
    assert abs(m["ttft"]["mean"] - mean) < 1e-6 and abs(m["ttft"]["median"] - 150.0) < 1e-6
    assert abs(m["ttft"]["p95"] - (150.0 + 0.9 * 150.0)) < 1e-6
    assert abs(m["ttft"]["stdDev"] - (sum((t - mean) ** 2 for t in ttfts) / 3) ** 0.5) < 1e-6


def test_thread_cpu_tells_a_named_thread_from_the_rest(tmp_path):
    """The engine thread names itself for the OS (rocmforge_serve.engine_loop.name_os_thread); the report's
    /proc reader must file its CPU under that name, not under the process's."""
    import os
    import threading
    import time

    from rocmforge_serve.engine_loop import ENGINE_THREAD_NAME, name_os_thread

    done = threading.Event()

    def burn():
        name_os_thread(ENGINE_THREAD_NAME)
        deadline = time.monotonic() + 20
        while time.thread_time() < 0.25 and time.monotonic() < deadline:  # 0.25 s of this thread's own CPU
            pass
        done.set()
        time.sleep(0.5)  # alive while the reader looks

    worker = threading.Thread(target=burn)
    worker.start()
    done.wait(30)
    cpu = report.thread_cpu(os.getpid())
    worker.join()
    assert cpu.get(ENGINE_THREAD_NAME, 0.0) >= 0.1, cpu
    names = set(cpu) - {ENGINE_THREAD_NAME}
    assert names, "the process's own threads are listed too"


def test_cpu_lines_per_generated_token(tmp_path):
    write_level(tmp_path, 4, 8, 10, 1.0, 50.0, (100, 180))  # 80 tokens by the server's count
    (tmp_path / "level_4.cpu_before").write_text(json.dumps({"python3": 1.0, "rf-engine": 2.0}))
    (tmp_path / "level_4.cpu_after").write_text(json.dumps({"python3": 1.008, "rf-engine": 2.004}))
    lines = report.cpu_lines(tmp_path, report.level_rows(tmp_path))
    assert lines == ["- server CPU at 4 clients, us per generated token by thread: 150.0 in all "
                     "(python3 100.0, rf-engine 50.0)"]


def _metrics(steps, prompt_steps, in_steps, waiting) -> str:
    return (f"# HELP rocmforge_engine_steps_total engine steps run\nrocmforge_engine_steps_total {steps}\n"
            f"rocmforge_engine_prompt_steps_total {prompt_steps}\nrocmforge_engine_step_seconds_total {in_steps}\n"
            f"rocmforge_engine_device_wait_seconds_total {waiting}\nrocmforge_generated_tokens_total 5.0\n")


def test_engine_lines_give_the_steps_and_the_shares_of_the_levels_wall_time(tmp_path):
    write_level(tmp_path, 32, 64, 10, 2.0, 50.0, (0, 640))
    (tmp_path / "level_32.metrics_before").write_text(_metrics(100, 10, 5.0, 1.0))
    (tmp_path / "level_32.metrics_after").write_text(_metrics(1100, 14, 6.8, 1.5))
    lines = report.engine_lines(tmp_path, report.level_rows(tmp_path))
    assert lines == ["- engine at 32 clients: 1000 steps (4 evaluated prompts), in steps 90% of the level's wall "
                     "time, waiting for the device 25%"]
    # a server without the counters (llama-server's /metrics) gives no line, not a wrong one
    (tmp_path / "level_32.metrics_after").write_text("llamacpp:tokens_predicted_total 640\n")
    assert report.engine_lines(tmp_path, report.level_rows(tmp_path)) == []


def _latency_metrics(waits: dict[str, list[float]]) -> str:
    """/metrics text with report.LATENCY_STAGES' histograms as the server writes them, holding `waits`."""
    from prometheus_client import CollectorRegistry, generate_latest

    from hipcore.engine.latency import LatencyHistogram
    from rocmforge_serve.metrics import histogram_family

    class Families:
        def collect(self):
            for _, name in report.LATENCY_STAGES:
                h = LatencyHistogram()
                for seconds in waits.get(name, []):
                    h.observe(seconds)
                yield histogram_family(name.removeprefix("rocmforge_"), "a stage", h.reading())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families())
    return generate_latest(registry).decode()


def test_latency_lines_give_each_first_token_stage_of_the_level(tmp_path):
    write_level(tmp_path, 8, 16, 10, 1.0, 50.0, (0, 160))
    names = [name for _, name in report.LATENCY_STAGES]
    earlier = {name: [5.0] for name in names}  # before the level: must not count
    (tmp_path / "level_8.metrics_before").write_text(_latency_metrics(earlier))
    level = {names[0]: [0.002] * 4, names[1]: [0.012] * 4, names[2]: [0.012, 0.012, 0.012, 0.052],
             names[3]: [0.02, 0.02, 0.02, 0.06]}
    (tmp_path / "level_8.metrics_after").write_text(_latency_metrics({n: earlier[n] + level[n] for n in names}))
    lines = report.latency_lines(tmp_path, report.level_rows(tmp_path))
    assert lines == ["- first token at 8 clients, server side (mean / p50 / p99 ms): prepare 2.0 / 1.8 / 2.5; "
                     "queue 12.0 / 12.5 / 14.9; engine first token 22.0 / 13.3 / 59.2; handler first token "
                     "30.0 / 18.3 / 59.2"]
    # without the histograms (an older rocmforge, or llama-server), no line
    (tmp_path / "level_8.metrics_after").write_text(_metrics(1100, 14, 6.8, 1.5))
    assert report.latency_lines(tmp_path, report.level_rows(tmp_path)) == []
