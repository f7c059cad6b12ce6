"""GPU time of paged attention at a model's head shape (by default the demo model's: 9 query heads over 3
KV heads of 64; KV blocks of 16), as a table for docs/benchmarks.md: decode at contexts 128 / 512 / 2048 /
8192 for 1 and 64 sequences, and a 512-token prompt.

Run from the repository root on a GPU machine (the project need not be installed):

    python3 scripts/bench/measure_attention.py                    # markdown table on stdout
    python3 scripts/bench/measure_attention.py --kv-dtype f16,q8_0 --json
    python3 scripts/bench/measure_attention.py --shape qwen3-30b-a3b --contexts 128,4096 --sequences 1,8 --no-prompt

How it measures:
- The launches are captured in one graph, as decode runs in the engine, replayed, and timed with
  events: GPU time per launch, without Python's launch cost.
- Decoding reads each layer's K/V from DRAM (30 layers of a long context do not fit in the L2), so
  the timed launches walk `copies` disjoint sets of blocks in turn (each launch its own block tables),
  enough copies to fill --rotate-mib of KV pool (at most 256 copies, so the smallest contexts stay
  partly in the L2, as they would in a real decode), as measure_matvec.py rotates weights. A prompt reads
  the K/V it has just written, so its launches repeat one set.
- Decode uses the workspace (keys split over workgroups) as the runner will; the "one workgroup"
  column shows the same launch without it, for comparison.
- bytes = the K and V rows read (context x KV heads x row bytes x 2), once per launch; GB/s = bytes /
  time. Each configuration's output is first checked against the numpy reference.
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

from profiles.bench import source_commit as commit  # noqa: E402
from hipcore.kvcache.dtypes import KV_DTYPES, kv_dtype  # noqa: E402
from hipcore.ops import paged_attention  # noqa: E402
from hipcore.runtime import kernels as loader  # noqa: E402
from hipcore.runtime.selection import pick_device  # noqa: E402
from measure_matvec import timed  # noqa: E402

# (query heads, KV heads, head size) of the models whose attention this measures
SHAPES = {
    "demo": (9, 3, 64),  # SmolLM2-135M
    "llama-3.1-8b": (32, 8, 128),
    "qwen3-30b-a3b": (32, 4, 128),
    "gpt-oss-20b": (64, 8, 64),
}
N_HEADS, N_KV_HEADS, HEAD_DIM = SHAPES["demo"]
BLOCK_SIZE = 16
MAX_CONTEXT = 8192
MAX_BLOCKS = MAX_CONTEXT // BLOCK_SIZE
SCALE = float(np.float32(1 / np.sqrt(HEAD_DIM)))


def cases(sequences: list[int], contexts: list[int], prompt: bool) -> list[tuple[str, int, int, int]]:
    """(name, sequences, context, query tokens per sequence) of every measured launch."""
    decode = [(f"decode {b} x {c}", b, c, 1) for b in sequences for c in contexts]
    return decode + ([("prompt 512", 1, 512, 512)] if prompt else [])


def use_shape(name: str) -> None:
    """Measure the head shape SHAPES[name] (the module's constants, which every case reads)."""
    global N_HEADS, N_KV_HEADS, HEAD_DIM, SCALE
    N_HEADS, N_KV_HEADS, HEAD_DIM = SHAPES[name]
    SCALE = float(np.float32(1 / np.sqrt(HEAD_DIM)))
PATTERN_BYTES = 1 << 22  # random K/V bytes tiled over the pools
MAX_COPIES = 256  # graph nodes per replay at most


def random_pool(dev, stream, rng, kv: str, nbytes: int):
    """A KV pool of nbytes filled with a tiled random pattern of valid rows of format `kv`."""
    fmt = kv_dtype(kv)
    rows = PATTERN_BYTES // fmt.row_bytes(HEAD_DIM)
    pattern = fmt.encode((rng.standard_normal((rows, HEAD_DIM))).astype(np.float32)).reshape(-1)
    pool = dev.allocate(nbytes, "kv", label=f"{kv} pool")
    pool.upload(pattern[:min(pattern.size, nbytes)])
    filled = min(pattern.size, nbytes)
    while filled < nbytes:  # double the filled part with device copies
        step = min(filled, nbytes - filled)
        dev.copy_device_to_device(pool, pool, step, dst_offset=filled, stream=stream)
        filled += step
    stream.synchronize()
    return pool


def measure_case(dev, stream, rng, kv: str, name: str, n_seqs: int, context: int, n_query: int, rotate_bytes: int,
                 replays: int, repeats: int, single: bool = True) -> dict:
    fmt = kv_dtype(kv)
    row_bytes = fmt.row_bytes(HEAD_DIM)
    blocks_per_seq = -(-context // BLOCK_SIZE)
    set_bytes = n_seqs * blocks_per_seq * N_KV_HEADS * BLOCK_SIZE * row_bytes
    copies = 1 if n_query > 1 else max(1, min(MAX_COPIES, rotate_bytes // set_bytes))
    num_blocks = 1 + copies * n_seqs * blocks_per_seq
    n_tokens = n_seqs * n_query
    pool_bytes = num_blocks * N_KV_HEADS * BLOCK_SIZE * row_bytes
    buffers = []

    def alloc(nbytes: int, tag: str, label: str):
        buf = dev.allocate(nbytes, tag, label=label)
        buffers.append(buf)
        return buf

    try:
        k_pool = random_pool(dev, stream, rng, kv, pool_bytes)
        buffers.append(k_pool)
        v_pool = random_pool(dev, stream, rng, kv, pool_bytes)
        buffers.append(v_pool)
        order = rng.permutation(np.arange(1, num_blocks)).astype(np.int32).reshape(copies, n_seqs, blocks_per_seq)
        tables = []
        for c in range(copies):
            table = np.zeros((n_seqs, MAX_BLOCKS), np.int32)
            table[:, :blocks_per_seq] = order[c]
            buf = alloc(table.nbytes, "scratch", f"tables {c}")
            buf.upload(table)
            tables.append((table, buf))
        q = (rng.standard_normal((n_tokens, N_HEADS, HEAD_DIM)) * 2).astype(np.float32)
        token_seq = np.repeat(np.arange(n_seqs, dtype=np.int32), n_query)
        positions = np.tile(np.arange(context - n_query, context, dtype=np.int32), n_seqs)
        q_buf, seq_buf, pos_buf = (alloc(a.nbytes, "activations", n) for a, n in
                                   ((q, "q"), (token_seq, "token_seq"), (positions, "positions")))
        for buf, a in ((q_buf, q), (seq_buf, token_seq), (pos_buf, positions)):
            buf.upload(a)
        out = alloc(q.nbytes, "activations", "out")
        workspace_bytes = paged_attention.workspace_size(n_tokens, N_HEADS, N_KV_HEADS, HEAD_DIM, MAX_CONTEXT)
        workspace = alloc(max(workspace_bytes, 4), "scratch", "workspace")
        workspace.fill(0)

        def launch(s, copy: int, split: bool) -> None:
            paged_attention.launch(dev, s, out, q_buf, k_pool, v_pool, tables[copy][1], seq_buf, pos_buf,
                                   n_tokens=n_tokens, n_heads=N_HEADS, n_kv_heads=N_KV_HEADS, head_dim=HEAD_DIM,
                                   block_size=BLOCK_SIZE, max_blocks=MAX_BLOCKS, num_blocks=num_blocks, scale=SCALE,
                                   kv_dtype=kv, workspace=workspace if split else None)

        # Correctness first, against the reference on the first copy's blocks.
        launch(stream, 0, True)
        stream.synchronize()
        got = out.download(np.float32).reshape(q.shape)
        shape = (num_blocks, N_KV_HEADS, BLOCK_SIZE, row_bytes)
        want = paged_attention.reference(q, k_pool.download(np.uint8).reshape(shape), v_pool.download(np.uint8).reshape(shape),
                                         fmt, tables[0][0], token_seq, positions, SCALE)
        if not np.allclose(got, want, rtol=1e-3, atol=1e-3):
            raise SystemExit(f"paged_attention_{kv} {name} gives wrong results on this device "
                             f"(max difference {float(np.abs(got - want).max()):.3g})")

        result = {"kv_dtype": kv, "case": name, "sequences": n_seqs, "context": context, "query_tokens": n_tokens,
                  "kv_bytes": 2 * n_seqs * context * N_KV_HEADS * row_bytes, "copies": copies,
                  "splits": paged_attention.split_limit(n_tokens, N_HEADS, N_KV_HEADS, MAX_CONTEXT)}
        for split in (True, False) if single else (True,):
            for c in range(copies):
                launch(stream, c, split)  # warm up (and load the module) outside the capture
            stream.synchronize()
            with dev.capture(stream) as cap:
                for c in range(copies):
                    launch(stream, c, split)
            graph = cap.graph
            try:
                graph.launch(stream)
                stream.synchronize()

                def run() -> None:
                    for _ in range(replays):
                        graph.launch(stream)
                ms = timed(dev, stream, run, repeats) / (replays * copies)
            finally:
                graph.destroy()
            result["split_us" if split else "single_us"] = ms * 1e3
        result["bandwidth_gbs"] = result["kv_bytes"] / (result["split_us"] / 1e6) / 1e9
        return result
    finally:
        for buf in buffers:
            buf.free()


def measure(device_spec: str, kv_dtypes: list[str], rotate_bytes: int, replays: int, repeats: int,
            measured_cases: list[tuple[str, int, int, int]], single: bool = True) -> dict:
    choice = pick_device(device_spec)
    dev = choice.device
    if dev.backend == "cpu":
        raise SystemExit("no GPU: " + "; ".join(choice.reasons))
    try:
        stream = dev.create_stream()
        rng = np.random.default_rng(0)
        rows = [measure_case(dev, stream, rng, kv, name, b, c, nq, rotate_bytes, replays, repeats, single)
                for kv in kv_dtypes for name, b, c, nq in measured_cases]
        precompiled = "paged_attention" in loader.available_code_objects(dev.arch)
        loader.forget_device(dev)
        return {"device": dev.describe(), "backend": dev.backend, "arch": dev.arch,
                "code_objects": "precompiled kernels" if precompiled else "kernels compiled at run time",
                "date": datetime.date.today().isoformat(), "commit": commit(), "repeats": repeats,
                "replays": replays, "shape": {"n_heads": N_HEADS, "n_kv_heads": N_KV_HEADS, "head_dim": HEAD_DIM,
                                              "block_size": BLOCK_SIZE}, "rows": rows}
    finally:
        dev.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="auto, hip, cuda (optionally :N); default auto")
    parser.add_argument("--kv-dtype", default="f16", help=f"comma-separated KV dtypes of {', '.join(KV_DTYPES)} (default f16)")
    parser.add_argument("--rotate-mib", type=int, default=256,
                        help="KV pool the decode launches walk, in at most 256 copies (default 256)")
    parser.add_argument("--replays", type=int, default=5, help="graph replays per timed run (default 5)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; the median is shown (default 5)")
    parser.add_argument("--shape", default="demo", choices=sorted(SHAPES),
                        help="the model whose query heads, KV heads and head size are measured (default demo)")
    parser.add_argument("--contexts", default="128,512,2048,8192",
                        help=f"comma-separated decode contexts, each at most {MAX_CONTEXT} (default 128,512,2048,8192)")
    parser.add_argument("--sequences", default="1,64", help="comma-separated decode batch sizes (default 1,64)")
    parser.add_argument("--no-prompt", action="store_true", help="leave out the 512-token prompt")
    parser.add_argument("--split-only", action="store_true",
                        help="time the launches with the workspace only (leave out the one-workgroup column)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a markdown table")
    opts = parser.parse_args()
    try:
        contexts = [int(c) for c in opts.contexts.split(",") if c.strip()]
        sequences = [int(b) for b in opts.sequences.split(",") if b.strip()]
    except ValueError:
        parser.error("--contexts and --sequences take comma-separated whole numbers")
    if not contexts or not sequences or min(contexts + sequences) < 1 or max(contexts) > MAX_CONTEXT:
        parser.error(f"--contexts and --sequences need at least one value each, every one from 1 (contexts to {MAX_CONTEXT})")
    use_shape(opts.shape)
    kv_dtypes = [k.strip() for k in opts.kv_dtype.split(",") if k.strip()]
    unknown = [k for k in kv_dtypes if k not in KV_DTYPES]
    if unknown:
        parser.error(f"unknown KV dtype {', '.join(unknown)}; choose from {', '.join(KV_DTYPES)}")
    result = measure(opts.device, kv_dtypes, opts.rotate_mib << 20, opts.replays, opts.repeats,
                     cases(sequences, contexts, not opts.no_prompt), not opts.split_only)
    if opts.json:
        print(json.dumps(result, indent=2))
        return
    print(f"paged attention on {result['device']} ({result['code_objects']}); {result['date']}, commit "
          f"{result['commit']}, median of {result['repeats']} runs; {opts.shape}: {N_HEADS} query / {N_KV_HEADS} KV heads "
          f"of {HEAD_DIM}, blocks of {BLOCK_SIZE}\n")
    print("| KV | case | query tokens | K+V (unique) | µs per launch (graph) | GB/s | splits (max) | µs, one workgroup per token |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in result["rows"]:
        print(f"| {r['kv_dtype']} | {r['case']} | {r['query_tokens']} | {r['kv_bytes'] / 1e6:.2f} MB | "
              f"{r['split_us']:.2f} | {r['bandwidth_gbs']:.0f} | {r['splits']} | "
              + (f"{r['single_us']:.2f} |" if "single_us" in r else "- |"))


if __name__ == "__main__":
    main()
