"""Time each fused_qmatvec launch kind of a Llama-3.1-8B (or --shape 1b: Llama-3.2-1B) layer in Q4_K_M
(llama.cpp's mix: Q4_K q, k, o, gate, up; Q6_K v, down and the output head) at 1, 2, 4 and 8 tokens, and
print the GB/s of weights each launch reads against the device-to-device copy bandwidth measured in the
same run. --k-split 1,2,4 times each launch at each forced split (default: the launcher's own; only the
residual product and norm+q|k|v+rope at one token split, the column shows the split each launch ran with);
--tile-groups 0,6 likewise forces norm+q|k|v+rope's row groups a tile at one token (0: all of them).

Run from the repository root on a GPU machine, with code objects built for it first (otherwise every
kernel is compiled at run time, which the output says):

    python3 kernels/build.py --amd-targets none --nvidia-targets sm_90 --ops fused_qmatvec,add
    python3 scripts/bench/measure_qmatvec_decode.py                  # markdown table
    python3 scripts/bench/measure_qmatvec_decode.py --json-out q.json --batch 1,8

How it measures (as scripts/bench/measure_matvec.py does, whose helpers it uses): the weights of a kind
are replicated over --rotate-mib of device memory and the timed launches walk the copies, so each launch
reads its weights from DRAM; the launches are captured in one graph, replayed and timed with events.
GB/s = weight bytes of the launch / kernel time (x, g and y are a few KiB); "% of copy" divides it by the
copy's read + write rate. Before timing, the first CHECKED_ROWS rows of every output are checked against
hipcore/ops/fused_qmatvec.py's float64 reference (a miss is reported on stderr, not fatal).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure_matvec import commit, copy_bandwidth, gpu_or_exit, graph_time_per_launch, random_weights  # noqa: E402

from hipcore.ops import fused_qmatvec, fused_qmatvec_geometry  # noqa: E402
from hipcore.ops.weight_formats import row_bytes  # noqa: E402
from hipcore.runtime import kernels as loader  # noqa: E402

# (hidden, ffn, vocab, heads, kv heads, head_dim) per --shape
SHAPES = {"8b": (4096, 14336, 128256, 32, 8, 128), "1b": (2048, 8192, 128256, 32, 8, 64)}
HIDDEN, FFN, VOCAB, HEADS, KV_HEADS, HEAD_DIM = SHAPES["8b"]
EPS, THETA = 1e-5, 500000.0
CHECKED_ROWS = 512
KIND_NAMES = ("norm+q|k|v+rope", "o+residual", "norm+gate|up+swiglu", "down+residual", "norm+head")


def kinds_of_shape() -> dict:
    """kind -> (the matrices it reads as (type, rows, cols), in the launcher's order), for the shape set."""
    return {
        "norm+q|k|v+rope": [("q4_k", HEADS * HEAD_DIM, HIDDEN), ("q4_k", KV_HEADS * HEAD_DIM, HIDDEN),
                            ("q6_k", KV_HEADS * HEAD_DIM, HIDDEN)],
        "o+residual": [("q4_k", HIDDEN, HEADS * HEAD_DIM)],
        "norm+gate|up+swiglu": [("q4_k", FFN, HIDDEN), ("q4_k", FFN, HIDDEN)],
        "down+residual": [("q6_k", HIDDEN, FFN)],
        "norm+head": [("q6_k", VOCAB, HIDDEN)],
    }


KINDS = kinds_of_shape()


class KindRun:
    """The device buffers of one launch kind at one batch, and its launch with the k-th weight copy."""

    def __init__(self, dev, stream, rng, kind: str, batch: int, rotate_bytes: int):
        self.dev, self.kind, self.batch = dev, kind, batch
        self.mats = KINDS[kind]
        self.raws = [random_weights(rng, t, r, c) for t, r, c in self.mats]
        self.cols = self.mats[0][2]
        self.weight_bytes = sum(r * row_bytes(t, c) for t, r, c in self.mats)
        self.copies = max(2, rotate_bytes // self.weight_bytes)
        self.buffers = []
        self.weights = []  # per matrix: its buffer of `copies` replicas
        for (t, r, c), raw in zip(self.mats, self.raws):
            stride = raw.nbytes
            buf = self._alloc(self.copies * stride, "weights")
            buf.upload(raw)
            for k in range(1, self.copies):
                dev.copy_device_to_device(buf, buf, stride, dst_offset=k * stride, stream=stream)
            self.weights.append((buf, stride, t))
        self.x = (rng.standard_normal((batch, self.cols))).astype(np.float32)
        self.g = (1.0 + 0.1 * rng.standard_normal(self.cols)).astype(np.float32)
        self.y0 = rng.standard_normal((batch, self._out_rows())).astype(np.float32)
        self.xs, self.gs = self._alloc(self.x.nbytes), self._alloc(self.g.nbytes)
        self.xs.upload(self.x)
        self.gs.upload(self.g)
        self.positions = np.arange(batch, dtype=np.int32) + 100
        self.pos = self._alloc(max(4, self.positions.nbytes))
        self.pos.upload(self.positions)
        self.outs = [self._alloc(batch * r * 4) for _, r, _ in (self.mats if kind.endswith("rope") else self.mats[:1])]
        stream.synchronize()

    def _alloc(self, nbytes: int, tag: str = "activations"):
        buf = self.dev.allocate(nbytes, tag, label=self.kind)
        self.buffers.append(buf)
        return buf

    def _out_rows(self) -> int:
        return self.mats[0][1]

    def entry(self) -> str:
        return {"norm+q|k|v+rope": "qmatvec_norm_rope", "norm+gate|up+swiglu": "qmatvec_norm_swiglu",
                "norm+head": "qmatvec_norm"}.get(self.kind, "qmatvec_add")

    def matrix_rows(self) -> list[int]:
        return [r for _, r, _ in self.mats] if self.kind.endswith("rope") else [self.mats[0][1]]

    def launch(self, stream, k: int) -> None:
        dev, b, cols = self.dev, self.batch, self.cols
        w = [(buf.addr(k * stride), t) for buf, stride, t in self.weights]
        if self.kind == "norm+q|k|v+rope":
            fused_qmatvec.launch_norm_rope(dev, stream, *self.outs, w, self.xs, self.gs, self.pos,
                                           q_rows=HEADS * HEAD_DIM, kv_rows=KV_HEADS * HEAD_DIM, cols=cols, batch=b,
                                           head_dim=HEAD_DIM, rope_dim=HEAD_DIM, eps=EPS, theta=THETA, freq_scale=1.0)
        elif self.kind == "norm+gate|up+swiglu":
            fused_qmatvec.launch_norm_swiglu(dev, stream, self.outs[0], w, self.xs, self.gs, rows=FFN, cols=cols,
                                             batch=b, eps=EPS)
        elif self.kind == "norm+head":
            fused_qmatvec.launch_norm(dev, stream, self.outs[0], w[0][0], self.xs, self.gs, rows=VOCAB, cols=cols,
                                      batch=b, eps=EPS, weight_type=w[0][1])
        else:
            fused_qmatvec.launch_add(dev, stream, self.outs[0], w[0][0], self.xs, rows=HIDDEN, cols=cols, batch=b,
                                     weight_type=w[0][1])

    def check(self, stream) -> None:
        """The first CHECKED_ROWS rows of each output against the float64 reference; a miss goes to stderr."""
        n = CHECKED_ROWS
        parts = [(raw[:n], t) for raw, (t, _, _) in zip(self.raws, self.mats)]
        if self.kind.endswith("residual"):
            self.outs[0].upload(self.y0)
        self.launch(stream, self.copies - 1)
        stream.synchronize()
        got = [o.download(np.float32).reshape(self.batch, -1)[:, :n] for o in self.outs]
        if self.kind == "norm+q|k|v+rope":
            want = fused_qmatvec.reference_norm_rope(parts, self.x, self.g, EPS, self.positions, n, n, self.cols,
                                                     HEAD_DIM, HEAD_DIM, THETA, 1.0)
        elif self.kind == "norm+gate|up+swiglu":
            want = [fused_qmatvec.reference_norm_swiglu(parts, self.x, self.g, EPS, n, self.cols)]
        elif self.kind == "norm+head":
            want = [fused_qmatvec.reference_norm(*parts[0], self.x, self.g, EPS, n, self.cols)]
        else:
            want = [fused_qmatvec.reference_add(*parts[0], self.x, self.y0[:, :n], n, self.cols)]
        for g, w in zip(got, want):
            worst = float(np.max(np.abs(g - w)) / max(float(np.abs(w).max()), 1e-30))
            if not worst <= 1e-3:
                print(f"warning: {self.kind} batch {self.batch}: worst error {worst:.2e} of max |y|", file=sys.stderr)

    def free(self) -> None:
        for buf in self.buffers:
            buf.free()


def measure(device_spec: str, batches: list[int], kinds: list[str], rotate_bytes: int, replays: int,
            repeats: int, splits: list[int | None], tile_groups: list[int | None]) -> dict:
    dev = gpu_or_exit(device_spec)
    try:
        stream = dev.create_stream()
        precompiled = "fused_qmatvec" in loader.available_code_objects(dev.arch)
        copy_bw = copy_bandwidth(dev, stream, repeats)
        rng = np.random.default_rng(0)
        rows = []
        for kind in kinds:
            for batch in batches:
                for split, groups in [(s, t) for s in splits for t in tile_groups]:
                    mats = KINDS[kind]
                    fused_qmatvec_geometry.FORCED_K_SPLIT = split  # only SPLIT_ENTRIES at one token take it
                    fused_qmatvec_geometry.FORCED_TILE_GROUPS = groups  # only TILE_GROUP_ENTRIES at one token take it
                    run = KindRun(dev, stream, rng, kind, batch, rotate_bytes)
                    try:
                        geo = fused_qmatvec_geometry.geometry(dev.arch, run.entry(), fused_qmatvec.variant(batch), mats[0][2],
                                                     *run.matrix_rows(), multiprocessors=dev.multiprocessors)
                        run.check(stream)
                        launches = [lambda s, k=k: run.launch(s, k) for k in range(run.copies)]
                        ms = graph_time_per_launch(dev, stream, launches, replays, repeats)
                    finally:
                        run.free()
                        fused_qmatvec_geometry.FORCED_K_SPLIT = fused_qmatvec_geometry.FORCED_TILE_GROUPS = None
                    gbs = run.weight_bytes / (ms / 1e3) / 1e9
                    rows.append({"kind": kind, "batch": batch, "weight_bytes": run.weight_bytes, "us": ms * 1e3,
                                 "weight_gbs": gbs, "fraction_of_copy": gbs * 1e9 / copy_bw,
                                 "types": [t for t, _, _ in mats], "k_split": geo.k_split,
                                 "tile_groups": geo.tile_groups, "grid": geo.grid,
                                 "forced": split is not None or groups is not None})
                    print(f"{kind} batch {batch} k_split {geo.k_split} tile_groups {geo.tile_groups} grid {geo.grid}: "
                          f"{ms * 1e3:.2f} us, {gbs:.0f} GB/s", file=sys.stderr)
        result = {"device": dev.describe(), "arch": dev.arch, "date": datetime.date.today().isoformat(),
                  "commit": commit(), "code_objects": "precompiled" if precompiled else "compiled at run time",
                  "copy_bandwidth_gbs": copy_bw / 1e9, "repeats": repeats, "replays": replays, "rows": rows}
        loader.forget_device(dev)
        return result
    finally:
        dev.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="auto, hip, cuda (optionally :N); default auto")
    parser.add_argument("--batch", default="1,2,4,8", help="comma-separated token counts (default 1,2,4,8)")
    parser.add_argument("--kinds", default=",".join(KIND_NAMES), help="comma-separated launch kinds (default: all)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="8b", help="Llama-3.1-8B or Llama-3.2-1B (default 8b)")
    parser.add_argument("--ffn", type=int, default=None, metavar="ROWS",
                        help="gate|up rows (down's columns) instead of the shape's: how a launch's last, partial round "
                             "of tiles costs (14336 rows are 3.39 rounds of 264 workgroups, 12672 three, 16896 four)")
    parser.add_argument("--k-split", default="auto",
                        help="comma-separated k_split values to force, 'auto' for the launcher's (default auto)")
    parser.add_argument("--tile-groups", default="auto",
                        help="comma-separated tile_groups values to force (0: all), 'auto' for the launcher's")
    parser.add_argument("--rotate-mib", type=int, default=1024, help="device memory the weight copies fill")
    parser.add_argument("--replays", type=int, default=3, help="graph replays per timed run (default 3)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; the median is shown (default 5)")
    parser.add_argument("--json-out", type=Path, help="also write the JSON to this file")
    parser.add_argument("--max-workgroups", type=int, default=None,
                        help="a fixed grid cap (default: the launcher's, "
                             f"{fused_qmatvec_geometry.WORKGROUPS_PER_MULTIPROCESSOR} per SM; a large one: a workgroup per tile)")
    opts = parser.parse_args()
    fused_qmatvec_geometry.MAX_WORKGROUPS = opts.max_workgroups
    global HIDDEN, FFN, VOCAB, HEADS, KV_HEADS, HEAD_DIM, KINDS
    HIDDEN, FFN, VOCAB, HEADS, KV_HEADS, HEAD_DIM = SHAPES[opts.shape]
    if opts.ffn is not None:
        if opts.ffn <= 0 or opts.ffn % 256:
            parser.error(f"--ffn must be a positive multiple of 256 (down's K-quant columns), got {opts.ffn}")
        FFN = opts.ffn
    KINDS = kinds_of_shape()
    splits = [None if v == "auto" else int(v) for v in opts.k_split.split(",")]
    tile_groups = [None if v == "auto" else int(v) for v in opts.tile_groups.split(",")]
    kinds = opts.kinds.split(",")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown kind(s) {', '.join(unknown)}; known: {', '.join(KINDS)}")
    result = measure(opts.device, [int(b) for b in opts.batch.split(",")], kinds, opts.rotate_mib << 20, opts.replays,
                     opts.repeats, splits, tile_groups)
    if opts.json_out:
        opts.json_out.write_text(json.dumps(result, indent=2))
    shape = {"8b": "Llama-3.1-8B", "1b": "Llama-3.2-1B"}[opts.shape] + (f" (ffn {FFN})" if opts.ffn else "")
    print(f"fused_qmatvec launches, {shape} Q4_K_M shapes, on {result['device']} ({result['code_objects']}); "
          f"{result['date']}, commit {result['commit']}; at most {opts.max_workgroups} workgroups\n")
    print(f"device-to-device copy: {result['copy_bandwidth_gbs']:.0f} GB/s (read + write)\n")
    print("| launch | weights | batch | k_split | tile groups | grid | MB read | µs | GB/s of weights | % of copy |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in result["rows"]:
        split = f"{r['k_split']}" + ("" if r["forced"] else " (launcher)")
        print(f"| {r['kind']} | {'+'.join(r['types'])} | {r['batch']} | {split} | {r['tile_groups'] or 'all'} | "
              f"{r['grid']} | {r['weight_bytes'] / 1e6:.1f} | {r['us']:.2f} | {r['weight_gbs']:.0f} | "
              f"{100 * r['fraction_of_copy']:.0f}% |")


if __name__ == "__main__":
    main()
