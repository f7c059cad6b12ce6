"""Host cost of `rocmforge serve` per generated token, with the model's forward pass taken out.

A MEASURING TOOL, not a server mode: the real server (Starlette + uvicorn, the engine loop, the Engine with
its scheduler, KV cache, batch builder and sampling inputs, the real tokenizer's stream decoder) runs in a
child process, and only the runner is replaced by `InstantRunner`, whose step sleeps `--step-ms` (standing
for the GPU's time, the GIL released as in a device wait) and returns plausible tokens (the token ids of an
English text, each sequence at its own offset) instead of computing anything. What the child then spends in
CPU time is the host cost the issue's 20% budget is about.

The parent drives N concurrent streaming chat clients over loopback (httpx, the way OpenAI load generators
do: one SSE event parsed per chunk) and reads the child's CPU time per thread from /proc before and after:

    engine thread      the engine loop: scheduling, batch building, sampling inputs, token bookkeeping,
                       detokenization, stop checks, and the hand-off of events to the event loop
    event loop thread  uvicorn + Starlette: HTTP, the handlers, SSE encoding, the socket writes
    other threads      prompt rendering / tokenization (asyncio.to_thread workers)

Run (the demo model's tokenizer and shapes; no weights are loaded):
    PYTHONPATH=$PWD python scripts/bench/serve_overhead.py --clients 32 --requests 64
    ... --profile OUTDIR     cProfile of the engine and event-loop threads (slower; for where, not how much)
    ... --http-process          the HTTP layer in a process of its own, as `rocmforge serve` runs it: the
                                "event loop" figures are then that whole process's CPU (its chat-template
                                workers apart), and the server's CPU is both processes'

The figures are host CPU on this machine; they say nothing of a GPU's step time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]  # the repository
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_host_cost import SAMPLE_TEXT  # noqa: E402  (the same text for both measures of the host)


# ---- the child: the real server over an instant runner ---------------------------------------------------

class InstantRunner:
    """A runner that computes nothing (measuring only): sleeps step_s per step and returns the next tokens of a
    fixed text for each sampled row. The engine sees a SamplingRunner, as on a GPU with device sampling."""

    def __init__(self, config, text_ids: list[int], step_s: float):
        self.config = config
        self._text = text_ids
        self._step_s = step_s
        self._cursor = 0
        self.slept_s = 0.0
        self.steps = 0
        # Wall time from the end of one stand-in device wait to the start of the next: on a GPU, the time the
        # device sits idle between two steps while the host works (or waits for the GIL).
        self.gaps: list[float] = []
        self._last_end: float | None = None

    def _tokens(self, rows: int):
        import numpy as np

        n = len(self._text)
        out = np.array([self._text[(self._cursor + 7 * r) % n] for r in range(rows)], dtype=np.int32)
        self._cursor += 1
        return out

    def _wait(self) -> None:
        self.steps += 1
        t0 = time.perf_counter()
        if self._last_end is not None:
            self.gaps.append(t0 - self._last_end)
        if self._step_s > 0:
            time.sleep(self._step_s)
        self._last_end = time.perf_counter()
        self.slept_s += self._last_end - t0

    def execute_sampled(self, batch, sampling):
        self._wait()
        return self._tokens(len(batch.sample_rows))

    def execute(self, batch):  # host sampling (penalties): flat logits favouring the text's next token
        import numpy as np

        self._wait()
        rows = len(batch.sample_rows)
        logits = np.zeros((rows, self.config.vocab_size), dtype=np.float32)
        logits[np.arange(rows), self._tokens(rows)] = 30.0
        return logits

    def close(self) -> None:
        pass


class _NoWeights:
    def free(self) -> None:
        pass


def thread_cpu_s(native_id: int) -> float:
    """User + system CPU seconds of one thread of this process (Linux /proc)."""
    try:
        fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def process_cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def template_worker_pids(server) -> list[int]:
    """The chat-template workers' pids: this process's pool, or the HTTP process's children."""
    if server.http_process:
        pids = []
        for task in Path(f"/proc/{server.http_pid}/task").glob("*"):
            try:
                pids += [int(p) for p in (task / "children").read_text().split()]
            except (FileNotFoundError, ValueError):
                pass
        return pids
    return [w.process.pid for w in list(getattr(server.served.templates, "_all", ()))]


def build_loaded(model_path: str, clients: int, ctx: int, step_s: float):
    from hipcore.engine.engine import Engine
    from hipcore.engine.loader import LoadedModel
    from hipcore.gguf.file import GGUFFile
    from hipcore.kvcache.cache import KvCache
    from hipcore.model.memory_plan import make_plan
    from hipcore.runtime.selection import pick_device
    from hipcore.tokenizer.tokenizer import Tokenizer

    gguf = GGUFFile.open(model_path)
    tokenizer = Tokenizer.from_metadata(gguf.metadata)
    device = pick_device("cpu").device
    cfg = gguf.config
    plan = make_plan(device, gguf.plan, ctx_size=ctx, max_seqs=clients, max_step_tokens=512, kv_dtype="f16",
                     block_size=16, layer_windows=tuple(cfg.layer_window(i) for i in range(cfg.n_layers)))
    cache = KvCache(device, plan.kv_config)
    text_ids = [t for t in tokenizer.encode(SAMPLE_TEXT * 4) if t not in tokenizer.eot_ids]
    runner = InstantRunner(cfg, text_ids, step_s)
    engine = Engine(runner, tokenizer, cache, max_seqs=clients, max_step_tokens=512, max_context=ctx)
    return LoadedModel(model_path, device, [], gguf, tokenizer, plan, _NoWeights(), cache, runner, engine, 0.0)


def child_main(args) -> None:
    import cProfile
    import pstats

    from rocmforge_serve.server import Server, ServerThread

    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    loaded = build_loaded(args.model, args.clients, args.ctx, args.step_ms / 1000)
    server = Server(loaded, name="bench", max_queue=args.clients, ignore_eos=True, grace_s=1.0,
                    http_process=args.http_process)
    profiles: dict[str, cProfile.Profile] = {}

    def profiled(name, target):
        def run(*a, **k):
            prof = profiles[name] = cProfile.Profile()
            prof.enable()
            try:
                return target(*a, **k)
            finally:
                prof.disable()
        return run

    loop = server.engine_loop
    engine = loaded.engine
    step_cpu = [0.0]  # CPU seconds of the engine thread inside Engine.step (the stand-in device sleep costs none)
    real_step = engine.step

    def timed_step(*args, **kwargs):
        t0 = time.thread_time()
        try:
            return real_step(*args, **kwargs)
        finally:
            step_cpu[0] += time.thread_time() - t0
    engine.step = timed_step
    if args.profile:  # the engine thread is created in EngineLoop.__init__ and started by Server.run
        loop._thread = threading.Thread(target=profiled("engine", loop._run), name="rocmforge-engine", daemon=True)
    live = ServerThread(server)
    if args.profile:
        live.thread = threading.Thread(target=profiled("event_loop", server.run), kwargs={"sockets": [live.socket]},
                                       daemon=True)
    live.__enter__()
    engine_tid, loop_tid = loop._thread.native_id, live.thread.native_id
    print(json.dumps({"port": live.port}), flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "mark":
            per_thread = {"engine": thread_cpu_s(engine_tid), "event_loop": thread_cpu_s(loop_tid)}
            times = os.times()
            http_s = 0.0
            if args.http_process:  # the event loop is the other process; Server.run's thread here only waits
                http_s = process_cpu_s(server.http_pid)
                per_thread["event_loop"] = http_s
            stats = loaded.engine.stats
            print(json.dumps({
                "process_cpu_s": times.user + times.system + http_s, **per_thread,
                # chat-template renders: processes started per render (reaped), plus the live pool workers
                "children_cpu_s": times.children_user + times.children_system + sum(
                    process_cpu_s(pid) for pid in template_worker_pids(server)),
                "steps": stats.steps, "generated": stats.generated_tokens, "prompt_tokens": stats.prompt_tokens,
                "step_cpu_s": step_cpu[0], "runner_slept_s": loaded.runner.slept_s,
                "gaps": len(loaded.runner.gaps),
                "wall": time.perf_counter()}), flush=True)
        elif command.startswith("gaps "):  # the median device-idle gap of the steps since a mark
            start = int(command.split()[1])
            gaps = sorted(g for g in loaded.runner.gaps[start:] if g < 0.1)  # longer: the engine had no work
            print(json.dumps({"median_gap_s": gaps[len(gaps) // 2] if gaps else None}), flush=True)
        elif command == "quit":
            break
    report = live.stop()
    if args.profile:
        for name, prof in profiles.items():
            path = f"{args.profile}.{name}.prof"
            prof.dump_stats(path)
            with open(f"{args.profile}.{name}.txt", "w") as out:
                pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(40)
    loaded.close()
    print(json.dumps({"shutdown_clean": report.clean}), flush=True)


# ---- the parent: the clients ---------------------------------------------------------------------------

async def one_request(client, url: str, prompt: str, max_tokens: int, record: dict, chat: bool) -> None:
    body = {"model": "bench", "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    t0 = time.perf_counter()
    first = None
    chunks = 0
    usage = None
    route = "/v1/chat/completions" if chat else "/v1/completions"
    async with client.stream("POST", url + route, json=body) as response:
        if response.status_code != 200:
            record["errors"] += 1
            await response.aread()
            return
        # Light on purpose: the clients share this machine's two cores with the server, so they count
        # events in the raw bytes and parse only the last ones (usage), not every chunk's JSON.
        tail = b""
        async for data in response.aiter_raw():
            if first is None:
                first = time.perf_counter() - t0
            chunks += data.count(b'"content": "' if chat else b'"text": "')
            chunks -= data.count(b'"content": ""' if chat else b'"text": ""')
            tail = (tail + data)[-4096:]
    for line in tail.split(b"\n"):
        if line.startswith(b"data: {") and b'"usage"' in line:
            usage = json.loads(line[6:]).get("usage")
    record["chunks"] += chunks
    record["completion_tokens"] += usage["completion_tokens"] if usage else 0
    if first is not None:
        record["ttft"].append(first)


async def drive(url: str, clients: int, requests: int, prompt: str, max_tokens: int, chat: bool) -> dict:
    import httpx

    record = {"errors": 0, "chunks": 0, "completion_tokens": 0, "ttft": []}
    queue = list(range(requests))
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(300)) as client:
        async def worker():
            while queue:
                queue.pop()
                await one_request(client, url, prompt, max_tokens, record, chat)
        await asyncio.gather(*(worker() for _ in range(clients)))
    return record


def fitted_prompt(model_path: str, tokens: int) -> str:
    from hipcore.gguf.file import GGUFFile
    from hipcore.tokenizer.tokenizer import Tokenizer

    with GGUFFile.open(model_path) as gguf:
        tok = Tokenizer.from_metadata(gguf.metadata)
    ids = tok.encode(SAMPLE_TEXT * 8)[:tokens]
    return tok.decode(ids)


def parent_main(args) -> dict:
    cmd = [sys.executable, __file__, "--child", "--model", args.model, "--clients", str(args.clients),
           "--ctx", str(args.ctx), "--step-ms", str(args.step_ms)] + (["--http-process"] if args.http_process else []) + (
               ["--switch-interval-ms", str(args.switch_interval_ms)] if args.switch_interval_ms is not None else []) + (["--profile", args.profile] if args.profile else [])
    env = {**os.environ, "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def ask(command: str) -> dict:
        child.stdin.write(command + "\n")
        child.stdin.flush()
        return json.loads(child.stdout.readline())

    try:
        port = json.loads(child.stdout.readline())["port"]
        url = f"http://127.0.0.1:{port}"
        prompt = fitted_prompt(args.model, args.prompt_tokens)
        chat = args.endpoint == "chat"
        asyncio.run(drive(url, args.clients, args.clients, prompt, 4, chat))  # warm-up: connections, code paths
        before = ask("mark")
        record = asyncio.run(drive(url, args.clients, args.requests, prompt, args.max_tokens, chat))
        after = ask("mark")
        gap = ask(f"gaps {before['gaps']}")["median_gap_s"]
        child.stdin.write("quit\n")
        child.stdin.flush()
        tail = child.stdout.readline()
        child.wait(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    d = {k: after[k] - before[k] for k in after}
    tokens = d["generated"]
    steps = d["steps"]
    engine_step_host = d["step_cpu_s"]
    us = 1e6
    result = {
        "endpoint": args.endpoint, "http_process": args.http_process, "clients": args.clients, "requests": args.requests, "max_tokens": args.max_tokens, "step_ms": args.step_ms,
        "errors": record["errors"], "generated_tokens": tokens, "usage_completion_tokens": record["completion_tokens"],
        "content_chunks": record["chunks"], "steps": steps, "tokens_per_step": tokens / max(steps, 1),
        "wall_s": d["wall"], "tokens_per_s": tokens / d["wall"],
        "ideal_tokens_per_s": (tokens / max(steps, 1)) / (args.step_ms / 1000) if args.step_ms else None,
        "server_cpu_us_per_token": d["process_cpu_s"] * us / tokens,
        "engine_thread_us_per_token": d["engine"] * us / tokens,
        "event_loop_us_per_token": d["event_loop"] * us / tokens,
        "other_threads_us_per_token": (d["process_cpu_s"] - d["engine"] - d["event_loop"]) * us / tokens,
        "render_children_cpu_ms_per_request": d["children_cpu_s"] * 1000 / args.requests,
        "engine_step_cpu_us_per_step": engine_step_host * us / max(steps, 1),
        "engine_step_cpu_us_per_token": engine_step_host * us / tokens,
        "engine_dispatch_cpu_us_per_token": (d["engine"] - engine_step_host) * us / tokens,
        "median_device_idle_gap_us": gap * us if gap is not None else None,
        "median_ttft_ms": sorted(record["ttft"])[len(record["ttft"]) // 2] * 1000 if record["ttft"] else None,
        "shutdown": json.loads(tail) if tail else None,
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a GGUF file (its tokenizer and shapes); default: the demo model")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--endpoint", choices=("chat", "completions"), default="completions",
                        help="completions (default): no chat template, so the per-token path is what is measured; "
                             "chat: each request also renders the model's template in a child process")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--ctx", type=int, default=320)
    parser.add_argument("--step-ms", type=float, default=2.9, help="the stand-in GPU time of one step (sleep)")
    parser.add_argument("--switch-interval-ms", type=float, default=None,
                        help="sys.setswitchinterval in the server process (default: the server's own choice)")
    parser.add_argument("--profile", default=None, help="path prefix for cProfile output of the server's threads")
    parser.add_argument("--http-process", action="store_true",
                        help="the HTTP layer in a process of its own (as rocmforge serve runs it; not with --profile)")
    parser.add_argument("--repeat", type=int, default=1, help="runs (a fresh server each); figures of each are printed")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from hipcore.gguf.demo_model import model_or_demo

    try:
        args.model = model_or_demo(args.model)
    except FileNotFoundError as exc:
        sys.exit(str(exc))
    if args.profile and args.http_process:
        parser.error("--profile reads the threads of one process; leave out --http-process")
    if args.child:
        child_main(args)
        return
    for _ in range(args.repeat):
        result = parent_main(args)
        print(json.dumps(result, indent=None if args.repeat > 1 else 1))


if __name__ == "__main__":
    main()
