"""Where a prompt step's time goes on a GPU: the whole step's GPU time, each kind of launch's (all 30
layers' q|k|v products, all attentions, ...) captured into a graph of its own and replayed, and the
runner's host time for the step (plan, launches from Python, the wait and the download).

    python3 scripts/bench/profile_prompt_step.py --model M.gguf [--tokens 512] [--reps 10]

A prompt of --tokens tokens in one step, the last token sampling (as `rocmforge bench` pp does).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import OrderedDict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from hipcore.engine.loader import LoadOptions, load_model  # noqa: E402
from support.model_steps import step_batch  # noqa: E402
from profiles.decode_profile import device_us  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="GGUF model file")
    parser.add_argument("--tokens", type=int, default=512, help="prompt tokens in the step (default 512)")
    parser.add_argument("--reps", type=int, default=10, help="timed repetitions (default 10)")
    opts = parser.parse_args()
    n = opts.tokens
    options = LoadOptions(ctx_size=max(1024, 2 * n), max_seqs=4, max_step_tokens=n, kv_dtype="f16")
    with load_model(opts.model, options) as loaded:
        runner, cache, device = loaded.runner, loaded.cache, loaded.device
        stream = runner.stream
        batch = step_batch(cache, [(1, [100 + i % 4000 for i in range(n)], 0)])
        runner.execute(batch)
        runner.execute(batch)
        t0 = time.perf_counter()
        for _ in range(opts.reps):
            runner.execute(batch)
        host_us = 1e6 * (time.perf_counter() - t0) / opts.reps
        plan = runner.launch_plan(n, 1, all_rows=False, with_sampling=False, decode=False)

        def whole() -> None:
            for _, launch in plan:
                launch()

        step_us = device_us(device, stream, whole, opts.reps)
        kinds: OrderedDict[str, list] = OrderedDict()
        for label, launch in plan:
            kinds.setdefault(label, []).append(launch)
        print(f"prompt step of {n} tokens on {device.describe()}: {len(plan)} launches")
        print(f"runner.execute (host wall, plan + launches + wait + download): {host_us:,.0f} us "
              f"= {n / host_us * 1e6:,.0f} tokens/s")
        print(f"GPU time of the launches, back to back: {step_us:,.0f} us = {n / step_us * 1e6:,.0f} tokens/s\n")
        print("| launch | count | us per step | us per launch |")
        print("| --- | ---: | ---: | ---: |")
        for label, launches in kinds.items():
            with device.capture(stream) as cap:
                for launch in launches:
                    launch()
            try:
                us = device_us(device, stream, lambda: cap.graph.launch(stream), opts.reps)
            finally:
                cap.graph.destroy()
            print(f"| {label} | {len(launches)} | {us:,.1f} | {us / len(launches):,.1f} |")
        cache.free_sequence(1)
        device.synchronize()
        cache.release_fenced()


if __name__ == "__main__":
    main()
