"""The MoE routers' product (matvec of few rows, F32) on matvec's two entries side by side: matvec_<type> (a warp a
row pair) and matvec_split_<type> (a workgroup a row, hipcore/ops/matvec.py split_rows), at Qwen3-30B-A3B's,
gpt-oss-20b's and gpt-oss-120b's router shapes and at growing row counts (to place SPLIT_MAX_GROUPS): GPU time per
launch and GB/s against the card's device-to-device copy bandwidth measured in the same run.

Run from the repository root on a GPU machine, with code objects built for it first (otherwise the kernels are
compiled at run time, which the output says):

    python3 kernels/build.py --amd-targets none --nvidia-targets sm_90 --ops matvec,matmul,add
    python3 scripts/bench/measure_router_matvec.py OUTDIR                 # markdown on stdout, OUTDIR/router_matvec.json
    python3 scripts/bench/measure_router_matvec.py OUTDIR --tokens 1,2,8 --types f32,bf16
    python3 scripts/bench/measure_router_matvec.py OUTDIR --tokens 16,32,64,128,512 --with-matmul --routers-only

How it measures (as measure_matvec.py): the weights are replicated over --rotate-mib of device memory and the timed
launches walk the copies, so each launch reads its weights from DRAM as in decoding; the launches are captured in one
graph, replayed, and timed with events. Each entry is launched by name at its own geometry, whatever the launcher
would choose (the launcher's choice is marked). Before timing, both entries' outputs are checked against
matvec.reference within matvec.error_bound, and the split entry's against a second launch of itself, bit for bit (a
miss is reported on stderr and in the JSON, not fatal).
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
from measure_matvec import commit, copy_bandwidth, floor_us, gpu_or_exit, graph_time_per_launch  # noqa: E402

from hipcore.ops import kernel_choice, matmul, matvec  # noqa: E402
from hipcore.runtime import kernels as loader  # noqa: E402
from hipcore.runtime.kernels import get_kernel  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
from support.weight_samples import random_weights  # noqa: E402

# (name, rows, cols): the routers (experts x hidden), then 2048-column matrices of more rows
SHAPES = [("qwen3-30b-a3b router", 128, 2048), ("gpt-oss-20b router", 32, 2880), ("gpt-oss-120b router", 128, 2880),
          ("256 rows", 256, 2048), ("512 rows", 512, 2048), ("1024 rows", 1024, 2048), ("2048 rows", 2048, 2048)]


def entries(arch: str, weight_type: str, rows: int, cols: int, batch: int,
            with_matmul: bool = False) -> dict[str, tuple[str, str, int, int, tuple]]:
    """entry -> (op, signature, grid, block, arguments after rows, cols, batch) of the entries timed for this product:
    matvec's two, and matmul's at its launcher's tile past matmul.MATVEC_MAX_TOKENS tokens when with_matmul."""
    out = {f"matvec_{weight_type}": (matvec.OP, matvec.SIGNATURE, *matvec.geometry(arch, rows, batch), ()),
           f"matvec_split_{weight_type}": (matvec.OP, matvec.SIGNATURE, *matvec.split_geometry(rows, cols, batch), ())}
    if with_matmul and batch > matmul.MATVEC_MAX_TOKENS:
        grid, block, tile = matmul.geometry(rows, batch)
        out[f"matmul_{weight_type}"] = (matmul.OP, matmul.SIGNATURE, grid, block, (tile,))
    return out


def measure_shape(dev, stream, rng, name: str, weight_type: str, rows: int, cols: int, batch: int, rotate_bytes: int,
                  replays: int, repeats: int, with_matmul: bool = False) -> list[dict]:
    stride = rows * matvec.row_bytes(weight_type, cols)
    copies = max(2, rotate_bytes // stride)
    raw = random_weights(rng, weight_type, rows, cols)
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    weights = dev.allocate(copies * stride, "weights", label=f"{weight_type} {rows}x{cols} x{copies}")
    xs = dev.allocate(x.nbytes, "activations", label="x")
    y = dev.allocate(batch * rows * 4, "activations", label="y")
    op = kernel_choice.project_op(dev, batch, weight_type, rows, cols)  # what the model launches
    chosen = (matvec.choose(dev.arch, weight_type, rows, cols, batch)[0] if op is matvec
              else f"{op.OP}_{weight_type}")
    want = matvec.reference(raw, weight_type, x, rows, cols)
    bound = matvec.error_bound(raw, weight_type, x, rows, cols)
    results = []
    try:
        weights.upload(raw)
        for k in range(1, copies):
            dev.copy_device_to_device(weights, weights, stride, dst_offset=k * stride, stream=stream)
        xs.upload(x)
        stream.synchronize()
        for entry, (op_name, signature, grid, block, extra) in entries(dev.arch, weight_type, rows, cols, batch,
                                                                         with_matmul).items():
            kernel = get_kernel(dev, op_name, entry, signature)

            def launch(s, k=0, kernel=kernel, grid=grid, block=block, extra=extra):
                kernel.launch(grid, block, (y, weights.addr(k * stride), xs, rows, cols, batch, *extra), stream=s)
            outputs = []
            for _ in range(2):
                y.fill(0xFF, stream=stream)
                launch(stream)
                stream.synchronize()  # download waits for the default stream's work, not this stream's
                outputs.append(y.download(np.float32).reshape(batch, rows))
            within = bool(np.all(np.abs(outputs[0] - want) <= bound))
            repeatable = outputs[0].tobytes() == outputs[1].tobytes()
            if not within or not repeatable:
                print(f"warning: {entry} {rows}x{cols} batch {batch}: within bound {within}, same bits twice "
                      f"{repeatable}", file=sys.stderr)
            ms = graph_time_per_launch(dev, stream, [lambda s, k=k: launch(s, k) for k in range(copies)], replays,
                                       repeats)
            moved = stride + x.nbytes + batch * rows * 4
            results.append({"shape": name, "kernel": entry, "chosen": entry == chosen, "rows": rows, "cols": cols,
                            "batch": batch, "grid": grid, "block": block, "bytes_moved": moved, "graph_us": ms * 1e3,
                            "bandwidth_gbs": moved / (ms / 1e3) / 1e9, "within_bound": within,
                            "same_bits_twice": repeatable})
            print(f"{entry} {rows}x{cols} batch {batch}: {ms * 1e3:.2f} us", file=sys.stderr)
    finally:
        for buf in (weights, xs, y):
            buf.free()
    return results


def measure(device_spec: str, types: list[str], tokens: list[int], rotate_bytes: int, replays: int,
            repeats: int, with_matmul: bool = False, shapes: list[tuple[str, int, int]] = SHAPES) -> dict:
    dev = gpu_or_exit(device_spec)
    try:
        stream = dev.create_stream()
        precompiled = "matvec" in loader.available_code_objects(dev.arch)
        copy_bw = copy_bandwidth(dev, stream, repeats)
        rng = np.random.default_rng(0)
        rows = [r for t in types for b in tokens for (name, n, c) in shapes
                for r in measure_shape(dev, stream, rng, name, t, n, c, b, rotate_bytes, replays, repeats,
                                       with_matmul)]
        for row in rows:
            row["fraction_of_copy"] = row["bandwidth_gbs"] * 1e9 / copy_bw
        result = {"device": dev.describe(), "backend": dev.backend, "arch": dev.arch,
                  "code_objects": "precompiled kernels" if precompiled else "kernels compiled at run time",
                  "date": datetime.date.today().isoformat(), "commit": commit(), "repeats": repeats,
                  "replays": replays, "copy_bandwidth_gbs": copy_bw / 1e9,
                  "floor_us": floor_us(dev, stream, replays, repeats), "split_max_groups": matvec.SPLIT_MAX_GROUPS,
                  "split_min_cols": matvec.SPLIT_MIN_COLS, "split_max_x_bytes": matvec.SPLIT_MAX_X_BYTES,
                  "rows": rows}
        loader.forget_device(dev)
        return result
    finally:
        dev.close()


def markdown(result: dict) -> str:
    lines = [f"matvec's two entries (and matmul's) at the routers' shapes on {result['device']} "
             f"({result['code_objects']}); "
             f"{result['date']}, commit {result['commit']}, median of {result['repeats']} runs",
             "", f"device-to-device copy: {result['copy_bandwidth_gbs']:.0f} GB/s (read + write); an empty kernel in a "
             f"graph: {result['floor_us']:.2f} µs; the launcher's choice in bold", "",
             "| shape | rows x cols | tokens | kernel | grid x block | µs per launch | GB/s | % of copy | checked |",
             "| --- | --- | ---: | --- | --- | ---: | ---: | ---: | --- |"]
    for r in result["rows"]:
        kernel = f"**{r['kernel']}**" if r["chosen"] else r["kernel"]
        checked = "ok" if r["within_bound"] and r["same_bits_twice"] else "MISS"
        lines.append(f"| {r['shape']} | {r['rows']} x {r['cols']} | {r['batch']} | {kernel} | {r['grid']} x "
                     f"{r['block']} | {r['graph_us']:.2f} | {r['bandwidth_gbs']:.0f} | "
                     f"{100 * r['fraction_of_copy']:.0f}% | {checked} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="output folder (router_matvec.json, router_matvec.md)")
    parser.add_argument("--device", default="auto", help="auto, hip, cuda (optionally :N); default auto")
    parser.add_argument("--tokens", default="1,8", help="comma-separated token counts (default 1,8)")
    parser.add_argument("--types", default="f32", help="comma-separated weight types of matvec.SPLIT_TYPES (default f32)")
    parser.add_argument("--rotate-mib", type=int, default=256,
                        help="device memory the weight copies fill (default 256: five times an H100's L2)")
    parser.add_argument("--with-matmul", action="store_true",
                        help="past 8 tokens time matmul's tiles too (what a batch's router took before it kept the "
                             "split entry: matvec.SPLIT_MAX_X_BYTES)")
    parser.add_argument("--routers-only", action="store_true", help="the three routers' shapes alone")
    parser.add_argument("--replays", type=int, default=5, help="graph replays per timed run (default 5)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; the median is shown (default 5)")
    opts = parser.parse_args()
    types = opts.types.split(",")
    unknown = [t for t in types if t not in matvec.SPLIT_TYPES]
    if unknown:
        parser.error(f"--types: {', '.join(unknown)} not in {', '.join(matvec.SPLIT_TYPES)}")
    opts.out.mkdir(parents=True, exist_ok=True)
    shapes = [s for s in SHAPES if "router" in s[0]] if opts.routers_only else SHAPES
    result = measure(opts.device, types, [int(t) for t in opts.tokens.split(",")], opts.rotate_mib << 20,
                     opts.replays, opts.repeats, opts.with_matmul, shapes)
    (opts.out / "router_matvec.json").write_text(json.dumps(result, indent=2))
    text = markdown(result)
    (opts.out / "router_matvec.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
