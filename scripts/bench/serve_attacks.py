"""Attacks on `rocmforge serve --device cpu`, each bounded in count and time, on loopback only; every one is
judged held or not, and the tally is written to OUTDIR (attacks.json, attacks.txt, the servers' logs).

    python scripts/bench/serve_attacks.py OUTDIR [--model PATH.gguf] [--quick]

What it sends (issue 50's list): malformed bodies and fields; bodies that are not JSON (text/plain, forms,
multipart); Host and Origin of other names (DNS rebinding, cross-site pages) and a trailing-slash redirect;
heads of 64 KiB to 16 MiB and 200,000 headers; slowloris heads and bodies at a byte a second; idle connections
by the thousand; clients that leave during their body, prompt or stream; a long prompt step while /health and
/metrics are polled, with a request queued behind it past --queue-timeout; an API key's 401; SIGTERM with
running and queued requests in both process modes; and bad numeric options. Held means: the answer the issue
asks for (status, JSON shape, connection closed in time), no traceback or error in the server's log, every KV
block back. The default model is the demo model (SmolLM2-135M-Instruct, on the cpu backend); the whole run
takes 5 to 10 minutes on 2 cores, most of it the long prompt step (--quick: fewer connections, a shorter prompt).
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from serve_attack_harness import AUTH, KEY, Served, Tally, clean_log, endless, is_openai_error, raw_exchange, status_of

MALFORMED = [
    b"{not json", b"\xff\xfe{}", b"[1, 2]", b'"a string"', b"null", b"", b"{}", b'{"prompt": "hi", "max_tokens": NaN}',
    b'{"prompt": "hi", "max_tokens": -1}', b'{"prompt": "hi", "max_tokens": 1e308}', b'{"prompt": "hi", "max_tokens": "ten"}',
    b'{"prompt": "hi", "temperature": "hot"}', b'{"prompt": "hi", "temperature": 1e9}', b'{"prompt": "hi", "top_p": -3}',
    b'{"prompt": "hi", "stop": [1, 2]}', b'{"prompt": "hi", "stop": [' + b", ".join(b'"s%d"' % i for i in range(17)) + b"]}",
    b'{"prompt": "hi", "stream": "yes"}', b'{"prompt": 42}', b'{"prompt": [1, 99999999]}', b'{"prompt": [-1]}',
    b'{"prompt": "hi", "n": 3}', b'{"prompt": "hi", "model": "gpt-4"}', b'{"prompt": "hi", "logit_bias": {"1": 5}}',
    b"[" * 100000 + b"]" * 100000, b'{"prompt": "' + b"a" * (5 << 20) + b'"}', b'{"prompt": "hi", "seed": "x"}',
]
CHAT_MALFORMED = [b'{"messages": []}', b'{"messages": [{"role": "wizard", "content": "x"}]}', b'{"messages": "hi"}',
                  b'{"messages": [{"role": "user"}]}', b'{"messages": [{"role": "user", "content": 5}]}']


def attack_bodies(tally: Tally, s: Served) -> None:
    headers = {**AUTH, "Content-Type": "application/json"}
    for body in MALFORMED:
        r = httpx.post(s.url + "/v1/completions", content=body, headers=headers, timeout=30)
        tally.add("malformed body", repr(body[:40]), is_openai_error(r, (400, 404, 413)), f"{r.status_code} {r.text[:100]}")
    for body in CHAT_MALFORMED:
        r = httpx.post(s.url + "/v1/chat/completions", content=body, headers=headers, timeout=30)
        tally.add("malformed body", "chat " + repr(body[:40]), is_openai_error(r, 400), f"{r.status_code} {r.text[:100]}")


def attack_content_types(tally: Tally, s: Served) -> None:
    before = s.metrics()["rocmforge_generated_tokens_total"]
    body = '{"prompt": "hi", "max_tokens": 2}'
    cases = [("text/plain", {"content": body, "headers": {"Content-Type": "text/plain"}}),
             ("no Content-Type", {"content": body}),
             ("form", {"data": {"prompt": "hi", "max_tokens": "2"}}),
             ("multipart", {"files": {"prompt": ("p.txt", b"hi")}}),
             ("application/jsonx", {"content": body, "headers": {"Content-Type": "application/jsonx"}}),
             ("text/json", {"content": body, "headers": {"Content-Type": "text/json"}})]
    for name, kwargs in cases:
        kwargs = {**kwargs, "headers": {**AUTH, **kwargs.get("headers", {})}}
        r = httpx.post(s.url + "/v1/completions", timeout=30, **kwargs)
        tally.add("content type", name, is_openai_error(r, 415), f"{r.status_code}")
    after = s.metrics()["rocmforge_generated_tokens_total"]
    tally.add("content type", "nothing generated for them", after == before, f"{after - before} tokens")


def attack_host_origin(tally: Tally, s: Served) -> None:
    p = s.port
    for host in ("evil.example", f"evil.example:{p}", f"localhost:{p + 1}", f"127.0.0.1.nip.io:{p}", f"[::2]:{p}", "a b"):
        r = httpx.get(s.url + "/v1/models", headers={**AUTH, "Host": host}, timeout=10)
        tally.add("host", host, is_openai_error(r, (400, 403)), f"{r.status_code}")
    for origin in ("http://evil.example", "null", "http://localhost:3000", f"http://127.0.0.1:{p}.evil.example",
                   f"https://evil.example:{p}"):
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "a", "max_tokens": 1}, headers={**AUTH, "Origin": origin},
                       timeout=30)
        tally.add("origin", origin, is_openai_error(r, 403), f"{r.status_code}")
        r = httpx.options(s.url + "/v1/completions", headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
        tally.add("origin", "preflight " + origin, r.status_code >= 400 and "access-control-allow-origin" not in r.headers,
                  f"{r.status_code}")
    for host in (f"127.0.0.1:{p}", "evil.example"):
        r = httpx.get(s.url + "/v1/models/", headers={**AUTH, "Host": host}, timeout=10)
        tally.add("redirect", f"/v1/models/ with Host {host}", "location" not in r.headers and r.status_code in (403, 404),
                  f"{r.status_code} {r.headers.get('location')}")
    r = httpx.get(s.url + "/v1/models", timeout=10)
    tally.add("auth", "401 says WWW-Authenticate: Bearer", r.status_code == 401 and r.headers.get("www-authenticate") == "Bearer",
              f"{r.status_code} {r.headers.get('www-authenticate')}")


def attack_headers(tally: Tally, s: Served) -> None:
    rss = s.metrics()["rocmforge_host_rss_anon_bytes"]
    cases = [("a 64 KiB header", [b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: " + b"a" * (64 << 10) + b"\r\n\r\n"]),
             ("a 1 MiB header", endless(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: ", b"a" * 65536, 1 << 20)),
             ("a 16 MiB header", endless(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: ", b"a" * 65536, 16 << 20)),
             ("1,000 headers", [b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-H: 1\r\n" * 1000 + b"\r\n"]),
             ("200,000 headers", endless(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n", b"X-H: 1\r\n" * 1000, 200_000 * 8))]
    for name, parts in cases:
        reply, _, closed = raw_exchange(s.port, parts)
        tally.add("huge headers", name, closed and status_of(reply) == 431, f"status {status_of(reply)}, closed {closed}")
    grown = s.metrics()["rocmforge_host_rss_anon_bytes"] - rss
    tally.add("huge headers", "server memory after them", grown < 32 << 20, f"{grown / (1 << 20):+.1f} MiB")


def attack_slowloris(tally: Tally, s: Served, connections: int) -> None:
    results: list = []

    def slow_head():
        head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 40
        results.append(("head", *raw_exchange(s.port, [bytes([b]) for b in head], gap_s=1.0, read_s=20)))

    def slow_body():
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 200\r\n\r\n")
        results.append(("body", *raw_exchange(s.port, [head] + [b" "] * 100, gap_s=1.0, read_s=80)))
    threads = [threading.Thread(target=slow_head) for _ in range(connections)]
    threads += [threading.Thread(target=slow_body) for _ in range(max(2, connections // 4))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for kind, reply, seconds, closed in results:
        if kind == "head":
            tally.add("slowloris", "head at 1 byte/s", closed and status_of(reply) == 408 and seconds < 14,
                      f"status {status_of(reply)} after {seconds:.0f} s, closed {closed}")
        else:
            tally.add("slowloris", "body at 1 byte/s", closed and seconds < 66, f"closed {closed} after {seconds:.0f} s")


def attack_idle(tally: Tally, s: Served, connections: int) -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    connections = min(connections, soft - 64)
    socks = []
    for _ in range(connections):
        try:
            socks.append(socket.create_connection(("127.0.0.1", s.port), timeout=10))
        except OSError:
            break
    t0 = time.monotonic()
    closed = refused = 0
    deadline = t0 + 10
    for sock in socks:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(4096)
            if data.startswith(b"HTTP/1.1 503"):
                refused += 1
            closed += 1
        except (TimeoutError, socket.timeout):
            pass
        except ConnectionResetError:
            closed += 1
        finally:
            sock.close()
    tally.add("idle connections", f"{len(socks)} opened, none sending", closed == len(socks),
              f"{closed} closed by the server within 10 s ({refused} of them refused with 503 past the connection limit)")
    r = httpx.get(s.url + "/health", timeout=10)
    tally.add("idle connections", "serving after them", r.status_code == 200, f"{r.status_code}")


def attack_disconnects(tally: Tally, s: Served, count: int) -> None:
    s.new_log()
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAuthorization: Bearer "
            + KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n")
    body = json.dumps({"prompt": "tell me a long story " * 20, "max_tokens": 64, "stream": True}).encode()
    for i in range(count):
        with socket.create_connection(("127.0.0.1", s.port)) as sock:  # during the body
            sock.sendall(head % len(body) + body[:20])
        with socket.create_connection(("127.0.0.1", s.port)) as sock:  # during the prompt (or just after)
            sock.sendall(head % len(body) + body)
            time.sleep(0.02)
        with socket.create_connection(("127.0.0.1", s.port)) as sock:  # mid-stream
            sock.sendall(head % len(body) + body)
            received = b""
            deadline = time.monotonic() + 30
            while received.count(b"data:") < 2 and time.monotonic() < deadline:
                received += sock.recv(4096)
    back = s.blocks_back()
    ok, bad = clean_log(s.new_log())
    tally.add("disconnects", f"{count} each during body, prompt, stream: blocks back", back, "blocks held")
    tally.add("disconnects", "no error or traceback logged", ok, bad)


def attack_long_prompt(tally: Tally, outdir: Path, model: str, quick: bool) -> None:
    s = Served(outdir, "long-prompt", model, "--api-key", KEY, "--ctx-size", "4096", "--step-tokens", "4096",
               "--parallel", "1", "--queue", "4", "--queue-timeout", "3")
    try:
        tokens = 1000 if quick else 2000
        done = threading.Event()
        answers: dict = {}

        def long_request():
            r = httpx.post(s.url + "/v1/completions", json={"prompt": list(range(100, 100 + tokens)), "max_tokens": 1},
                           headers=AUTH, timeout=600)
            answers["long"] = r.status_code
            done.set()

        def queued_request():
            t0 = time.monotonic()
            r = httpx.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers=AUTH, timeout=600)
            answers["queued"] = (r.status_code, r.headers.get("retry-after"), time.monotonic() - t0, r.text[:200])
        threading.Thread(target=long_request, daemon=True).start()
        time.sleep(0.5)
        queued = threading.Thread(target=queued_request, daemon=True)
        queued.start()
        polls = slow = 0
        worst = 0.0
        deadline = time.monotonic() + (120 if quick else 300)
        while not done.is_set() and time.monotonic() < deadline:
            for path in ("/health", "/metrics", "/load"):
                t0 = time.monotonic()
                try:
                    ok = httpx.get(s.url + path, timeout=5).status_code in (200, 503)
                except httpx.HTTPError:
                    ok = False
                seconds = time.monotonic() - t0
                polls += 1
                worst = max(worst, seconds)
                slow += (not ok) or seconds >= 1.0
            time.sleep(0.3)
        tally.add("long prompt", f"{polls} polls of /health, /metrics, /load during a {tokens}-token prompt step",
                  polls > 0 and slow == 0, f"{slow} slower than 1 s or failed; worst {worst:.2f} s")
        done.wait(600)
        queued.join(600)
        status, retry, seconds, text = answers.get("queued", (None, None, 0, ""))
        tally.add("queue timeout", "a request queued behind it past --queue-timeout 3",
                  status == 503 and retry is not None and "queue" in text, f"{status} retry-after {retry} after {seconds:.0f} s")
        tally.add("long prompt", "the long request answered", answers.get("long") == 200, str(answers.get("long")))
    finally:
        rc = s.stop()
        ok, bad = clean_log(s.log_path.read_text(errors="replace"))
        tally.add("long prompt", "server exit 0, no traceback", rc == 0 and ok, f"exit {rc}; {bad}")


def attack_sigterm(tally: Tally, outdir: Path, model: str, mode: list[str]) -> None:
    name = "one process" if mode else "two processes"
    s = Served(outdir, "sigterm-" + name.replace(" ", "-"), model, "--parallel", "2", "--queue", "4",
               "--shutdown-grace", "1", *mode)
    results: list = []

    def stream():
        try:
            with httpx.stream("POST", s.url + "/v1/completions", timeout=60,
                              json={"prompt": "write a long story", "max_tokens": 400, "stream": True, "ignore_eos": True}) as r:
                results.append(("stream", r.status_code, [line for line in r.iter_lines() if line]))
        except httpx.HTTPError as exc:
            results.append(("stream", "transport", repr(exc)))

    def whole():
        try:
            r = httpx.post(s.url + "/v1/completions", json={"prompt": "a story", "max_tokens": 400, "ignore_eos": True},
                           timeout=60)
            results.append(("whole", r.status_code, r.headers.get("content-type"), r.text))
        except httpx.HTTPError as exc:
            results.append(("whole", "transport", repr(exc)))
    clients = [threading.Thread(target=stream) for _ in range(3)] + [threading.Thread(target=whole)]
    for c in clients:
        c.start()
    deadline = time.monotonic() + 30
    while s.metrics()["rocmforge_requests_in_flight"] < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    s.terminate()
    time.sleep(0.3)
    try:
        late = httpx.post(s.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2}, timeout=10)
        tally.add("sigterm " + name, "a new request while draining gets a JSON 503", is_openai_error(late, 503),
                  f"{late.status_code}")
    except httpx.HTTPError as exc:
        tally.add("sigterm " + name, "a new request while draining gets a JSON 503", False, repr(exc))
    for c in clients:
        c.join(60)
    rc = s.stop()
    for result in results:
        if result[0] == "stream" and result[1] == 200:
            lines = result[2]
            tally.add("sigterm " + name, "a running stream ends with an event and [DONE]",
                      lines[-1:] == ["data: [DONE]"] and "error" in lines[-2], " | ".join(lines[-2:])[:200])
        elif result[0] == "stream":
            ok = result[1] == 503 and "error" in json.loads(result[2][0])
            tally.add("sigterm " + name, "a queued stream gets a JSON 503", ok, str(result[1:])[:200])
        else:
            ok = result[1] in (200, 503) and result[2] == "application/json" and json.loads(result[3])
            tally.add("sigterm " + name, "a whole request gets a JSON body", bool(ok), str(result[1:3]))
    text = s.log_path.read_text(errors="replace")
    ok, bad = clean_log(text)
    tally.add("sigterm " + name, "exit 0, every block back, summary, no traceback",
              rc == 0 and ok and "every KV block returned" in text and "requests in flight at the signal" in text,
              f"exit {rc}; {bad}")


BAD_OPTIONS = [["--shutdown-grace", "nan"], ["--shutdown-grace", "inf"], ["--shutdown-grace", "-1"],
               ["--step-tokens", "1000000000"], ["--step-tokens", "0"], ["--parallel", "0"], ["--parallel", "1000000"],
               ["--queue", "-1"], ["--queue-timeout", "nan"], ["--port", "99999"], ["--kv-blocks", "99999999999"],
               ["--ctx-size", "0"], ["--cors-origins", "evil"], ["--allowed-hosts", ","]]


def attack_options(tally: Tally, model: str) -> None:
    for args in BAD_OPTIONS:
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "rocmforge_cli.app", "serve", "--model", model, "--device", "cpu",
                            "--port", "0", *args], capture_output=True, text=True, timeout=120)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        seconds = time.monotonic() - t0
        tally.add("bad option", " ".join(args), r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr
                  and seconds < 30, f"exit {r.returncode} in {seconds:.1f} s: {r.stderr[-200:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--model", default=None, help="default: the demo model")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    outdir = args.outdir
    outdir.mkdir(parents=True, exist_ok=True)
    model = args.model
    if model is None:
        from hipcore.gguf.demo_model import find_demo_model
        model = str(find_demo_model() or sys.exit("no --model and no demo model installed"))
    tally = Tally()
    started = time.monotonic()
    s = Served(outdir, "main", model, "--api-key", KEY, "--parallel", "4", "--queue", "16", "--ctx-size", "1024")
    try:
        attack_bodies(tally, s)
        attack_content_types(tally, s)
        attack_host_origin(tally, s)
        attack_headers(tally, s)
        attack_slowloris(tally, s, 8 if args.quick else 20)
        attack_idle(tally, s, 300 if args.quick else 2000)
        attack_disconnects(tally, s, 3 if args.quick else 10)
        back = s.blocks_back()
        tally.add("kv cache", "every block free after the attacks", back, "blocks held")
    finally:
        rc = s.stop()
        ok, bad = clean_log(s.log_path.read_text(errors="replace"))
        tally.add("shutdown", "main server exits 0 with no traceback", rc == 0 and ok, f"exit {rc}; {bad}")
    attack_long_prompt(tally, outdir, model, args.quick)
    for mode in ([], ["--one-process"]):
        attack_sigterm(tally, outdir, model, mode)
    attack_options(tally, model)
    summary = tally.summary() | {"seconds": round(time.monotonic() - started, 1), "model": model}
    (outdir / "attacks.json").write_text(json.dumps({"summary": summary, "attacks": tally.rows}, indent=1))
    lines = [f"{summary['held']} of {summary['tried']} attacks held in {summary['seconds']:.0f} s ({model})"]
    lines += [f"  {name}: {c['held']}/{c['tried']}" for name, c in summary["by_attack"].items()]
    lines += [f"  BROKE {r['attack']}: {r['case']}: {r['detail']}" for r in tally.rows if not r["held"]]
    (outdir / "attacks.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if summary["held"] == summary["tried"] else 1


if __name__ == "__main__":
    sys.exit(main())
