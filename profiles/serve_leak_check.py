"""`rocmforge serve-leak-check`: the leak check over HTTP, against a real `rocmforge serve` process.

The server runs as its own process (the command a user runs), on a free port of 127.0.0.1. After a
warm-up the baseline is read from its /metrics; then `clients` threads send a seeded mix of requests
(completions and chat, streamed or whole, and conversations of a few turns whose every prompt holds the one
before it and a system prompt every chat shares, so that the server's prefix cache is hit) and some of them
leave at random points: during the prompt (a read timeout), or after a random number of streamed chunks.
When the server is idle again it must hold no KV block (physical, pending), every other block free or
cached (the prefix cache's, evictable), and its ledger must equal the baseline byte for byte per tag; the
driver's free memory (GPU) must not have dropped beyond the ledger's growth over both halves of the
requests (profiles/serve_leak_driver.py: a drop in one half only is a warning); then it gets SIGTERM and
must exit 0, which it does only when its own shutdown check found the KV cache quiescent and the ledger
empty after close. The findings and the verdict are leak-check's kind (serve_leak_report.py): a layer that
could not be judged, such as host memory on a short run, makes the verdict "not judged" and the exit code 1.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import itertools

import httpx

from profiles.leak_bugs import TESTING_ENV
from profiles.leak_report import LEAK, WARNING, Finding
from profiles.leak_thresholds import Thresholds
from profiles.serve_leak_driver import DRIVER_METRIC, DriverSeries, judge_driver
from profiles.serve_leak_host import DEFAULT_GROWTH_PER_1000, HostSeries, judge_host
from profiles.serve_leak_report import KV_KEYS, ServeLeakReport, judge_host_layer, judge_pool_and_ledger, ledger_of

if TYPE_CHECKING:  # the engine's modules stay out of the client's process
    from profiles.leak_check import ProgressSink

HEALTH_TIMEOUT_S = 300.0  # loading the model
IDLE_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 60.0
WARM_UP_REQUESTS = 4
PLANS = ("whole", "stream", "leave-in-prompt", "leave-mid-stream", "conversation")
PROMPT_WORDS = "the quick brown fox jumps over a lazy dog while seven small robots count blue stars".split()
# Every conversation's first message, and half the other chats': long enough to fill a few KV blocks, so that the
# prefix cache keeps it once and every later chat shares it.
SYSTEM_PROMPT = ("You are a patient assistant on a small harbour town's help line. Answer in one short sentence, "
                 "name the street when you give a place, and say so plainly when you do not know.")


@dataclass
class ServeLeakSettings:
    model: str
    device: str = "cpu"
    requests: int | None = 60  # None: as many as fit in duration_s
    clients: int = 8
    max_tokens: int = 8
    seed: int = 0
    extra_args: tuple[str, ...] = ()  # passed to `rocmforge serve` (e.g. --ctx-size 512)
    planted_bug: str | None = None
    driver_granule: int = 2 << 20  # the driver's free memory moves in 2 MiB steps on an H100
    time_limit_s: float = 600.0  # the whole request phase, whatever happens
    duration_s: float | None = None  # a soak: clients start requests until this many seconds have passed
    sample_interval_s: float = 0.25  # the server's host memory is read this often while the clients run
    thresholds: Thresholds = field(default_factory=Thresholds)  # --fail-on (blocks, ledger, driver, host-growth)

    def to_dict(self) -> dict:
        return {"model": self.model, "device": self.device, "requests": self.requests, "clients": self.clients,
                "max_tokens": self.max_tokens, "seed": self.seed, "serve_args": list(self.extra_args),
                "time_limit_s": self.time_limit_s, "duration_s": self.duration_s,
                "sample_interval_s": self.sample_interval_s, "fail_on": self.thresholds.describe()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metrics(client: httpx.Client) -> dict[str, float]:
    out = {}
    for line in client.get("/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _body(rng: random.Random, settings: ServeLeakSettings, chat: bool, stream: bool) -> dict:
    words = " ".join(rng.choice(PROMPT_WORDS) for _ in range(rng.randint(2, 12)))
    body = {"max_tokens": rng.randint(1, settings.max_tokens), "stream": stream, "temperature": rng.choice([0, 0.8]),
            "seed": rng.randint(0, 1000)}
    if rng.random() < 0.2:
        body["stop"] = [rng.choice(PROMPT_WORDS)]
    if chat:
        system = [{"role": "system", "content": SYSTEM_PROMPT}] if rng.random() < 0.5 else []
        body["messages"] = system + [{"role": "user", "content": words}]
    else:
        body["prompt"] = words
    return body


def _conversation(client: httpx.Client, rng: random.Random, settings: ServeLeakSettings) -> str:
    """Two or three turns, each prompt the whole conversation so far: its start is in the prefix cache."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    status = ""
    for _ in range(rng.randint(2, 3)):
        messages.append({"role": "user", "content": " ".join(rng.choice(PROMPT_WORDS) for _ in range(rng.randint(2, 12)))})
        response = client.post("/v1/chat/completions", timeout=120, json={
            "messages": messages, "max_tokens": rng.randint(1, settings.max_tokens), "temperature": 0})
        status = str(response.status_code)
        if response.status_code != 200:
            break
        messages.append({"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]})
    return status


def _one_request(client: httpx.Client, rng: random.Random, settings: ServeLeakSettings) -> tuple[str, str]:
    plan = rng.choice(PLANS)
    if plan == "conversation":
        try:
            return plan, _conversation(client, rng, settings)
        except httpx.TimeoutException:
            return plan, "left"
    chat = rng.random() < 0.5
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = _body(rng, settings, chat, stream=plan in ("stream", "leave-mid-stream"))
    try:
        if plan == "whole":
            return plan, str(client.post(path, json=body, timeout=120).status_code)
        if plan == "leave-in-prompt":
            body["max_tokens"] = settings.max_tokens
            client.post(path, json=body, timeout=rng.uniform(0.001, 0.05))
            return plan, "finished before leaving"
        leave_after = rng.randint(1, 4) if plan == "leave-mid-stream" else None
        with client.stream("POST", path, json=body, timeout=120) as response:
            chunks = 0
            for line in response.iter_lines():
                if line.startswith("data:"):
                    chunks += 1
                    if leave_after is not None and chunks >= leave_after:
                        return plan, "left"  # closing the response closes the connection
            return plan, str(response.status_code)
    except httpx.TimeoutException:
        return plan, "left"


def run_serve_leak_check(settings: ServeLeakSettings, progress: ProgressSink | None = None,
                         command_line: str = "") -> ServeLeakReport:
    """`progress`: leak-check's progress sink (profiles/leak_check.py): each phase as a status, the warm-up's and the
    measured requests counted, the server's KV blocks in use as its /metrics report them."""
    say = progress.status if progress is not None else (lambda _text: None)
    t = settings.thresholds
    report = ServeLeakReport(command=command_line, settings=settings.to_dict(), thresholds=t,
                             planted_bug=settings.planted_bug)
    started = time.monotonic()
    port = _free_port()
    command = [sys.executable, "-m", "rocmforge_cli.app", "serve", "--model", settings.model, "--device", settings.device,
               "--host", "127.0.0.1", "--port", str(port), "--parallel", str(max(1, settings.clients // 2)),
               "--queue", str(settings.clients), "--shutdown-grace", "5", "-q", *settings.extra_args]
    env = dict(os.environ)
    if settings.planted_bug:
        command += ["--plant-bug", settings.planted_bug]
        env[TESTING_ENV] = "1"
    say(f"starting the server on 127.0.0.1:{port}")
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(server.stdout), daemon=True)
    reader.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            _wait_healthy(client, server)
            say("warm-up")
            if progress is not None:
                progress.start(WARM_UP_REQUESTS, "warm-up")
            for warm_seed in range(WARM_UP_REQUESTS):  # modules, graphs and the template worker, before the baseline
                _one_request(client, random.Random(-1 - warm_seed), settings)
                if progress is not None:
                    progress.advance(1)
            _wait_idle(client)
            baseline = _metrics(client)
            _show_blocks(progress, baseline)
            report.baseline = ledger_of(baseline) | _driver(baseline) | _kv(baseline)
            host, driver = HostSeries(), DriverSeries()
            host.add(0, baseline)
            amount = f"{settings.duration_s:.0f} s of requests" if settings.duration_s else f"{settings.requests} requests"
            if progress is not None:
                progress.start(settings.requests, "requests")
            say(f"{amount} from {settings.clients} clients")
            _drive(settings, client, report, time.monotonic(), host, driver, progress)
            say("waiting for the server to finish its requests")
            final = _wait_idle(client)
            host.add(report.requests, final)
            report.final = ledger_of(final) | _driver(final) | _kv(final)
            report.findings += judge_pool_and_ledger(baseline, final, t)
            if DRIVER_METRIC in baseline:
                growth = sum(final.get(key, 0.0) - before for key, before in ledger_of(baseline).items())
                found = judge_driver(driver, baseline[DRIVER_METRIC], final[DRIVER_METRIC], report.requests, growth,
                                     settings.driver_granule + (t.driver or 0),
                                     server_warmed_up="--no-warmup" not in settings.extra_args)
                report.findings += [Finding("driver", LEAK if t.driver is not None else WARNING, m) for m in found.leaks]
                report.findings += [Finding("driver", WARNING, m) for m in found.warnings]
                report.driver = found.to_dict()
            verdict = judge_host(host, t.host_growth_per_1000 if t.host_growth_per_1000 is not None else DEFAULT_GROWTH_PER_1000)
            report.host, report.host_line = verdict.to_dict(), verdict.line()
            host_finding = judge_host_layer(verdict, t)
            if host_finding is not None:
                report.findings.append(host_finding)
    except _ServerGone as exc:
        report.findings.append(Finding("server", LEAK, str(exc)))
    finally:
        if server.poll() is None:
            say("stopping the server (SIGTERM) and reading its shutdown check")
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
                report.findings.append(Finding("server", LEAK, f"the server did not exit within {EXIT_TIMEOUT_S:.0f} s of SIGTERM"))
        reader.join(timeout=5)
    report.server_exit = server.returncode
    report.server_tail = "".join(output[-20:])
    if server.returncode != 0:
        report.findings.append(Finding("server", LEAK, f"the server exited {server.returncode} after SIGTERM (its shutdown "
                                       "check): " + " | ".join(line.strip() for line in output[-3:])))
    report.seconds = time.monotonic() - started
    return report


def _show_blocks(progress: ProgressSink | None, metrics: dict[str, float]) -> None:
    """The server's KV blocks in use (held by a sequence) of its usable ones, on the progress line."""
    if progress is not None and "rocmforge_kv_physical_blocks" in metrics:
        progress.blocks(int(metrics["rocmforge_kv_physical_blocks"]),
                        int(metrics["rocmforge_kv_total_blocks"] - metrics["rocmforge_kv_reserved_blocks"]))


class _ServerGone(Exception):
    pass


def _driver(m: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in m.items() if k == DRIVER_METRIC}


def _kv(m: dict[str, float]) -> dict[str, float]:
    return {k: m[k] for k in KV_KEYS if k in m}


def _wait_healthy(client: httpx.Client, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise _ServerGone(f"the server exited {server.returncode} before it was healthy")
        try:
            if client.get("/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise _ServerGone(f"the server was not healthy within {HEALTH_TIMEOUT_S:.0f} s")


def _wait_idle(client: httpx.Client) -> dict[str, float]:
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        m = _metrics(client)
        if not m["rocmforge_requests_in_flight"] and not m["rocmforge_requests_waiting"] \
                and not m["rocmforge_requests_running"]:
            return m
        if time.monotonic() > deadline:
            raise _ServerGone(f"requests still in flight {IDLE_TIMEOUT_S:.0f} s after the last client finished")
        time.sleep(0.05)


def _drive(settings: ServeLeakSettings, client: httpx.Client, report: ServeLeakReport, started: float,
           host: HostSeries, driver: DriverSeries, progress: ProgressSink | None) -> None:
    lock = threading.Lock()
    next_index = iter(range(settings.requests)) if settings.requests is not None else itertools.count()
    deadline = started + settings.time_limit_s
    if settings.duration_s is not None:
        deadline = min(deadline, started + settings.duration_s)
    done = threading.Event()

    def sampler() -> None:  # the server's RSS and the driver's free bytes against requests done
        while not done.wait(settings.sample_interval_s):
            try:
                metrics, requests_done = _metrics(client), report.requests
                host.add(requests_done, metrics)
                driver.add(requests_done, metrics)
            except httpx.HTTPError:
                continue  # a missed sample; the slope needs the span, not every point
            with lock:
                _show_blocks(progress, metrics)

    def worker() -> None:
        while time.monotonic() < deadline:
            with lock:
                index = next(next_index, None)
            if index is None:
                return
            plan, status = _one_request(client, random.Random(settings.seed * 1_000_003 + index), settings)
            with lock:
                report.requests += 1
                report.plans[plan] += 1
                report.statuses[status] += 1
                if progress is not None:
                    progress.advance(1)

    threads = [threading.Thread(target=worker) for _ in range(settings.clients)]
    watcher = threading.Thread(target=sampler, daemon=True)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
