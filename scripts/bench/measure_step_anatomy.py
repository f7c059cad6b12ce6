"""Where a decode step's time between kernels goes: the step's launches replayed from graphs in other
orders and subsets, so that the cost of each kind's neighbours shows.

`rocmforge bench --profile` gives the whole step's replay and each kind replayed alone (all its layers'
launches back to back); on a Llama-3.2-1B shape the whole step took ~170 us more than the kinds added up
(an NVIDIA H200). This splits that difference:
  - step:      the plan as it runs (layer by layer);
  - grouped:   the same launches grouped kind by kind (the kinds' sum, but in one graph);
  - without K: the step with kind K's launches left out; step - without K is what K costs in the step;
  - only A,B:  the step's launches of two kinds, in step order (A B A B ...), against A's and B's alone.
The kernels read whatever the buffers hold (the timing does not depend on it).

    python3 scripts/bench/measure_step_anatomy.py MODEL.gguf [--reps 50] [--batch 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hipcore.ops.sample import SamplingRows  # noqa: E402
from profiles.bench import BenchConfig, load_for_bench  # noqa: E402
from profiles.decode_profile import decode_batch, device_us  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--device", default="auto",
                    help="as rocmforge bench's --device (cpu: a dry run of the script)")
    args = ap.parse_args()
    cfg = BenchConfig(model=args.model, device=args.device, prompt_tokens=(), gen_tokens=(), batches=(), profile_batch=1)
    loaded = load_for_bench(cfg)
    runner, cache, device = loaded.runner, loaded.cache, loaded.device
    stream = runner.stream
    bucket = runner.graphs.bucket_for(args.batch)
    step, seq_ids = decode_batch(cache, args.batch, args.context)
    sampling = SamplingRows.greedy(args.batch)
    runner.execute_sampled(step, sampling)
    runner.execute_sampled(step, sampling)
    plan = runner.launch_plan(bucket, bucket, all_rows=True, with_sampling=True, decode=True)
    labels = list(dict.fromkeys(label for label, _ in plan))

    def timed(launches) -> float:
        with device.capture(stream) as cap:
            for launch in launches:
                launch()
        try:
            return device_us(device, stream, lambda: cap.graph.launch(stream), args.reps)
        finally:
            cap.graph.destroy()

    def of(kinds) -> list:
        return [launch for label, launch in plan if label in kinds]

    rows = []
    full = timed([launch for _, launch in plan])
    rows.append(("step", len(plan), full))
    alone = {k: timed(of({k})) for k in labels}
    grouped = timed([launch for k in labels for launch in of({k})])
    rows.append(("grouped kind by kind", len(plan), grouped))
    rows.append(("kinds alone, summed", len(plan), sum(alone.values())))
    print(f"| replay | launches | us |\n| --- | ---: | ---: |")
    for name, n, us in rows:
        print(f"| {name} | {n} | {us:,.1f} |")
    print("\n| kind | launches | alone us | in the step us (step - without) | difference per launch |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for k in labels:
        n = len(of({k}))
        without = timed([launch for label, launch in plan if label != k])
        cost = full - without
        print(f"| {k} | {n} | {alone[k]:,.1f} | {cost:,.1f} | {(cost - alone[k]) / n:+.2f} |")
    layer_kinds = [k for k in labels if len(of({k})) > 1]
    print("\n| pair, in step order | launches | together us | alone, summed us | difference per launch |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for i, a in enumerate(layer_kinds):
        for b in layer_kinds[i + 1:]:
            both = of({a, b})
            us = timed(both)
            print(f"| {a} + {b} | {len(both)} | {us:,.1f} | {alone[a] + alone[b]:,.1f} | "
                  f"{(us - alone[a] - alone[b]) / len(both):+.2f} |")
    for s in seq_ids:
        cache.free_sequence(s)
    device.synchronize()
    cache.release_fenced()


if __name__ == "__main__":
    main()
