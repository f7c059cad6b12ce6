"""Prompt and batched-decode products of K-quant models on a GPU: matmul_mma (matrix cores) with its
columns split over workgroups (the launcher's choice, a workspace as the runner has) against the same
kernel whole, on the Llama-3.1-8B shapes (q/o 4096x4096 and k 1024x4096 Q4_K, v 1024x4096 Q6_K, gate/up
14336x4096 Q4_K, down 4096x14336 Q6_K) at 8 to 512 tokens, as a markdown table (µs, GB/s of weights,
TFLOP/s = 2 tokens rows cols / time) for docs/benchmarks.md.

    python3 scripts/bench/measure_matmul_mma.py [--quick] [--tokens 8,32] [--shapes q/o,head] [--split-only]
                                              [--paths shared,staged,direct] [--json-out PATH]

Timing as scripts/bench/measure_matmul.py's Bench: weights rotated through 256 MiB of copies (from DRAM, as
in a forward pass), launches captured in a graph and timed with events, median of the repeats. Every
kernel's output is first checked against the numpy reference within its error bound.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure_matmul import REPO, Bench, commit, tflops  # noqa: E402

from hipcore.ops import fused_matmul, matmul, matmul_mma  # noqa: E402
from hipcore.ops.weight_formats import row_bytes  # noqa: E402
from hipcore.runtime.kernels import current_object  # noqa: E402
from hipcore.runtime.selection import pick_device  # noqa: E402
from support.weight_samples import random_weights  # noqa: E402

SHAPES = [("q/o", "q4_k", 4096, 4096), ("k", "q4_k", 1024, 4096), ("v", "q6_k", 1024, 4096),
          ("gate/up", "q4_k", 14336, 4096), ("down", "q6_k", 4096, 14336)]
TOKENS = [8, 16, 32, 64, 512]
HEAD = ("head", "q6_k", 128256, 4096)  # Llama 3's output projection: only with --shapes (its reference is slow)
# Llama-3.2-1B's Q6_K products, only with --shapes.
EXTRA = [HEAD, ("v-1b", "q6_k", 512, 2048), ("down-1b", "q6_k", 2048, 8192)]
BOUNDS = {"matmul_mma": matmul_mma.error_bound}


class MmaBench(Bench):
    def shape(self, weight_type, rows, cols, n_tokens, kernels):
        dev, stream = self.dev, self.stream
        stride = rows * row_bytes(weight_type, cols)
        copies = max(2, min(64, self.rotate_bytes // stride))
        raw = random_weights(self.rng, weight_type, rows, cols)
        x = self.rng.standard_normal((n_tokens, cols)).astype(np.float32)
        weights = dev.allocate(copies * stride, "weights", label="w")
        xs, y = dev.allocate(x.nbytes, "activations", label="x"), dev.allocate(n_tokens * rows * 4, "activations", label="y")
        try:
            weights.upload(raw)
            for k in range(1, copies):
                dev.copy_device_to_device(weights, weights, stride, dst_offset=k * stride, stream=stream)
            xs.upload(x)
            stream.synchronize()
            want = matmul.reference(raw, weight_type, x, rows, cols)
            times = {}
            for label, launch in kernels.items():
                y.fill(0xFF, stream=stream)
                launch(dev, stream, y, weights.addr(stride * (copies - 1)), xs)
                stream.synchronize()
                got = y.download(np.float32).reshape(n_tokens, rows)
                if not np.all(np.abs(got - want) <= BOUNDS[label.split("/")[0]](raw, weight_type, x, rows, cols)):
                    raise SystemExit(f"{label} {weight_type} {rows}x{cols} at {n_tokens} tokens gives wrong results")
                times[label] = self.graph_us([(lambda s, k=k, launch=launch: launch(dev, s, y, weights.addr(k * stride), xs))
                                              for k in range(copies)])
            return times
        finally:
            for buf in (weights, xs, y):
                buf.free()


def kernels(weight_type, rows, cols, n, workspace, split_only=False, paths=None):
    """The launcher's choice ("split"), and beside it the same kernel unsplit ("whole"); with `paths`, each of
    matmul_mma.PATHS named there instead of "whole", split as the launcher splits (the fragment path's entries
    where the device has them)."""
    def mma(ws, path="auto"):
        return lambda d, s, y, w, x: matmul_mma.launch(d, s, y, w, x, rows, cols, n, weight_type=weight_type,
                                                       workspace=ws, path=path)
    chosen = {"matmul_mma/split": mma(workspace)}
    if split_only:
        return chosen
    if paths:
        return {**{f"matmul_mma/{p}": mma(workspace, p) for p in paths}, **chosen}
    return {"matmul_mma/whole": mma(None), **chosen}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json-out")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="comma-separated token counts")
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES),
                    help=f"comma-separated products of {', '.join(s[0] for s in SHAPES + EXTRA)}")
    ap.add_argument("--split-only", action="store_true", help="time only the launcher's choice (no whole column range)")
    ap.add_argument("--paths", default=None, metavar="LIST",
                    help="beside the launcher's choice, these of shared, staged, direct (matmul_mma.PATHS), split "
                         "the same way, in place of the whole column range (K-quant decode batches on NVIDIA); the "
                         "speed-up is the first one's time over the launcher's")
    args = ap.parse_args()
    dev = pick_device("auto").device
    bench = MmaBench(dev, 256 << 20, 3 if args.quick else 10, 3 if args.quick else 5)
    rows_out = []
    workspace = dev.allocate(fused_matmul.WORKSPACE_BYTES, "scratch", label="matmul_workspace")  # the runner's
    workspace.fill(0)
    print(f"{dev.describe() if hasattr(dev, 'describe') else dev.arch}, commit {commit()}, {datetime.date.today()}")
    # A variant measured from a copied tree whose prebuilt object was built from another source runs compiled
    # at run time (nvrtc / hiprtc), which can be far slower than the prebuilt compiler's: say which it is.
    if dev.arch != "cpu":
        prebuilt = current_object(dev.arch, "matmul_mma")
        print(f"matmul_mma object: {prebuilt or 'no prebuilt one from these sources: compiled at run time'}")
    print()
    paths = [p for p in args.paths.split(",") if p] if args.paths else []
    others = [f"{p} µs" for p in paths] or ["whole µs"]
    print(f"| product | type | rows x cols | tokens | splits | {' | '.join(others)} | launcher µs | GB/s of weights | "
          f"TFLOP/s | speed-up |")
    print("|---|---|---|---:|---:|" + "---:|" * len(others) + "---:|---:|---:|---:|")
    chosen = args.shapes.split(",")
    for name, wt, rows, cols in [s for s in SHAPES + EXTRA if s[0] in chosen]:
        for n in [int(v) for v in args.tokens.split(",")]:
            t = bench.shape(wt, rows, cols, n, kernels(wt, rows, cols, n, workspace, args.split_only, paths))
            splits = matmul_mma.geometry(rows, n, cols=cols, workspace_bytes=workspace.nbytes,
                                         step=matmul_mma.step_cols(wt))[3]
            split = t["matmul_mma/split"]
            other = [t.get(f"matmul_mma/{p}", float("nan")) for p in paths] or [t.get("matmul_mma/whole", float("nan"))]
            gbs = rows * row_bytes(wt, cols) / split / 1e3
            rows_out.append({"product": name, "type": wt, "rows": rows, "cols": cols, "tokens": n, "splits": splits,
                             "us": t})
            print(f"| {name} | {wt} | {rows}x{cols} | {n} | {splits} | {' | '.join(f'{v:.1f}' for v in other)} | "
                  f"{split:.1f} | {gbs:.0f} | {tflops(n, rows, cols, split):.1f} | {other[0] / split:.2f}x |", flush=True)
    workspace.free()
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"device": dev.arch, "commit": commit(), "rows": rows_out}, indent=1))


if __name__ == "__main__":
    main()
