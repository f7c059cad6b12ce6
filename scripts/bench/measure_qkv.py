"""A decode batch's attention input on a GPU: q, k and v as three matmul_mma launches against one
matmul_mma_qkv.launch_qkv, on gpt-oss-20b's shapes (Q8_0 q 4096 x 2880, k and v 512 x 2880) and Llama-3.1-8B's
(Q4_K q 4096 x 4096, k 1024 x 4096, Q6_K v), as a markdown table (µs a step, GB/s of the three weights).

    python3 scripts/bench/measure_qkv.py [--tokens 8,32] [--shapes gpt-oss-20b,llama-3.1-8b] [--json-out PATH]

Timing as scripts/bench/measure_matmul.py's Bench: weights rotated through 256 MiB of copies (from DRAM, as in a
forward pass), launches captured in a graph and timed with events, median of the repeats. Both ways' outputs are
first checked against the numpy reference within matmul_mma's error bound.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure_matmul import Bench, commit  # noqa: E402

from hipcore.ops import fused_matmul, matmul_mma, matmul_mma_qkv  # noqa: E402
from hipcore.ops.weight_formats import row_bytes  # noqa: E402
from hipcore.runtime.selection import pick_device  # noqa: E402
from support.weight_samples import random_weights  # noqa: E402

SHAPES = {"gpt-oss-20b": (("q8_0",) * 3, (4096, 512, 512), 2880),
          "llama-3.1-8b": (("q4_k", "q4_k", "q6_k"), (4096, 1024, 1024), 4096)}


def measure(bench: Bench, types, rows, cols, n_tokens, workspace) -> dict:
    dev, stream = bench.dev, bench.stream
    strides = [r * row_bytes(t, cols) for t, r in zip(types, rows)]
    stride = sum(strides)
    copies = max(2, min(64, bench.rotate_bytes // stride))
    raws = [random_weights(bench.rng, t, r, cols) for t, r in zip(types, rows)]
    x = bench.rng.standard_normal((n_tokens, cols)).astype(np.float32)
    weights = dev.allocate(copies * stride, "weights", label="w")
    xs = dev.allocate(x.nbytes, "activations", label="x")
    ys = [dev.allocate(n_tokens * r * 4, "activations", label=f"y{i}") for i, r in enumerate(rows)]
    try:
        weights.upload(np.concatenate([raw.reshape(-1) for raw in raws]))
        for k in range(1, copies):
            dev.copy_device_to_device(weights, weights, stride, dst_offset=k * stride, stream=stream)
        xs.upload(x)
        stream.synchronize()

        def addrs(copy: int) -> tuple:
            base = copy * stride
            return tuple(weights.addr(base + sum(strides[:i])) for i in range(3))

        def three(s, copy: int) -> None:
            for y, w, t, r in zip(ys, addrs(copy), types, rows):
                matmul_mma.launch(dev, s, y, w, xs, r, cols, n_tokens, weight_type=t, workspace=workspace)

        def one(s, copy: int) -> None:
            matmul_mma_qkv.launch_qkv(dev, s, tuple(ys), addrs(copy), xs, rows, cols, n_tokens, weight_types=types,
                                      workspace=workspace)

        times = {}
        for label, launch in (("three launches", three), ("one launch", one)):
            for y in ys:
                y.fill(0xFF, stream=stream)
            launch(stream, copies - 1)
            stream.synchronize()
            for y, raw, t, r in zip(ys, raws, types, rows):
                got = y.download(np.float32).reshape(n_tokens, r)
                if not np.all(np.abs(got - matmul_mma.reference(raw, t, x, r, cols))
                              <= matmul_mma.error_bound(raw, t, x, r, cols)):
                    raise SystemExit(f"{label}: {t} {r}x{cols} at {n_tokens} tokens gives wrong results")
            times[label] = bench.graph_us([(lambda s, k=k, launch=launch: launch(s, k)) for k in range(copies)])
        return {"us": times, "bytes": stride}
    finally:
        for buf in (weights, xs, *ys):
            buf.free()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="8,32", help="comma-separated token counts (default 8,32)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--json-out", help="also write the rows as JSON here")
    args = ap.parse_args()
    dev = pick_device("auto").device
    bench = Bench(dev, 256 << 20, 10, 5)
    workspace = dev.allocate(fused_matmul.WORKSPACE_BYTES, "scratch", label="matmul_workspace")  # the runner's
    workspace.fill(0)
    print(f"{dev.name if hasattr(dev, 'name') else dev.arch}, commit {commit()}, {datetime.date.today()}\n")
    print("| shape | types | tokens | three launches µs | one launch µs | GB/s (one) | speed-up |")
    print("|---|---|---:|---:|---:|---:|---:|")
    rows_out = []
    for shape in [s for s in args.shapes.split(",") if s]:
        types, rows, cols = SHAPES[shape]
        for n in [int(v) for v in args.tokens.split(",")]:
            if not matmul_mma_qkv.takes_types(types) or not all(
                    matmul_mma.has_fragment_path(dev.arch, t, 32, cols) for t in types):
                raise SystemExit(f"{dev.arch}: no one-launch q|k|v for {types} of {cols} columns")
            r = measure(bench, types, rows, cols, n, workspace)
            three, one = r["us"]["three launches"], r["us"]["one launch"]
            print(f"| {shape} | {'/'.join(types)} | {n} | {three:.1f} | {one:.1f} | {r['bytes'] / one / 1e3:.0f} | "
                  f"{three / one:.2f}x |")
            rows_out.append({"shape": shape, "types": types, "tokens": n, **r})
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows_out, indent=2))


if __name__ == "__main__":
    main()
