"""The fused products of a llama layer on a GPU: fused_matvec against fused_matmul (split columns) per token
count, at the demo model's shapes, to set hipcore/ops/kernel_choice.py's crossover (FUSED_MATVEC_MAX_TOKENS).

    python3 scripts/bench/measure_fused_matmul.py [--tokens 1,2,4,8,16,32,64,128,512] [--json-out FILE]
    python3 scripts/bench/measure_fused_matmul.py --tiles        # also each tile shape forced
    python3 scripts/bench/measure_fused_matmul.py --variants 'BUSY_ITEMS=132;MIN_SPLIT_STEPS=2'
                                                             # also with the launcher's constants changed

The shapes: SmolLM2-135M's q|k|v with norm and RoPE (960 x 576), o + residual (576 x 576), gate|up with
norm and SwiGLU (2 x 1536 x 576), down + residual (576 x 1536), all Q4_1, and the Q8_0 output head with
the norm (49152 x 576). The weights are replicated over --rotate-mib of device memory and the timed
launches walk the copies, so that they come from DRAM / L2 as the 30 distinct layers of a step do. The
launches are captured in a graph and replayed; GPU time per launch, the median of --repeats runs. Each
fused_matmul result is first checked against fused_matvec's (relative 1e-4 of the largest value).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from hipcore.ops import fused_matmul, fused_matvec  # noqa: E402
from hipcore.ops.weight_formats import row_bytes  # noqa: E402
from hipcore.runtime import kernels as loader  # noqa: E402
from hipcore.runtime.selection import pick_device  # noqa: E402
from support.weight_samples import random_weights  # noqa: E402

LAYERS = 30
H, F, Q, KV, V = 576, 1536, 576, 192, 49152
# name, weight type, W rows, cols, output floats per token
PRODUCTS = [("qkv", "q4_1", Q + 2 * KV, H, Q + 2 * KV), ("o", "q4_1", H, Q, H), ("gate_up", "q4_1", 2 * F, H, F),
            ("down", "q4_1", H, F, H), ("head", "q8_0", V, H, V)]


def launcher(family, name: str, weight_type: str, n: int, out, x, g, pos, workspace, tile=None):
    """A callable (stream, W address) launching `name` of `family` for n tokens (fused_matmul: with the
    launcher's tile, or `tile` forced)."""
    kw = {"n_tokens": n, "workspace": workspace, "tile_tokens": tile} if family is fused_matmul else {"batch": n}
    common = {"weight_type": weight_type, **kw}
    if name == "qkv":
        q, k, v = out.addr(0), out.addr(n * Q * 4), out.addr(n * (Q + KV) * 4)
        return lambda dev, s, w: family.launch_norm_rope(dev, s, q, k, v, w, x, g, pos, q_rows=Q, kv_rows=KV, cols=H,
                                                         head_dim=64, rope_dim=64, eps=1e-5, theta=1e5,
                                                         freq_scale=1.0, **common)
    if name == "gate_up":
        return lambda dev, s, w: family.launch_norm_swiglu(dev, s, out, w, x, g, rows=F, cols=H, eps=1e-5, **common)
    if name in ("o", "down"):
        cols = Q if name == "o" else F
        return lambda dev, s, w: family.launch_add(dev, s, out, w, x, rows=H, cols=cols, **common)
    return lambda dev, s, w: family.launch_norm(dev, s, out, w, x, g, rows=V, cols=H, eps=1e-5, **common)


def time_launches(dev, stream, fn, weights, stride: int, copies: int, outs, replays: int, repeats: int) -> float:
    """Median µs per launch of fn over the weight copies, captured in a graph and replayed."""
    fn(dev, stream, weights.addr(0))
    stream.synchronize()
    with dev.capture(stream) as cap:
        for k in range(copies):
            fn(dev, stream, weights.addr(k * stride))
    graph = cap.graph
    try:
        graph.launch(stream)
        stream.synchronize()
        start, end = dev.create_event(), dev.create_event()
        runs = []
        for _ in range(repeats):
            start.record(stream)
            for _ in range(replays):
                graph.launch(stream)
            end.record(stream)
            end.synchronize()
            runs.append(start.elapsed_ms(end) * 1e3 / (replays * copies))
        return statistics.median(runs)
    finally:
        graph.destroy()


def measure(device: str, tokens: list[int], rotate_bytes: int, replays: int, repeats: int, matvec_max: int,
            tiles: bool = False, variants: dict | None = None) -> dict:
    variants = variants or {}
    choice = pick_device(device)
    dev = choice.device
    if dev.backend == "cpu" and device != "cpu":
        raise SystemExit("no GPU: " + "; ".join(choice.reasons))
    rng = np.random.default_rng(0)
    stream = dev.create_stream()
    workspace = dev.allocate(fused_matmul.WORKSPACE_BYTES, "scratch", label="workspace")
    workspace.fill(0)
    rows_out = []
    try:
        for name, weight_type, rows, cols, width in PRODUCTS:
            stride = -(-rows * row_bytes(weight_type, cols) // 256) * 256
            copies = max(2, min(64, rotate_bytes // stride))
            weights = dev.allocate(copies * stride, "weights", label=name)
            raw = random_weights(rng, weight_type, rows, cols)
            for k in range(copies):
                weights.upload(raw, offset=k * stride)
            n_max = max(tokens)
            x = dev.allocate(n_max * max(cols, H) * 4, "activations", label="x")
            x.upload((rng.standard_normal(n_max * max(cols, H)) * 2).astype(np.float32))
            g = dev.allocate(H * 4, "activations", label="g")
            g.upload(rng.standard_normal(H).astype(np.float32))
            pos = dev.allocate(n_max * 4, "activations", label="positions")
            pos.upload(rng.integers(0, 4096, n_max).astype(np.int32))
            outs = {fam: dev.allocate(n_max * width * 4, "activations", label=fam) for fam in ("mv", "mm", "mm32", "mm64")}
            try:
                for n in tokens:
                    times = {}
                    runs_of = [("mv", fused_matvec, None, {}), ("mm", fused_matmul, None, {}),
                               ("mm32", fused_matmul, 32, {}), ("mm64", fused_matmul, 64, {})]
                    runs_of += [(f"v:{desc}", fused_matmul, None, settings) for desc, settings in variants.items()]
                    for label, family, tile, settings in runs_of:
                        if (label == "mv" and n > 128) or (label in ("mm32", "mm64") and not tiles):
                            continue
                        saved = {k: getattr(fused_matmul, k) for k in settings}
                        for k, v in settings.items():
                            setattr(fused_matmul, k, v)
                        try:
                            times[label] = time_launches(dev, stream, launcher(
                                family, name, weight_type, n, outs.get(label, outs["mm"]), x, g, pos,
                                workspace, tile), weights, stride, copies, outs, replays, repeats)
                        finally:
                            for k, v in saved.items():
                                setattr(fused_matmul, k, v)
                    if "mv" in times:  # same operation, same inputs: the results agree to rounding
                        outs["mv"].fill(0, stream=stream)
                        outs["mm"].fill(0, stream=stream)
                        for label, family in (("mv", fused_matvec), ("mm", fused_matmul)):
                            launcher(family, name, weight_type, n, outs[label], x, g, pos, workspace)(
                                dev, stream, weights.addr(0))
                        stream.synchronize()
                        a = outs["mv"].download(np.float32, n * width)
                        b = outs["mm"].download(np.float32, n * width)
                        if not np.max(np.abs(a - b)) <= 1e-4 * np.max(np.abs(a)):
                            raise SystemExit(f"{name} at {n} tokens: fused_matmul differs from fused_matvec")
                    row_tiles = -(-F // 32) if name == "gate_up" else -(-rows // 64)
                    geo = fused_matmul.geometry(row_tiles, cols, n, fused_matmul.WORKSPACE_BYTES)
                    rows_out.append({"product": name, "tokens": n, "matvec_us": times.get("mv"),
                                     "matmul_us": times["mm"], "tile32_us": times.get("mm32"),
                                     "tile64_us": times.get("mm64"),
                                     "variants_us": {k[2:]: v for k, v in times.items() if k.startswith("v:")}, "grid": geo[0], "tile": geo[2], "splits": geo[3]})
                    print(f"{name} {n}: {times} grid/tile/splits {geo[0]}/{geo[2]}/{geo[3]}", file=sys.stderr)
            finally:
                for buf in (weights, x, g, pos, *outs.values()):
                    buf.free()
        result = {"device": dev.describe(), "arch": dev.arch, "products": rows_out, "matvec_max_tokens": matvec_max}
        loader.forget_device(dev)
        return result
    finally:
        workspace.free()
        dev.close()


def render(result: dict, tokens: list[int]) -> str:
    out = [f"Fused products on {result['device']}: µs per launch, fused_matvec / fused_matmul (grid, tile, splits) [forced tiles]\n"]
    out.append("| product | " + " | ".join(str(n) for n in tokens) + " |")
    out.append("| --- | " + " | ".join("---:" for _ in tokens) + " |")
    by = {(r["product"], r["tokens"]): r for r in result["products"]}
    for name, *_ in PRODUCTS:
        cells = []
        for n in tokens:
            r = by[(name, n)]
            mv = f"{r['matvec_us']:.1f}" if r["matvec_us"] is not None else "-"
            forced = (f" [32: {r['tile32_us']:.1f}, 64: {r['tile64_us']:.1f}]" if r.get("tile32_us") is not None else "")
            cells.append(f"{mv} / {r['matmul_us']:.1f} ({r['grid']}, {r['tile']}, {r['splits']}){forced}")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out.append(f"\nA step's products ({LAYERS} layers + head), ms, with each family alone and with the best per product:\n")
    out.append("| tokens | fused_matvec | fused_matmul | best |")
    out.append("| ---: | ---: | ---: | ---: |")
    for n in tokens:
        rows = [by[(name, n)] for name, *_ in PRODUCTS]
        scale = [1 if r["product"] == "head" else LAYERS for r in rows]
        mm = sum(s * r["matmul_us"] for s, r in zip(scale, rows)) / 1e3
        if all(r["matvec_us"] is not None for r in rows):
            mv = sum(s * r["matvec_us"] for s, r in zip(scale, rows)) / 1e3
            best = sum(s * min(r["matvec_us"], r["matmul_us"]) for s, r in zip(scale, rows)) / 1e3
            out.append(f"| {n} | {mv:.3f} | {mm:.3f} | {best:.3f} |")
        else:
            out.append(f"| {n} | - | {mm:.3f} | {mm:.3f} |")
    variants = list(result["products"][0].get("variants_us", {}))
    if variants:
        out.append("\nfused_matmul with the launcher's constants changed, a step's products (30 layers + head), ms:\n")
        out.append("| tokens | as committed | " + " | ".join(variants) + " |")
        out.append("| ---: | ---: | " + " | ".join("---:" for _ in variants) + " |")
        for n in tokens:
            rows = [by[(name, n)] for name, *_ in PRODUCTS]
            scale = [1 if r["product"] == "head" else LAYERS for r in rows]
            base = sum(s * r["matmul_us"] for s, r in zip(scale, rows)) / 1e3
            cells = [sum(s * r["variants_us"][v] for s, r in zip(scale, rows)) / 1e3 for v in variants]
            out.append(f"| {n} | {base:.3f} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    return "\n".join(out)


def parse_variants(text: str) -> dict:
    variants = {}
    for item in filter(None, (t.strip() for t in text.split(";"))):
        settings = {}
        for pair in item.split(","):
            key, _, value = pair.partition("=")
            if not hasattr(fused_matmul, key.strip()):
                raise SystemExit(f"--variants: fused_matmul has no constant {key.strip()!r}")
            settings[key.strip()] = int(value)
        variants[item] = settings
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="auto, hip, cuda (optionally :N); cpu for a smoke run")
    parser.add_argument("--tokens", default="1,2,4,8,12,16,24,32,48,64,128,512", help="comma-separated token counts")
    parser.add_argument("--rotate-mib", type=int, default=128, help="device memory the weight copies fill (default 128)")
    parser.add_argument("--replays", type=int, default=3, help="graph replays per timed run (default 3)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; the median is shown (default 5)")
    parser.add_argument("--tiles", action="store_true", help="also time fused_matmul with 32- and 64-token tiles forced")
    parser.add_argument("--variants", default="", help="';'-separated settings of fused_matmul's constants to time "
                        "as well, e.g. 'BUSY_ITEMS=528,MIN_SPLIT_STEPS=2;FEW_TILES=32'")
    parser.add_argument("--json-out", type=Path, help="also write the figures as JSON to this file")
    opts = parser.parse_args()
    tokens = [int(n) for n in opts.tokens.split(",")]
    from hipcore.ops.kernel_choice import FUSED_MATVEC_MAX_TOKENS
    result = measure(opts.device, tokens, opts.rotate_mib << 20, opts.replays, opts.repeats, FUSED_MATVEC_MAX_TOKENS,
                     opts.tiles, parse_variants(opts.variants))
    if opts.json_out:
        opts.json_out.write_text(json.dumps(result, indent=2))
    print(render(result, tokens))


if __name__ == "__main__":
    main()
