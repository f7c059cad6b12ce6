"""The mixture-of-experts decode products (moe_experts' gate|up and down, moe_route) at Qwen3-30B-A3B's and
gpt-oss-20b's shapes: GPU time per launch, the bytes of the selected experts' weights each launch reads, and
GB/s against the card's device-to-device copy bandwidth measured in the same run.

Run from the repository root on a GPU machine, with code objects built for it first (otherwise the kernels are
compiled at run time, which the output says):

    python3 kernels/build.py --amd-targets none --nvidia-targets sm_90 --ops moe_experts,moe_route,add
    python3 scripts/bench/measure_moe_experts.py OUTDIR                  # markdown on stdout, OUTDIR/moe_experts.json
    python3 scripts/bench/measure_moe_experts.py OUTDIR --tokens 1,8 --shapes qwen3-30b-a3b

Shapes (hidden, expert width, experts, used, gate|up type, down type):
    qwen3-30b-a3b     2048, 768, 128, 8, Q4_K, Q6_K (Q4_K_M's mix)     and a Q4_K-down variant
    gpt-oss-20b       2880, 2880, 32, 4, MXFP4, MXFP4
How it measures: each launch's expert tensors are replicated over --rotate-mib of device memory (a layer's
worth per copy) and the timed launches walk the copies with fresh random expert ids per copy, so each launch
reads its experts' weights from DRAM as in decoding. The launches are captured in one graph, replayed, and timed
with events. bytes read = the distinct selected experts' rows (gate and up, or down) of the launch; GB/s =
bytes / GPU time (for the grouped path's down, its second launch, the slot sum, included). At more than one token
both paths are timed (pairs: a warp per (token, slot); grouped: a workgroup per expert), and where the device has matrix
cores, the matrix-core path too, at every token count (mma: its gate_up
row is the sort, the gate and the up launches; its down row the down launch and the slot sum), and on NVIDIA its
few-pairs tiles (direct: the same launches, 8 pairs a tile) above one token; the launcher's choice in bold; --paths
times some of them. Before timing, the timed pairs and grouped paths' outputs are checked against
hipcore/ops/moe_experts.py's float64 reference within its bound (a miss is reported on stderr and in the JSON, not
fatal); the mma and direct paths' are checked by tests/gpu/test_moe_experts_mma_gpu.py.
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

from measure_matvec import commit, copy_bandwidth, gpu_or_exit, graph_time_per_launch  # noqa: E402

from hipcore.ops import matmul_mma, moe_experts, moe_experts_mma, moe_route  # noqa: E402
from hipcore.ops.weight_formats import row_bytes  # noqa: E402
from hipcore.runtime import kernels as loader  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
from support.weight_samples import random_weights  # noqa: E402

# name -> (hidden, ff, n_expert, k, gate|up type, down type)
SHAPES = {"qwen3-30b-a3b": (2048, 768, 128, 8, "q4_k", "q6_k"), "qwen3-30b-a3b-q4_k-down": (2048, 768, 128, 8, "q4_k", "q4_k"),
          "gpt-oss-20b": (2880, 2880, 32, 4, "mxfp4", "mxfp4")}
ACTIVATION = {"qwen3-30b-a3b": "swiglu", "qwen3-30b-a3b-q4_k-down": "swiglu", "gpt-oss-20b": "swiglu_oai"}


class Layer:
    """`copies` layers' expert tensors of one shape on the device, random ids per copy, x, h and out."""

    def __init__(self, dev, stream, rng, shape: str, tokens: int, rotate_bytes: int):
        self.dev, self.shape, self.tokens = dev, shape, tokens
        hidden, ff, n_expert, k, up_type, down_type = SHAPES[shape]
        self.hidden, self.ff, self.n_expert, self.k, self.up_type, self.down_type = hidden, ff, n_expert, k, up_type, down_type
        self.activation = ACTIVATION[shape]
        self.raw = {"gate": random_weights(rng, up_type, n_expert * ff, hidden),
                    "up": random_weights(rng, up_type, n_expert * ff, hidden),
                    "down": random_weights(rng, down_type, n_expert * hidden, ff)}
        layer_bytes = sum(raw.nbytes for raw in self.raw.values())
        self.copies = max(2, rotate_bytes // layer_bytes)
        self.buffers, self.weights = [], {}
        for name, raw in self.raw.items():
            buf = self._alloc(self.copies * raw.nbytes, "weights")
            buf.upload(raw)
            for c in range(1, self.copies):
                dev.copy_device_to_device(buf, buf, raw.nbytes, dst_offset=c * raw.nbytes, stream=stream)
            self.weights[name] = buf
        self.ids = np.stack([np.stack([rng.permutation(n_expert)[:k] for _ in range(tokens)])
                             for _ in range(self.copies)]).astype(np.int32)  # [copies, tokens, k]
        self.route_weights = rng.random((tokens, k)).astype(np.float32)
        self.x = rng.standard_normal((tokens, hidden)).astype(np.float32)
        self.ids_buf = self._upload(self.ids)
        self.weights_buf = self._upload(self.route_weights)
        self.x_buf = self._upload(self.x)
        self.x16_buf = self._upload(self.x.astype(np.float16))  # the matrix-core paths' x (moe_experts_mma.X_BYTES)
        self.h_buf = self._alloc(tokens * k * ff * 4, "activations")
        self.workspace = self._alloc(moe_experts.down_workspace_bytes(tokens, k, max(hidden, ff)), "scratch")
        self.tile = moe_experts_mma.tile_tokens(tokens * k, n_expert)
        sorted_bytes, tiles_bytes = moe_experts_mma.sort_bytes(tokens * k, n_expert)
        self.sorted_buf, self.tiles_buf = self._alloc(sorted_bytes, "scratch"), self._alloc(tiles_bytes, "scratch")
        self.out_buf = self._upload(np.zeros((tokens, hidden), np.float32))
        self.logits_buf = self._upload(rng.standard_normal((tokens, n_expert)).astype(np.float32))
        self.route_ids = self._alloc(tokens * k * 4, "activations")
        self.route_w = self._alloc(tokens * k * 4, "activations")
        stream.synchronize()

    def _alloc(self, nbytes, tag):
        buf = self.dev.allocate(nbytes, tag)
        self.buffers.append(buf)
        return buf

    def _upload(self, array):
        buf = self._alloc(array.nbytes, "activations")
        buf.upload(np.ascontiguousarray(array))
        return buf

    def free(self):
        for buf in self.buffers:
            buf.free()

    def weight_at(self, name: str, copy: int) -> int:
        return self.weights[name].addr() + copy * self.raw[name].nbytes

    def ids_at(self, copy: int) -> int:
        return self.ids_buf.addr() + copy * self.tokens * self.k * 4

    def mma_pays(self) -> bool:
        return moe_experts_mma.pays(self.dev.arch, self.tokens, self.k, self.n_expert, (self.up_type, self.down_type),
                                    (self.hidden, self.ff))

    def mma_runs(self) -> bool:
        """The matrix-core path exists here (timed at every token count, taken where mma_pays)."""
        return (matmul_mma.has_matrix_cores(self.dev.arch) and self.n_expert <= moe_experts_mma.MAX_EXPERTS
                and moe_experts_mma.supports(self.up_type, self.hidden) and moe_experts_mma.supports(self.down_type, self.ff))

    def direct_runs(self) -> bool:
        """NVIDIA's few-pairs tiles exist here (timed at every token count above one)."""
        return self.mma_runs() and all(moe_experts_mma.has_direct(self.dev.arch, t, c) for t, c in
                                       ((self.up_type, self.hidden), (self.down_type, self.ff)))

    def direct_pays(self) -> bool:
        return moe_experts_mma.direct_pays(self.dev.arch, self.tokens, self.k, self.n_expert,
                                           (self.up_type, self.down_type), (self.hidden, self.ff))

    def _mma(self, stream, mode: str, copy: int, tile: int | None = None) -> None:
        pairs = self.tokens * self.k
        shape = dict(pairs=pairs, n_expert=self.n_expert, tile=tile or self.tile)
        if mode == "gate":
            moe_experts_mma.launch_sort(self.dev, stream, self.sorted_buf, self.tiles_buf, self.ids_at(copy), pairs,
                                        self.n_expert, shape["tile"])
        rows, cols, x, out, x_per = ((self.hidden, self.ff, self.h_buf, self.workspace, 1) if mode == "down" else
                                     (self.ff, self.hidden, self.x16_buf, self.h_buf if mode == "up" else self.workspace,
                                      self.k))
        moe_experts_mma.launch_products(self.dev, stream, mode, out, self.weight_at(mode, copy), x, self.sorted_buf,
                                        self.tiles_buf, weight_type=self.down_type if mode == "down" else self.up_type,
                                        rows=rows, cols=cols, x_per=x_per, g=self.workspace, weights=self.weights_buf,
                                        activation=self.activation, **shape)
        if mode == "down":
            moe_experts.launch_sum_slots(self.dev, stream, self.out_buf, self.workspace, self.tokens, self.k,
                                             self.hidden)

    def gate_up(self, stream, copy: int, path: str | None = None) -> None:
        if path in ("mma", "direct"):
            tile = moe_experts_mma.DIRECT_TILE_PAIRS if path == "direct" else None
            self._mma(stream, "gate", copy, tile)
            self._mma(stream, "up", copy, tile)
            return
        moe_experts.launch_gate_up(self.dev, stream, self.h_buf, self.x_buf, self.weight_at("gate", copy),
                                   self.weight_at("up", copy), self.ids_at(copy), self.tokens, self.k, self.activation,
                                   weight_type=self.up_type, n_expert=self.n_expert, ff=self.ff, hidden=self.hidden,
                                   path=path)

    def down(self, stream, copy: int, path: str | None = None) -> None:
        if path in ("mma", "direct"):
            self._mma(stream, "down", copy, moe_experts_mma.DIRECT_TILE_PAIRS if path == "direct" else None)
            return
        moe_experts.launch_down(self.dev, stream, self.out_buf, self.h_buf, self.weight_at("down", copy),
                                self.ids_at(copy), self.weights_buf, self.tokens, self.k, weight_type=self.down_type,
                                n_expert=self.n_expert, hidden=self.hidden, ff=self.ff, workspace=self.workspace,
                                path=path)

    def route(self, stream, copy: int, path: str | None = None) -> None:
        moe_route.launch(self.dev, stream, self.route_ids, self.route_w, self.logits_buf, self.tokens, self.n_expert,
                         self.k, "topk_softmax" if self.activation == "swiglu_oai" else "softmax_topk", True)

    def bytes_read(self, kind: str) -> float:
        """Mean over the copies of the selected experts' weight bytes one launch reads."""
        if kind == "route":
            return self.tokens * self.n_expert * 4
        distinct = np.mean([len(np.unique(ids)) for ids in self.ids])
        if kind == "gate_up":
            return distinct * 2 * self.ff * row_bytes(self.up_type, self.hidden)
        return distinct * self.hidden * row_bytes(self.down_type, self.ff)

    def check(self, stream, path: str) -> list[str]:
        """gate|up and down of copy 0 on `path` against the references; the problems found."""
        problems = []
        self.gate_up(stream, 0, path)
        stream.synchronize()
        h = self.h_buf.download(np.float32).reshape(self.tokens, self.k, self.ff)
        want, bound = moe_experts.gate_up_reference(self.x, self.raw["gate"], self.raw["up"], self.up_type, self.ids[0],
                                                    self.ff, self.hidden, self.activation, with_bound=True)
        if not np.all(np.abs(h - want) <= bound):
            problems.append(f"{self.shape} {self.tokens} tokens {path} gate_up: {int((~(np.abs(h - want) <= bound)).sum())} values off")
        self.out_buf.upload(np.zeros((self.tokens, self.hidden), np.float32))
        self.down(stream, 0, path)
        stream.synchronize()
        out = self.out_buf.download(np.float32).reshape(self.tokens, self.hidden)
        want, bound = moe_experts.down_reference(h, self.raw["down"], self.down_type, self.ids[0], self.route_weights,
                                                 self.hidden, self.ff, with_bound=True)
        if not np.all(np.abs(out - want) <= bound):
            problems.append(f"{self.shape} {self.tokens} tokens {path} down: {int((~(np.abs(out - want) <= bound)).sum())} values off")
        return problems


def measure(device_spec: str, shapes: list[str], token_counts: list[int], rotate_bytes: int, replays: int,
            repeats: int, only: tuple[str, ...] = ()) -> dict:
    dev = gpu_or_exit(device_spec)
    try:
        stream = dev.create_stream()
        precompiled = "moe_experts" in loader.available_code_objects(dev.arch)
        copy_bw = copy_bandwidth(dev, stream, repeats)
        rng = np.random.default_rng(0)
        rows, problems = [], []
        for shape in shapes:
            for tokens in token_counts:
                layer = Layer(dev, stream, rng, shape, tokens, rotate_bytes)
                try:
                    paths = ("pairs",) if tokens == 1 else ("pairs", "grouped")
                    for path in paths:
                        if not only or path in only:
                            problems += layer.check(stream, path)
                    chosen = "grouped" if moe_experts.grouped_pays(tokens, layer.k, layer.n_expert) else "pairs"
                    if layer.mma_runs():
                        paths = (*paths, "mma")
                        chosen = "mma" if layer.mma_pays() else chosen
                    if tokens > 1 and layer.direct_runs():
                        paths = (*paths, "direct")
                        chosen = "direct" if layer.direct_pays() else chosen  # asked first, as moe_blocks does
                    timed = [p for p in paths if not only or p in only]
                    for kind, path in [("route", "-")] + [(kind, path) for kind in ("gate_up", "down") for path in timed]:
                        launch = getattr(layer, kind)
                        launches = [lambda s, c=c, p=path: launch(s, c, p) for c in range(layer.copies)]
                        ms = graph_time_per_launch(dev, stream, launches, replays, repeats)
                        nbytes = layer.bytes_read(kind)
                        rows.append({"shape": shape, "tokens": tokens, "kind": kind, "path": path,
                                     "chosen": path in ("-", chosen),
                                     "weight_type": layer.up_type if kind == "gate_up" else layer.down_type,
                                     "us": ms * 1e3, "bytes_read": nbytes, "bandwidth_gbs": nbytes / (ms * 1e-3) / 1e9,
                                     "fraction_of_copy": nbytes / (ms * 1e-3) / copy_bw})
                        print(f"{shape} {tokens} tokens {kind} {path}: {ms * 1e3:.1f} us, "
                              f"{rows[-1]['bandwidth_gbs']:.0f} GB/s", file=sys.stderr)
                finally:
                    layer.free()
        for p in problems:
            print(f"MISMATCH: {p}", file=sys.stderr)
        return {"device": dev.name, "arch": dev.arch, "date": datetime.date.today().isoformat(), "commit": commit(),
                "code_objects": "precompiled" if precompiled else "compiled at run time", "repeats": repeats,
                "copy_bandwidth_gbs": copy_bw / 1e9, "rows": rows, "problems": problems}
    finally:
        loader.forget_device(dev)
        dev.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path, help="folder for moe_experts.json")
    parser.add_argument("--device", default="auto", help="auto, hip, cuda (optionally :N); default auto")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--tokens", default="1,8,64,512", help="comma-separated token counts (default 1,8,64,512)")
    parser.add_argument("--rotate-mib", type=int, default=2048, help="device memory the weight copies fill (default 2048)")
    parser.add_argument("--replays", type=int, default=5, help="graph replays per timed run (default 5)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; the median is shown (default 5)")
    parser.add_argument("--paths", default="", help="comma-separated paths to time (and check), of pairs, grouped, "
                                                    "mma, direct (default: every path there is)")
    opts = parser.parse_args()
    shapes = [s for s in opts.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shape {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    result = measure(opts.device, shapes, [int(t) for t in opts.tokens.split(",")], opts.rotate_mib << 20,
                     opts.replays, opts.repeats, tuple(p for p in opts.paths.split(",") if p))
    opts.outdir.mkdir(parents=True, exist_ok=True)
    (opts.outdir / "moe_experts.json").write_text(json.dumps(result, indent=2))
    print(f"moe_experts on {result['device']} ({result['code_objects']}); {result['date']}, commit {result['commit']}, "
          f"median of {result['repeats']} runs; copy {result['copy_bandwidth_gbs']:.0f} GB/s (read + write)\n")
    print("| shape | tokens | launch | path | type | bytes read | µs | GB/s | % of copy |")
    print("| --- | ---: | --- | --- | --- | ---: | ---: | ---: | ---: |")
    for r in result["rows"]:
        path = f"**{r['path']}**" if r["chosen"] and r["path"] != "-" else r["path"]
        print(f"| {r['shape']} | {r['tokens']} | {r['kind']} | {path} | {r['weight_type']} | {r['bytes_read'] / 1e6:.2f} MB | "
              f"{r['us']:.1f} | {r['bandwidth_gbs']:.0f} | {100 * r['fraction_of_copy']:.0f}% |")
    if result["problems"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
