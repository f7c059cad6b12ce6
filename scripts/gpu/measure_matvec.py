"""Achieved memory bandwidth of the matvec kernels at the demo model's shapes, against the card's
measured device-to-device copy bandwidth, as a table for docs/benchmarks.md.

Run from the repository root on a GPU machine (the project need not be installed):

    python3 scripts/gpu/measure_matvec.py            # markdown table on stdout
    python3 scripts/gpu/measure_matvec.py --json     # the same figures as JSON

How it measures:
- copy bandwidth: cuMemcpyDtoD / hipMemcpyDtoD of a 1 GiB buffer, timed with events over several
  copies, counting the bytes read and written (2 x size per copy);
- matvec: the weights are replicated in --rotate-mib of device memory (default 1 GiB, over 20 times the
  L2 of an H100 or H200) and the timed launches walk the copies in turn, so every launch reads its
  weights from DRAM as in decoding. The launches are captured in one graph, replayed, and timed with
  events: GPU time per kernel, without Python's launch cost (the "eager" column shows the same
  launches made one by one from Python). bytes = weights + x + y; bandwidth = bytes / kernel time.
- floor: add_f32 on one element, captured and timed the same way: the cost of a kernel that moves
  nothing, which bounds what a small matrix can reach.
Every shape's output is first checked against the numpy reference.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hipcore.ops import add, matvec  # noqa: E402
from hipcore.runtime import kernels as loader  # noqa: E402
from hipcore.runtime.selection import pick_device  # noqa: E402

# (weight type, rows, cols): SmolLM2-135M's ffn up/gate, ffn down, and output (tied embedding) matrices.
CASES = [("q4_1", 1536, 576), ("q4_1", 576, 1536), ("q8_0", 49152, 576)]
COPY_BYTES = 1 << 30


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def timed(dev, stream, fn, repeats: int) -> float:
    """Median over `repeats` of the event-timed milliseconds of fn() on stream."""
    start, end = dev.create_event(), dev.create_event()
    times = []
    for _ in range(repeats):
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(start.elapsed_ms(end))
    return statistics.median(times)


def copy_bandwidth(dev, stream, repeats: int) -> float:
    """Bytes per second moved by a device-to-device copy, read + write counted."""
    src = dev.allocate(COPY_BYTES, "scratch", label="copy source")
    dst = dev.allocate(COPY_BYTES, "scratch", label="copy destination")
    try:
        src.fill(0x3C, stream=stream)
        copies = 5
        dev.copy_device_to_device(dst, src, COPY_BYTES, stream=stream)  # warm up

        def run() -> None:
            for _ in range(copies):
                dev.copy_device_to_device(dst, src, COPY_BYTES, stream=stream)
        ms = timed(dev, stream, run, repeats)
        return 2 * COPY_BYTES * copies / (ms / 1e3)
    finally:
        src.free()
        dst.free()


def random_weights(rng: np.random.Generator, weight_type: str, rows: int, cols: int) -> np.ndarray:
    blocks = rng.integers(0, 256, (rows, cols // 32, matvec.BLOCK_BYTES[weight_type]), dtype=np.uint8)
    scales = (rng.standard_normal((rows, cols // 32, 2)) * 0.02).astype(np.float16)
    blocks[..., 0:2] = scales[..., 0:1].view(np.uint8)
    if weight_type == "q4_1":
        blocks[..., 2:4] = scales[..., 1:2].view(np.uint8)
    return blocks.reshape(rows, -1)


def graph_time_per_launch(dev, stream, launches, replays: int, repeats: int) -> float:
    """Milliseconds of GPU time per launch of `launches` (callables taking a stream) inside a graph."""
    with dev.capture(stream) as cap:
        for launch in launches:
            launch(stream)
    graph = cap.graph
    try:
        graph.launch(stream)  # warm up
        stream.synchronize()

        def run() -> None:
            for _ in range(replays):
                graph.launch(stream)
        return timed(dev, stream, run, repeats) / (replays * len(launches))
    finally:
        graph.destroy()


def measure_case(dev, stream, rng, weight_type: str, rows: int, cols: int, batch: int, rotate_bytes: int,
                 replays: int, repeats: int) -> dict:
    stride = rows * matvec.row_bytes(weight_type, cols)
    copies = max(2, rotate_bytes // stride)
    raw = random_weights(rng, weight_type, rows, cols)
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    weights = dev.allocate(copies * stride, "weights", label=f"{weight_type} {rows}x{cols} x{copies}")
    xs = dev.allocate(x.nbytes, "activations", label="x")
    y = dev.allocate(batch * rows * 4, "activations", label="y")
    try:
        weights.upload(raw)
        for k in range(1, copies):
            dev.copy_device_to_device(weights, weights, stride, dst_offset=k * stride, stream=stream)
        xs.upload(x)
        stream.synchronize()

        y.fill(0xFF, stream=stream)
        matvec.launch(dev, stream, y, weights.addr(stride * (copies - 1)), xs, rows, cols, batch, weight_type=weight_type)
        got = y.download(np.float32).reshape(batch, rows)
        want = matvec.reference(raw, weight_type, x, rows, cols)
        bound = (cols + 2) * 2.0**-24 * (np.abs(x.astype(np.float64))
                                        @ np.abs(matvec.dequantize_rows(raw, weight_type, cols, np.float64)).T)
        if not np.all(np.abs(got - want) <= bound + 1e-30):
            raise SystemExit(f"matvec_{weight_type} {rows}x{cols} gives wrong results on this device")

        launches = [
            (lambda s, k=k: matvec.launch(dev, s, y, weights.addr(k * stride), xs, rows, cols, batch, weight_type=weight_type))
            for k in range(copies)
        ]
        graph_ms = graph_time_per_launch(dev, stream, launches, replays, repeats)

        def eager() -> None:
            for launch in launches:
                launch(stream)
        eager(); stream.synchronize()  # noqa: E702 - warm up
        eager_ms = timed(dev, stream, eager, repeats) / len(launches)
    finally:
        for buf in (weights, xs, y):
            buf.free()
    moved = stride + x.nbytes + batch * rows * 4
    return {"kernel": f"matvec_{weight_type}", "rows": rows, "cols": cols, "batch": batch, "weight_bytes": stride,
            "bytes_moved": moved, "rotated_copies": copies, "graph_us": graph_ms * 1e3, "eager_us": eager_ms * 1e3,
            "bandwidth_gbs": moved / (graph_ms / 1e3) / 1e9}


def floor_us(dev, stream, replays: int, repeats: int) -> float:
    one = dev.allocate(4, "scratch")
    try:
        one.fill(0, stream=stream)
        add.launch(dev, stream, one, one, one, 1)  # loads the module before the capture begins
        launches = [lambda s: add.launch(dev, s, one, one, one, 1)] * 1000
        return graph_time_per_launch(dev, stream, launches, replays, repeats) * 1e3
    finally:
        one.free()


def measure(device_spec: str, batches: list[int], rotate_bytes: int, replays: int, repeats: int) -> dict:
    choice = pick_device(device_spec)
    dev = choice.device
    if dev.backend == "cpu":
        raise SystemExit("no GPU: " + "; ".join(choice.reasons))
    try:
        stream = dev.create_stream()
        precompiled = "matvec" in loader.available_code_objects(dev.arch)
        copy_bw = copy_bandwidth(dev, stream, repeats)
        rng = np.random.default_rng(0)
        rows = [measure_case(dev, stream, rng, t, r, c, b, rotate_bytes, replays, repeats)
                for b in batches for (t, r, c) in CASES]
        for row in rows:
            row["fraction_of_copy"] = row["bandwidth_gbs"] * 1e9 / copy_bw
        result = {
            "device": dev.describe(), "backend": dev.backend, "arch": dev.arch,
            "code_objects": "precompiled kernels" if precompiled else "kernels compiled at run time",
            "date": datetime.date.today().isoformat(), "commit": commit(), "repeats": repeats, "replays": replays,
            "copy_bandwidth_gbs": copy_bw / 1e9, "floor_us": floor_us(dev, stream, replays, repeats), "rows": rows,
        }
        loader.forget_device(dev)
        return result
    finally:
        dev.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="auto, hip, cuda (optionally :N); default auto")
    parser.add_argument("--batch", default="1", help="comma-separated batch sizes to measure (default 1)")
    parser.add_argument("--rotate-mib", type=int, default=1024, help="device memory the weight copies fill (default 1024)")
    parser.add_argument("--replays", type=int, default=5, help="graph replays per timed run (default 5)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; the median is shown (default 5)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a markdown table")
    opts = parser.parse_args()
    result = measure(opts.device, [int(b) for b in opts.batch.split(",")], opts.rotate_mib << 20, opts.replays,
                     opts.repeats)
    if opts.json:
        print(json.dumps(result, indent=2))
        return
    print(f"matvec bandwidth on {result['device']} ({result['code_objects']}); {result['date']}, "
          f"commit {result['commit']}, median of {result['repeats']} runs\n")
    print(f"device-to-device copy: {result['copy_bandwidth_gbs']:.0f} GB/s (read + write); "
          f"an empty kernel in a graph: {result['floor_us']:.2f} µs\n")
    print("| kernel | rows x cols | batch | bytes moved | µs per kernel (graph) | µs (eager) | GB/s | % of copy |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in result["rows"]:
        print(f"| {r['kernel']} | {r['rows']} x {r['cols']} | {r['batch']} | {r['bytes_moved'] / 1e6:.2f} MB | "
              f"{r['graph_us']:.2f} | {r['eager_us']:.2f} | {r['bandwidth_gbs']:.0f} | {100 * r['fraction_of_copy']:.0f}% |")


if __name__ == "__main__":
    main()
