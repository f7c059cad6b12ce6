"""`rocmforge serve --report/--plot/--trace`: written at exit (SIGTERM), with the requests it served as spans and
steps on the trace, and the memory breakdown printed after the shutdown check."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import httpx

from support.serve_testing import wait_until_up
from support.engine_testing import tiny_model
from test_serve_shutdown import free_port
from test_trace_events import validate


def test_serve_writes_its_pictures_at_exit(tmp_path_factory, tmp_path):
    model = tiny_model(tmp_path_factory)
    page, trace = tmp_path / "serve.html", tmp_path / "serve.json"
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "rocmforge_cli.app", "serve", "--model", str(model), "--device",
                               "cpu", "--port", str(port), "--report", str(page), "--trace", str(trace)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(server, url)
        for k in range(3):
            answer = httpx.post(url + "/v1/completions", json={"prompt": [5, 6, 7 + k], "max_tokens": 4}, timeout=30)
            assert answer.status_code == 200
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0, output
    assert "memory breakdown" in output and "this process (the ledger)" in output
    data = json.loads(page.read_text().split('id="memory-timeline">')[1].split("</script>")[0])
    assert data["verdict"] == "clean" and len(data["spans"]) == 3 and all(s["end"] is not None for s in data["spans"])
    events = json.loads(trace.read_text())
    assert validate(events) == {}  # the model closed: every allocation freed
    assert sum(e["name"] == "engine step" for e in events["traceEvents"]) >= 3


def test_serve_leak_check_has_the_server_write_its_pictures(tmp_path_factory, tmp_path):
    from typer.testing import CliRunner
    from rocmforge_cli.app import app

    page, image = tmp_path / "s.html", tmp_path / "s.png"
    result = CliRunner().invoke(app, ["serve-leak-check", "-m", str(tiny_model(tmp_path_factory)), "--device", "cpu",
                                      "--requests", "8", "--clients", "4", "--max-tokens", "2", "-q",
                                      "--fail-on", "host-growth=off", "--report", str(page), "--plot", str(image)],
                                env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    data = json.loads(page.read_text().split('id="memory-timeline">')[1].split("</script>")[0])
    assert data["verdict"] == "clean" and len(data["spans"]) >= 8  # the warm-up's requests too
    assert image.read_bytes().startswith(b"\x89PNG")
    wrong = CliRunner().invoke(app, ["serve-leak-check", "--device", "cpu", "--report", "s.txt"])
    assert wrong.exit_code == 2 and "--report" in wrong.output
