"""Per-launch cost of the device runtime on a GPU, as a table for docs/benchmarks.md.

Run from the repository root on a GPU machine (the project need not be installed):

    python3 scripts/gpu/measure_launch.py            # markdown table on stdout
    python3 scripts/gpu/measure_launch.py --json     # the same figures as JSON

Rows (medians of --repeats runs):
- argument packing alone (ArgPacker.pack, 6 arguments: 3 pointers, int32, float32, int64),
- Kernel.launch from Python, no arguments and 6 arguments: host time to enqueue one launch,
- the bindings' own launch call with the packed address (the floor under Kernel.launch), and on
  CUDA with cuda-python's (values, types) tuple form, which Kernel.launch avoids,
- one kernel inside a replayed graph: GPU time (events) and host wall time per kernel,
- one graph launch call (host time to enqueue a whole graph).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hipcore.runtime.selection import pick_device  # noqa: E402
from hipcore.runtime.launch_args import ArgPacker  # noqa: E402

SOURCE = r"""
extern "C" __global__ void empty_kernel() {}

extern "C" __global__ void six_args(float* a, const float* b, const float* c, int n, float eps, long long off) {
    if (n < 0 && threadIdx.x == 0) a[0] = b[0] + c[0] + eps + (float)off;  // never true: the arguments only
}
"""


def per_call_us(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def median_of(repeats: int, measure) -> float:
    return statistics.median(measure() for _ in range(repeats))


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def packing_us(args: tuple, calls: int, repeats: int) -> float:
    packer = ArgPacker("pppifl", "six_args")
    return median_of(repeats, lambda: per_call_us(lambda: packer.pack(args), calls))


def measure_packing_only(calls: int, repeats: int) -> dict:
    """Argument packing needs no GPU: measured on the cpu backend's buffers."""
    from hipcore.runtime.cpu import CpuDevice

    dev = CpuDevice(capacity=1 << 20)
    bufs = [dev.allocate(256, "scratch") for _ in range(3)]
    us = packing_us((bufs[0], bufs[1], bufs[2], 1024, 1e-5, 1 << 33), calls, repeats)
    for b in bufs:
        b.free()
    return {"device": "none (packing only)", "backend": "cpu", "arch": "cpu", "date": datetime.date.today().isoformat(),
            "commit": commit(), "python": sys.version.split()[0], "calls_per_run": calls, "repeats": repeats,
            "rows": [{"what": "pack 6 arguments (ArgPacker.pack)", "us": round(us, 3)}]}


def measure(device_spec: str, calls: int, graph_kernels: int, replays: int, repeats: int) -> dict:
    choice = pick_device(device_spec)
    dev = choice.device
    if dev.backend == "cpu":
        raise SystemExit("no GPU: " + "; ".join(choice.reasons))
    rows: list[tuple[str, float]] = []
    try:
        module = dev.load_module(dev.jit_compile(SOURCE, "measure_launch.cu", [], []), "measure_launch")
        empty = module.kernel("empty_kernel", "")
        six = module.kernel("six_args", "pppifl")
        bufs = [dev.allocate(256, "scratch", label=f"arg{i}") for i in range(3)]
        args = (bufs[0], bufs[1], bufs[2], 1024, 1e-5, 1 << 33)
        stream = dev.default_stream

        rows.append(("pack 6 arguments (ArgPacker.pack)", packing_us(args, calls, repeats)))

        for kernel, kargs, label in ((empty, (), "no arguments"), (six, args, "6 arguments")):
            per_call_us(lambda: kernel.launch(1, 32, kargs), 200)  # warm up
            dev.synchronize()

            def one_run(kernel=kernel, kargs=kargs) -> float:
                us = per_call_us(lambda: kernel.launch(1, 32, kargs), calls)
                dev.synchronize()
                return us
            rows.append((f"Kernel.launch, {label} (host, per launch)", median_of(repeats, one_run)))

        if dev.backend == "cuda":
            drv = dev._drv
            fn, handle = six._function, stream.handle
            address = six._packer.pack(args)

            def raw_packed() -> float:
                us = per_call_us(lambda: drv.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, handle, address, 0), calls)
                dev.synchronize()
                return us
            rows.append(("cuLaunchKernel, packed address (floor)", median_of(repeats, raw_packed)))
            ptrs = [b.ptr for b in bufs]
            types = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_longlong)

            def raw_tuple() -> float:
                us = per_call_us(lambda: drv.cuLaunchKernel(
                    fn, 1, 1, 1, 32, 1, 1, 0, handle, ((ptrs[0], ptrs[1], ptrs[2], 1024, 1e-5, 1 << 33), types), 0), calls)
                dev.synchronize()
                return us
            rows.append(("cuLaunchKernel, (values, types) tuple form", median_of(repeats, raw_tuple)))
        else:
            hip = dev._hip
            fn, handle = six._function, stream.handle
            address = six._packer.pack(args)

            def raw_packed_hip() -> float:
                us = per_call_us(lambda: hip.hipModuleLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, handle, address, None), calls)
                dev.synchronize()
                return us
            rows.append(("hipModuleLaunchKernel, packed address (floor)", median_of(repeats, raw_packed_hip)))

        graph_stream = dev.create_stream()
        with dev.capture(graph_stream) as cap:
            for _ in range(graph_kernels):
                six.launch(1, 32, args, stream=graph_stream)
        graph = cap.graph
        graph.launch(graph_stream)
        graph_stream.synchronize()
        start, end = dev.create_event(), dev.create_event()

        def replay() -> tuple[float, float]:
            t0 = time.perf_counter()
            start.record(graph_stream)
            for _ in range(replays):
                graph.launch(graph_stream)
            end.record(graph_stream)
            graph_stream.synchronize()
            wall = (time.perf_counter() - t0) * 1e6
            return start.elapsed_ms(end) * 1e3 / (replays * graph_kernels), wall / (replays * graph_kernels)
        results = [replay() for _ in range(repeats)]
        rows.append((f"one kernel in a replayed graph of {graph_kernels} (GPU time)", statistics.median(r[0] for r in results)))
        rows.append((f"one kernel in a replayed graph of {graph_kernels} (wall)", statistics.median(r[1] for r in results)))

        def graph_call() -> float:
            us = per_call_us(lambda: graph.launch(graph_stream), 20)
            graph_stream.synchronize()
            return us
        rows.append((f"graph launch call, {graph_kernels} kernels (host)", median_of(repeats, graph_call)))
        graph.destroy()
        for b in bufs:
            b.free()
        described = dev.describe()
    finally:
        dev.close()
    return {
        "device": described, "backend": choice.device.backend, "arch": choice.device.arch,
        "date": datetime.date.today().isoformat(), "commit": commit(), "python": sys.version.split()[0],
        "calls_per_run": calls, "repeats": repeats, "rows": [{"what": w, "us": round(us, 3)} for w, us in rows],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="auto, hip, cuda (optionally :N); default auto")
    parser.add_argument("--calls", type=int, default=20_000, help="launches per timed run (default 20000)")
    parser.add_argument("--graph-kernels", type=int, default=1000, help="kernels captured in the graph (default 1000)")
    parser.add_argument("--replays", type=int, default=20, help="graph replays per timed run (default 20)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per row; the median is shown (default 5)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a markdown table")
    parser.add_argument("--pack-only", action="store_true", help="measure argument packing only (needs no GPU)")
    opts = parser.parse_args()
    if opts.pack_only:
        result = measure_packing_only(opts.calls, opts.repeats)
    else:
        result = measure(opts.device, opts.calls, opts.graph_kernels, opts.replays, opts.repeats)
    if opts.json:
        print(json.dumps(result, indent=2))
        return
    print(f"Per-launch cost on {result['device']}; {result['date']}, commit {result['commit']}, "
          f"Python {result['python']}, median of {result['repeats']} runs of {result['calls_per_run']} launches\n")
    print("| what | µs |")
    print("| --- | ---: |")
    for row in result["rows"]:
        print(f"| {row['what']} | {row['us']:.2f} |")


if __name__ == "__main__":
    main()
