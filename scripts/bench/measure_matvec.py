"""Achieved memory bandwidth of the decode products (matvec, and qmatvec on int8-quantized activations)
at the demo model's or Llama-3.1-8B's shapes, against the card's measured device-to-device copy
bandwidth, as a table for docs/benchmarks.md.

Run from the repository root on a GPU machine (the project need not be installed):

    python3 scripts/bench/measure_matvec.py            # markdown table on stdout
    python3 scripts/bench/measure_matvec.py --json     # the same figures as JSON
    python3 scripts/bench/measure_matvec.py --shapes llama8b --batch 1,2,4,8   # every K-quant and Q8_0 / Q4_0
        type on the 8B shapes (4096x4096, 1024x4096, 14336x4096, 4096x14336), matvec beside qmatvec
    python3 scripts/bench/measure_matvec.py --shapes llama8b --types mxfp4,q4_0,f16 --batch 1,4,8   # a dense MXFP4
        matrix on qmatvec beside Q4_0's, and matvec on the F16 it was converted to before it had kernels

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
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from profiles.bench import source_commit as commit  # noqa: E402
from hipcore.ops import add, matvec, qmatvec  # noqa: E402
from hipcore.ops.weight_formats import BLOCK_BYTES, BLOCK_ELEMENTS  # noqa: E402
from hipcore.runtime import kernels as loader  # noqa: E402
from hipcore.runtime.selection import pick_device  # noqa: E402

# (weight type, rows, cols): SmolLM2-135M's ffn up/gate, ffn down, and output (tied embedding) matrices.
CASES = [("q4_1", 1536, 576), ("q4_1", 576, 1536), ("q8_0", 49152, 576)]
# Llama-3.1-8B: q and o (4096 x 4096), k and v (1024 x 4096), gate and up (14336 x 4096), down (4096 x 14336).
LLAMA8B_SHAPES = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)]
LLAMA8B_TYPES = ("q4_k", "q6_k", "q5_k", "q8_0", "q4_0")
# Byte offsets and sizes of the f16 scales that must be finite and small (d, and m / dmin) per format.
SCALE_OFFSETS = {"q4_0": (0,), "q4_1": (0, 2), "q8_0": (0,), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,), "mxfp4": ()}
SCALE_SIZE = {"q4_0": 0.02, "q4_1": 0.02, "q8_0": 0.02, "q4_k": 0.002, "q5_k": 0.002, "q6_k": 0.0005}
CHECKED_ROWS = 512  # rows of each matrix checked against the numpy reference (all of a small one)
COPY_BYTES = 1 << 30


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
    """Raw blocks [rows, row_bytes]: random codes and sub-block scales with finite, small f16 scales (MXFP4: E8M0
    scale bytes for 2^-10 .. 2^-4; F16: normal values of 0.02)."""
    if weight_type == "f16":
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float16).view(np.uint8)
    blocks = rng.integers(0, 256, (rows, cols // BLOCK_ELEMENTS[weight_type], BLOCK_BYTES[weight_type]), dtype=np.uint8)
    if weight_type == "mxfp4":
        blocks[..., 0] = rng.integers(118, 125, blocks.shape[:2], dtype=np.uint8)
    for offset in SCALE_OFFSETS[weight_type]:
        scale = (rng.standard_normal((rows, blocks.shape[1], 1)) * SCALE_SIZE[weight_type]).astype(np.float16)
        blocks[..., offset:offset + 2] = scale.view(np.uint8)
    return blocks.reshape(rows, -1)


def check_result(op, weight_type: str, got: np.ndarray, raw: np.ndarray, x: np.ndarray, rows: int, cols: int) -> None:
    """The first CHECKED_ROWS rows of got against the op's numpy reference (within its float32 bound)."""
    n = min(rows, CHECKED_ROWS)
    part = raw[:n]
    if op is qmatvec:
        want, bound = qmatvec.reference(part, weight_type, x, n, cols), qmatvec.error_bound(part, weight_type, x, n, cols)
    else:
        want = matvec.reference(part, weight_type, x, n, cols)
        bound = (cols + 2) * 2.0**-24 * (np.abs(x.astype(np.float64))
                                        @ np.abs(matvec.dequantize_rows(part, weight_type, cols, np.float64)).T) + 1e-30
    if not np.all(np.abs(got[:, :n] - want) <= bound):
        # Reported, not fatal: matvec's float32 bound here counts |w| only, which Q4_K / Q5_K rows whose
        # d * sc * q and dmin * m nearly cancel can exceed (tests/gpu holds every kernel to its own bound).
        worst = float(np.max(np.abs(got[:, :n] - want) / np.maximum(np.abs(want).max(), 1e-30)))
        print(f"warning: {op.OP}_{weight_type} {rows}x{cols} off the float32 bound; worst error {worst:.2e} of max |y|",
              file=sys.stderr)


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


def measure_case(dev, stream, rng, op, weight_type: str, rows: int, cols: int, batch: int, rotate_bytes: int,
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
        op.launch(dev, stream, y, weights.addr(stride * (copies - 1)), xs, rows, cols, batch, weight_type=weight_type)
        stream.synchronize()  # download waits for the default stream's work, not this stream's
        check_result(op, weight_type, y.download(np.float32).reshape(batch, rows), raw, x, rows, cols)

        launches = [
            (lambda s, k=k: op.launch(dev, s, y, weights.addr(k * stride), xs, rows, cols, batch, weight_type=weight_type))
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
    return {"kernel": f"{op.OP}_{weight_type}", "rows": rows, "cols": cols, "batch": batch, "weight_bytes": stride,
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


def cases(shapes: str, batches: list[int], types: tuple[str, ...]) -> list[tuple]:
    """(op, weight type, rows, cols, batch) of each measurement."""
    if shapes == "demo":
        return [(matvec, t, r, c, b) for b in batches for (t, r, c) in CASES]
    return [(op, t, r, c, b) for t in types for (r, c) in LLAMA8B_SHAPES for b in batches for op in (matvec, qmatvec)
            if t in op.WEIGHT_TYPES]  # MXFP4: qmatvec alone; F16: matvec alone


def gpu_or_exit(device_spec: str):
    """The device `device_spec` picks; exits saying why when that is no GPU (these scripts time kernels)."""
    choice = pick_device(device_spec)
    if choice.device.backend == "cpu":
        choice.device.close()
        raise SystemExit("no GPU: " + "; ".join(choice.reasons))
    return choice.device


def measure(device_spec: str, shapes: str, batches: list[int], rotate_bytes: int, replays: int, repeats: int,
            types: tuple[str, ...] = LLAMA8B_TYPES) -> dict:
    dev = gpu_or_exit(device_spec)
    try:
        stream = dev.create_stream()
        precompiled = "matvec" in loader.available_code_objects(dev.arch)
        copy_bw = copy_bandwidth(dev, stream, repeats)
        rng = np.random.default_rng(0)
        rows = []
        for op, t, r, c, b in cases(shapes, batches, types):
            rows.append(measure_case(dev, stream, rng, op, t, r, c, b, rotate_bytes, replays, repeats))
            print(f"{rows[-1]['kernel']} {r}x{c} batch {b}: {rows[-1]['bandwidth_gbs']:.0f} GB/s", file=sys.stderr)
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
    parser.add_argument("--shapes", default="demo", choices=("demo", "llama8b"),
                        help="demo: SmolLM2-135M's matrices (matvec); llama8b: Llama-3.1-8B's, matvec and qmatvec")
    parser.add_argument("--types", default=",".join(LLAMA8B_TYPES), help="with --shapes llama8b: the weight types")
    parser.add_argument("--json-out", type=Path, help="also write the JSON to this file")
    parser.add_argument("--rotate-mib", type=int, default=1024, help="device memory the weight copies fill (default 1024)")
    parser.add_argument("--replays", type=int, default=5, help="graph replays per timed run (default 5)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; the median is shown (default 5)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a markdown table")
    opts = parser.parse_args()
    result = measure(opts.device, opts.shapes, [int(b) for b in opts.batch.split(",")], opts.rotate_mib << 20,
                     opts.replays, opts.repeats, tuple(opts.types.split(",")))
    if opts.json_out:
        opts.json_out.write_text(json.dumps(result, indent=2))
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
