"""The memory breakdown at the end of generate: the ledger's tags add up to this process's bytes, in --json and in
the table on stderr, which stays within 80 columns; the cpu backend has no driver figures to subtract."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from support.gguf_factory import write_tiny_llama
from hipcore.runtime.cpu import CpuDevice
from profiles.memory_breakdown import memory_breakdown
from rocmforge_cli.app import app

runner = CliRunner()


def test_generate_ends_with_the_breakdown_in_json_and_as_a_table(tmp_path):
    model = str(write_tiny_llama(tmp_path / "tiny.gguf", tokenizer="gpt2"))
    args = ["generate", "--model", model, "--device", "cpu", "-n", "2", "-p", "hello", "--seed", "1"]
    result = runner.invoke(app, [*args, "--json"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output[-2000:]
    memory = json.loads(result.stdout)["memory"]
    parts = memory["weights"] + memory["kv_cache"] + memory["activations"] + memory["scratch"] + memory["other"]
    assert memory["weights"] > 0 and memory["kv_cache"] > 0 and parts == memory["ledger"]
    assert memory["used"] is None and memory["unaccounted"] is None  # no driver on the cpu backend
    table = runner.invoke(app, args, env={"COLUMNS": "80"})
    lines = table.stderr.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("memory breakdown"))
    rows = lines[start + 1:]
    assert max(len(line) for line in rows) <= 80
    text = "\n".join(rows)
    for name in ("total", "free", "this process (the ledger)", "weights", "KV cache", "activations", "scratch",
                 "unaccounted"):
        assert name in text, name


class DriverDevice(CpuDevice):
    """A cpu device with a driver's view: 64 MiB more in use than its ledger holds."""

    def driver_free_bytes(self):
        return self.memory_info().free

    def memory_info(self):
        info = super().memory_info()
        return type(info)(free=info.free - (64 << 20), total=info.total)


def test_unaccounted_is_the_drivers_used_minus_the_ledger():
    device = DriverDevice(capacity=1 << 30)
    try:
        buf = device.allocate(1 << 20, tag="kv")
        figures = memory_breakdown(device)
        assert figures["kv_cache"] == 1 << 20 and figures["ledger"] == 1 << 20
        assert figures["used"] == (1 << 20) + (64 << 20) and figures["unaccounted"] == 64 << 20
        buf.free()
    finally:
        device.close()
