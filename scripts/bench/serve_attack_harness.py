"""The harness of scripts/bench/serve_attacks.py: a `rocmforge serve --device cpu` on a free loopback port (Served),
the tally of attacks held or broken, and the raw-socket and response checks the attacks share."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

KEY = "attack-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
LOG_BAD = ("Traceback", "Exception in ASGI", "internal error", "Cancel ", "ERROR")


class Tally:
    def __init__(self):
        self.rows: list[dict] = []

    def add(self, attack: str, case: str, held: bool, detail: str = "") -> None:
        self.rows.append({"attack": attack, "case": case, "held": bool(held), "detail": detail[:300]})
        print(f"{'held  ' if held else 'BROKE '} {attack}: {case}" + ("" if held else f" ({detail[:200]})"), flush=True)

    def summary(self) -> dict:
        by_attack: dict[str, list[int]] = {}
        for row in self.rows:
            counts = by_attack.setdefault(row["attack"], [0, 0])
            counts[0] += 1
            counts[1] += row["held"]
        return {"tried": len(self.rows), "held": sum(r["held"] for r in self.rows),
                "by_attack": {k: {"tried": v[0], "held": v[1]} for k, v in by_attack.items()}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """`rocmforge serve` on a free loopback port, its output in a log file."""

    def __init__(self, outdir: Path, name: str, model: str, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = outdir / f"server-{name}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "rocmforge_cli.app", "serve", "--model", model, "--device",
                                      "cpu", "--host", "127.0.0.1", "--port", str(self.port), *args],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not come up; see {self.log_path}")
            time.sleep(0.2)
        self.log_start = 0
        self.signalled = False

    def metrics(self) -> dict[str, float]:
        out = {}
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def blocks_back(self, timeout_s: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            m = self.metrics()
            if m["rocmforge_requests_in_flight"] == 0 and m["rocmforge_kv_physical_blocks"] == 0 and \
                    m["rocmforge_kv_free_blocks"] == m["rocmforge_kv_total_blocks"] - m["rocmforge_kv_reserved_blocks"]:
                return True
            time.sleep(0.1)
        return False

    def new_log(self) -> str:
        """The log written since the last call."""
        self.log.flush()
        text = self.log_path.read_text(errors="replace")
        new, self.log_start = text[self.log_start:], len(text)
        return new

    def terminate(self) -> None:
        """SIGTERM, once: a second signal means "now" (the server skips its grace)."""
        if not self.signalled and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.signalled = True

    def stop(self, timeout_s: float = 90.0) -> int:
        self.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        return self.proc.returncode


def clean_log(text: str) -> tuple[bool, str]:
    bad = [line for line in text.splitlines() if any(mark in line for mark in LOG_BAD)]
    return not bad, "; ".join(bad[:3])


def is_openai_error(response: httpx.Response, status: int | tuple[int, ...]) -> bool:
    statuses = (status,) if isinstance(status, int) else status
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return response.status_code in statuses and set(error) == {"message", "type", "param", "code"}


def raw_exchange(port: int, payload_parts, gap_s: float = 0.0, read_s: float = 15.0) -> tuple[bytes, float, bool]:
    """Send the parts (stopping when the server closes), then read until it closes: (reply, seconds from the first
    byte to the close, closed by the server)."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=read_s) as sock:
        try:
            for part in payload_parts:
                sock.sendall(part)
                if gap_s:
                    time.sleep(gap_s)
        except (BrokenPipeError, ConnectionResetError):
            pass
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (TimeoutError, socket.timeout):
            return b"".join(chunks), time.monotonic() - t0, False
        except ConnectionResetError:
            pass
    return b"".join(chunks), time.monotonic() - t0, True


def status_of(reply: bytes) -> int | None:
    try:
        return int(reply.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def endless(first: bytes, piece: bytes, total: int):
    yield first
    for _ in range(total // len(piece)):
        yield piece
