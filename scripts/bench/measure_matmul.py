"""Prompt-evaluation products on a GPU: the matmul kernel against batched matvec at the demo model's
shapes, per layer, per tile shape, and the token count where matmul starts to win, as markdown tables
for docs/benchmarks.md.

Run from the repository root on a GPU machine (the project need not be installed):

    python3 scripts/bench/measure_matmul.py              # markdown tables on stdout
    python3 scripts/bench/measure_matmul.py --json       # the same figures as JSON
    python3 scripts/bench/measure_matmul.py --quick      # 512 tokens only, fewer repeats
    bash scripts/bench/run_matmul_checks.sh              # the GPU tests of matvec/matmul, then this

How it measures:
- the shapes: SmolLM2-135M's seven projections of a layer (q 576x576, k and v 192x576, o 576x576,
  gate and up 1536x576, down 576x1536, all Q4_1) at 128, 512 and 2048 tokens, and its Q8_0 output head
  (49152x576) in the crossover sweep;
- the weights are replicated in --rotate-mib of device memory (default 256 MiB, several times the L2 of
  an H100 or H200) and the timed launches walk the copies in turn, so that weights come from DRAM as
  they do in a forward pass; x and y stay the same (in a forward pass they were just written);
- the launches are captured in one graph, replayed, and timed with events: GPU time per kernel,
  without Python's launch cost. The median of --repeats runs is shown;
- matmul with the launcher's tile choice, and with each tile shape (16, 32, 64 tokens) forced, to check
  the launcher's choice; matvec with the same batch (it passes over W once per 8 tokens);
- TFLOP/s = 2 * tokens * rows * cols / time;
- "layer" = the seven projections of one layer; x 30 layers = all projections of a prompt, and the
  prompt tokens/s that those alone would allow (issue 6's target: pp512 >= 48,000 tokens/s, i.e.
  10.7 ms per 512-token prompt for everything);
- crossover: tokens 1..64 for three shapes, matvec against matmul: the smallest token count from which
  matmul is faster at every larger count measured (hipcore/ops/matmul.py MATVEC_MAX_TOKENS should be one
  less).
Every (shape, tokens) output of both kernels is first checked against the numpy reference.
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
sys.path.insert(0, str(REPO / "tests"))

from profiles.bench import source_commit as commit  # noqa: E402
from hipcore.ops import matmul, matvec  # noqa: E402
from hipcore.ops.weight_formats import row_bytes  # noqa: E402
from hipcore.runtime import kernels as loader  # noqa: E402
from hipcore.runtime.selection import pick_device  # noqa: E402
from support.weight_samples import random_weights  # noqa: E402

LAYERS = 30  # SmolLM2-135M
# (name, weight type, rows, cols) of one layer's projections.
LAYER = [("q", "q4_1", 576, 576), ("k", "q4_1", 192, 576), ("v", "q4_1", 192, 576), ("o", "q4_1", 576, 576),
         ("gate", "q4_1", 1536, 576), ("up", "q4_1", 1536, 576), ("down", "q4_1", 576, 1536)]
CROSSOVER_SHAPES = [("gate", "q4_1", 1536, 576), ("down", "q4_1", 576, 1536), ("head", "q8_0", 49152, 576)]
CROSSOVER_TOKENS = [1, 2, 4, 8, 9, 12, 16, 24, 32, 48, 64]
MAX_LAUNCHES = 64  # launches per captured graph (each on its own copy of the weights)


class Bench:
    """One device, one stream, and the timing of captured launches."""

    def __init__(self, dev, rotate_bytes: int, replays: int, repeats: int):
        self.dev, self.rotate_bytes, self.replays, self.repeats = dev, rotate_bytes, replays, repeats
        self.stream = dev.create_stream()
        self.rng = np.random.default_rng(0)

    def timed_ms(self, fn) -> float:
        """Median over the repeats of the event-timed milliseconds of fn() on the stream."""
        start, end = self.dev.create_event(), self.dev.create_event()
        times = []
        for _ in range(self.repeats):
            start.record(self.stream)
            fn()
            end.record(self.stream)
            end.synchronize()
            times.append(start.elapsed_ms(end))
        return statistics.median(times)

    def graph_us(self, launches) -> float:
        """Microseconds of GPU time per launch of `launches` (callables taking a stream) in a graph."""
        with self.dev.capture(self.stream) as cap:
            for launch in launches:
                launch(self.stream)
        graph = cap.graph
        try:
            graph.launch(self.stream)  # warm up
            self.stream.synchronize()

            def run() -> None:
                for _ in range(self.replays):
                    graph.launch(self.stream)
            return self.timed_ms(run) * 1e3 / (self.replays * len(launches))
        finally:
            graph.destroy()

    def shape(self, weight_type: str, rows: int, cols: int, n_tokens: int, kernels: dict) -> dict:
        """{kernel label: µs per launch} for y[n_tokens, rows] = x @ W^T with each of `kernels`
        (label -> launch(dev, stream, y, w, x) callable), every result checked first."""
        dev, stream = self.dev, self.stream
        stride = rows * row_bytes(weight_type, cols)
        copies = max(2, min(MAX_LAUNCHES, self.rotate_bytes // stride))
        raw = random_weights(self.rng, weight_type, rows, cols)
        x = self.rng.standard_normal((n_tokens, cols)).astype(np.float32)
        weights = dev.allocate(copies * stride, "weights", label=f"{weight_type} {rows}x{cols} x{copies}")
        xs = dev.allocate(x.nbytes, "activations", label="x")
        y = dev.allocate(n_tokens * rows * 4, "activations", label="y")
        try:
            weights.upload(raw)
            for k in range(1, copies):
                dev.copy_device_to_device(weights, weights, stride, dst_offset=k * stride, stream=stream)
            xs.upload(x)
            stream.synchronize()
            want = matmul.reference(raw, weight_type, x, rows, cols)
            bound = matmul.error_bound(raw, weight_type, x, rows, cols)
            times = {}
            for label, launch in kernels.items():
                y.fill(0xFF, stream=stream)
                launch(dev, stream, y, weights.addr(stride * (copies - 1)), xs)  # also loads the module
                stream.synchronize()  # a download orders only after the default stream's work
                got = y.download(np.float32).reshape(n_tokens, rows)
                if not np.all(np.abs(got - want) <= bound):
                    raise SystemExit(f"{label} {weight_type} {rows}x{cols} at {n_tokens} tokens gives wrong results")
                times[label] = self.graph_us([
                    (lambda s, k=k, launch=launch: launch(dev, s, y, weights.addr(k * stride), xs)) for k in range(copies)
                ])
            return times
        finally:
            for buf in (weights, xs, y):
                buf.free()


def product_kernels(weight_type: str, rows: int, cols: int, n_tokens: int, tiles: bool) -> dict:
    def use_matmul(tile):
        return lambda dev, s, y, w, x: matmul.launch(dev, s, y, w, x, rows, cols, n_tokens, weight_type=weight_type,
                                                     tile_tokens=tile)
    kernels = {"matmul": use_matmul(None)}
    if tiles:
        kernels.update({f"matmul/{t}": use_matmul(t) for t in matmul.TILE_TOKENS})
    kernels["matvec"] = lambda dev, s, y, w, x: matvec.launch(dev, s, y, w, x, rows, cols, n_tokens,
                                                              weight_type=weight_type)
    return kernels


def tflops(n_tokens: int, rows: int, cols: int, us: float) -> float:
    return 2 * n_tokens * rows * cols / (us * 1e-6) / 1e12


def measure(device_spec: str, token_counts: list[int], crossover: bool, rotate_bytes: int, replays: int,
            repeats: int) -> dict:
    choice = pick_device(device_spec)
    dev = choice.device
    if dev.backend == "cpu":
        raise SystemExit("no GPU: " + "; ".join(choice.reasons))
    try:
        bench = Bench(dev, rotate_bytes, replays, repeats)
        precompiled = {"matmul", "matvec"} <= set(loader.available_code_objects(dev.arch))
        shapes = []
        for n in token_counts:
            for name, weight_type, rows, cols in LAYER:
                times = bench.shape(weight_type, rows, cols, n, product_kernels(weight_type, rows, cols, n, tiles=True))
                shapes.append({"tokens": n, "name": name, "type": weight_type, "rows": rows, "cols": cols,
                               "tile": matmul.geometry(rows, n)[2], "us": times,
                               "tflops": tflops(n, rows, cols, times["matmul"])})
        layers = []
        for n in token_counts:
            rows_n = [s for s in shapes if s["tokens"] == n]
            flops = sum(2 * n * s["rows"] * s["cols"] for s in rows_n)
            mm, mv = sum(s["us"]["matmul"] for s in rows_n), sum(s["us"]["matvec"] for s in rows_n)
            best = sum(min(v for k, v in s["us"].items() if k.startswith("matmul/")) for s in rows_n)
            layers.append({"tokens": n, "matmul_us": mm, "best_tiles_us": best, "matvec_us": mv,
                           "tflops": flops / (mm * 1e-6) / 1e12, "model_ms": LAYERS * mm / 1e3,
                           "tokens_per_s": n / (LAYERS * mm * 1e-6)})
        sweep = []
        if crossover:
            for name, weight_type, rows, cols in CROSSOVER_SHAPES:
                for n in CROSSOVER_TOKENS:
                    times = bench.shape(weight_type, rows, cols, n, product_kernels(weight_type, rows, cols, n, tiles=False))
                    sweep.append({"name": name, "type": weight_type, "rows": rows, "cols": cols, "tokens": n,
                                  "matmul_us": times["matmul"], "matvec_us": times["matvec"]})
        result = {
            "device": dev.describe(), "backend": dev.backend, "arch": dev.arch,
            "code_objects": "precompiled kernels" if precompiled else "kernels compiled at run time",
            "date": datetime.date.today().isoformat(), "commit": commit(), "repeats": repeats, "replays": replays,
            "matvec_max_tokens": matmul.MATVEC_MAX_TOKENS, "shapes": shapes, "layers": layers, "crossover": sweep,
            "crossover_from": crossover_points(sweep),
        }
        loader.forget_device(dev)
        return result
    finally:
        dev.close()


def crossover_points(sweep: list[dict]) -> dict:
    """shape name -> the smallest token count from which matmul beats matvec at every larger count
    measured (None when it never does)."""
    points = {}
    for name in dict.fromkeys(r["name"] for r in sweep):
        rows = sorted((r for r in sweep if r["name"] == name), key=lambda r: r["tokens"])
        point = None
        for r in reversed(rows):
            if r["matmul_us"] >= r["matvec_us"]:
                break
            point = r["tokens"]
        points[name] = point
    return points


def render(result: dict) -> str:
    out = [f"Prompt-evaluation products on {result['device']} ({result['code_objects']}); {result['date']}, "
           f"commit {result['commit']}, median of {result['repeats']} runs of {result['replays']} graph replays; "
           "weights from DRAM (rotated copies)\n"]
    out.append("| tokens | projection | type | rows x cols | tile | matmul µs | TFLOP/s | tile 16 / 32 / 64 µs | "
               "matvec µs | matvec / matmul |")
    out.append("| ---: | --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: |")
    for s in result["shapes"]:
        us = s["us"]
        tiles = " / ".join(f"{us[f'matmul/{t}']:.1f}" for t in matmul.TILE_TOKENS)
        out.append(f"| {s['tokens']} | {s['name']} | {s['type']} | {s['rows']} x {s['cols']} | {s['tile']} | "
                   f"{us['matmul']:.1f} | {s['tflops']:.1f} | {tiles} | {us['matvec']:.1f} | "
                   f"{us['matvec'] / us['matmul']:.1f}x |")
    out.append(f"\nOne layer's seven projections, and all {LAYERS} layers' (projections only):\n")
    out.append("| tokens | matmul µs / layer | with the best tile each | matvec µs / layer | TFLOP/s | "
               f"{LAYERS} layers ms | tokens/s (projections only) |")
    out.append("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in result["layers"]:
        out.append(f"| {r['tokens']} | {r['matmul_us']:.1f} | {r['best_tiles_us']:.1f} | {r['matvec_us']:.1f} | "
                   f"{r['tflops']:.1f} | {r['model_ms']:.2f} | {r['tokens_per_s']:,.0f} |")
    if result["crossover"]:
        out.append("\nCrossover (µs per product, matvec / matmul):\n")
        tokens = sorted({r["tokens"] for r in result["crossover"]})
        out.append("| shape | " + " | ".join(str(n) for n in tokens) + " | matmul wins from |")
        out.append("| --- | " + " | ".join("---:" for _ in tokens) + " | ---: |")
        for name, point in result["crossover_from"].items():
            cells = {r["tokens"]: r for r in result["crossover"] if r["name"] == name}
            first = next(iter(cells.values()))
            out.append(f"| {name} {first['type']} {first['rows']}x{first['cols']} | " + " | ".join(
                f"{cells[n]['matvec_us']:.1f} / {cells[n]['matmul_us']:.1f}" for n in tokens) +
                f" | {point if point is not None else 'never'} |")
        out.append(f"\nproject() takes matmul above {result['matvec_max_tokens']} tokens "
                   "(hipcore/ops/matmul.py MATVEC_MAX_TOKENS).")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="auto, hip, cuda (optionally :N); default auto")
    parser.add_argument("--tokens", default="128,512,2048", help="comma-separated prompt lengths (default 128,512,2048)")
    parser.add_argument("--no-crossover", action="store_true", help="skip the 1..64-token crossover sweep")
    parser.add_argument("--quick", action="store_true", help="512 tokens only, 3 repeats (about a minute)")
    parser.add_argument("--rotate-mib", type=int, default=256, help="device memory the weight copies fill (default 256)")
    parser.add_argument("--replays", type=int, default=3, help="graph replays per timed run (default 3)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; the median is shown (default 5)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of markdown tables")
    parser.add_argument("--json-out", type=Path, help="also write the figures as JSON to this file")
    opts = parser.parse_args()
    tokens = [512] if opts.quick else [int(n) for n in opts.tokens.split(",")]
    result = measure(opts.device, tokens, not opts.no_crossover, opts.rotate_mib << 20, opts.replays,
                     3 if opts.quick else opts.repeats)
    if opts.json_out:
        opts.json_out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2) if opts.json else render(result))


if __name__ == "__main__":
    main()
