"""Where one decode step's time goes: kernels on the device, launches, and host work.

Measured on a loaded model, for a decode step of `batch` sequences at `context` tokens:
  - graph: the whole step replayed from its captured graph (GPU time between two events);
  - kernels: each kind of launch (all 30 layers' q|k|v products, all kv_stores, ...) captured into a
    graph of its own and replayed, so each kind's GPU time is measured as it runs inside a graph,
    reading its own layers' weights from memory as the real step does;
  - eager: the same launches made one by one from Python (what a step costs without graphs);
  - host: the runner's own split of a step (packing and uploading the inputs, the replay call, the
    wait and the download of the tokens) and the engine's whole step (scheduling, the batch, the
    bookkeeping of sampled tokens and detokenizing) on real decoding requests;
  - the floor: the weight bytes a step must read over the device's copy bandwidth, measured here.
"""

from __future__ import annotations

import statistics
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field

import numpy as np

from hipcore.engine.loader import LoadedModel
from hipcore.model.batch import SeqSlice, StepBatch, build_step_batch
from hipcore.ops.sample import SamplingRows
from hipcore.runtime.ledger import format_bytes
from profiles.bench import BenchConfig, Workloads


@dataclass
class KernelKind:
    name: str
    launches: int
    us_per_step: float  # GPU time of all launches of this kind in one step

    @property
    def us_per_launch(self) -> float:
        return self.us_per_step / self.launches


@dataclass
class DecodeProfile:
    batch: int
    context: int
    device: str
    launches: int
    graph_us: float  # GPU time of the step replayed from its graph
    eager_us: float  # wall time of the same launches made one by one (synchronized at the end)
    kernels: list[KernelKind]
    runner_us: float  # runner.execute_sampled wall time per step (graph path)
    runner_split_us: dict[str, float]  # pack+upload, replay call, wait+download
    engine_step_us: float  # Engine.step wall time per decode step on real requests
    weight_bytes: int
    copy_bandwidth: float  # bytes/s, device-to-device copy (read + write counted)
    notes: list[str] = field(default_factory=list)

    @property
    def kernels_us(self) -> float:
        return sum(k.us_per_step for k in self.kernels)

    @property
    def host_us(self) -> float | None:
        """Engine step minus graph replay: the host's share of a step; None where the step measured no
        longer than the replay alone (the two were timed apart, so noise can make the difference negative)."""
        host = self.engine_step_us - self.graph_us
        return host if host >= 0 else None

    @property
    def floor_us(self) -> float:
        """Reading every weight once at the copy's memory traffic (read + write bytes per second): a kernel that
        only reads moves its bytes through the same memory system, and the decode kernels reach well past half
        the copy figure (2,008 GB/s for Q4_K against a 2,998 GB/s copy on an NVIDIA H100 80GB HBM3), so half of
        it would be no floor."""
        return 1e6 * self.weight_bytes / self.copy_bandwidth if self.copy_bandwidth else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(kernels_us=self.kernels_us, floor_us=self.floor_us, host_us=self.host_us)
        for k, kind in zip(out["kernels"], self.kernels):
            k["us_per_launch"] = kind.us_per_launch
        return out

    def advice(self) -> list[str]:
        """What the figures say it would take to get closer to the floor."""
        lines = []
        step = self.engine_step_us
        host = self.host_us
        if host is None:
            # The engine launches each decode step before it handles the one before (docs/architecture.md,
            # "Overlapped decode steps"), so its step takes about the longer of the two; its steps also run at
            # contexts 1..N while the replay was timed at `context`, and on the cpu backend the "device" is the
            # host itself. A difference below zero says only that host work is hidden or lost in the noise.
            lines.append(f"host work could not be told apart: the engine step ({step:,.0f} us) measured no longer "
                         f"than the graph replay alone ({self.graph_us:,.0f} us at context {self.context}); the engine "
                         "overlaps its host work with the device's")
        else:
            lines.append(f"host work is {host:,.0f} us of the {step:,.0f} us step ({100 * host / step:.0f}%): the "
                         "device idles while Python schedules, packs and detokenizes (steps that wait for their tokens: "
                         "ROCMFORGE_STEP_OVERLAP=0, host sampling, or host work longer than the device's)")
        gap = self.graph_us - self.kernels_us
        if gap > 0:
            lines.append(f"the replayed graph takes {self.graph_us:,.0f} us for {self.launches} launches; measured kind "
                         f"by kind the kernels add up to {self.kernels_us:,.0f} us, so the launches and the gaps "
                         f"between them cost about {gap / self.launches:.1f} us each; on an H200 most of it was each "
                         "kind finding L2 cold after its neighbours (scripts/bench/measure_step_anatomy.py splits it "
                         "kind by kind)")
        if gap < 0:
            lines.append("(kinds replayed alone run slower than inside the whole step: their weights miss the cache)")
        if self.floor_us:
            slow = max(self.kernels, key=lambda k: k.us_per_step)
            lines.append(f"the floor is {self.floor_us:,.0f} us ({format_bytes(self.weight_bytes)} of weights at "
                         f"{self.copy_bandwidth / 1e9:,.0f} GB/s); the largest kind is {slow.name} at "
                         f"{slow.us_per_launch:.1f} us per launch")
        return lines


def decode_batch(cache, batch: int, context: int, seq_base: int = 10_000_000) -> tuple[StepBatch, list[int]]:
    """A decode step of `batch` sequences each at position context - 1 (their KV reserved, contents as
    they are: the timing does not depend on them). Returns the batch and the sequence ids to free."""
    ids = list(range(seq_base, seq_base + batch))
    for s in ids:
        cache.add_sequence(s)
        if not cache.reserve(s, context):
            raise RuntimeError(f"the KV cache has no room for {batch} sequences of {context} tokens")
    return build_step_batch(cache, [SeqSlice(s, [100], context - 1, True) for s in ids]), ids


def device_us(device, stream, fn, reps: int) -> float:
    """Mean GPU time of fn() (which queues work on `stream`) over reps runs, in microseconds."""
    start, end = device.create_event(), device.create_event()
    fn()
    stream.synchronize()
    start.record(stream)
    for _ in range(reps):
        fn()
    end.record(stream)
    end.synchronize()
    us = 1e3 * start.elapsed_ms(end) / reps
    start.destroy()
    end.destroy()
    return us


def _copy_bandwidth(device, nbytes: int, reps: int) -> float:
    src = device.allocate(nbytes, "scratch", label="profile.copy_src")
    try:
        dst = device.allocate(nbytes, "scratch", label="profile.copy_dst")
        try:
            stream = device.default_stream
            us = device_us(device, stream, lambda: device.copy_device_to_device(dst, src, nbytes, stream=stream), reps)
            return 2 * nbytes / (us * 1e-6)
        finally:
            dst.free()
    finally:
        src.free()


def profile_decode(loaded: LoadedModel, *, batch: int = 1, context: int = 128, reps: int = 50,
                   engine_steps: int = 64, copy_bytes: int = 256 << 20) -> DecodeProfile:
    runner, cache, device = loaded.runner, loaded.cache, loaded.device
    stream = runner.stream
    bucket = runner.graphs.bucket_for(batch)
    if bucket is None:
        raise ValueError(f"a batch of {batch} has no decode bucket (at most {runner.graphs.buckets[-1]})")
    step, seq_ids = decode_batch(cache, batch, context)
    try:
        sampling = SamplingRows.greedy(batch)
        runner.execute_sampled(step, sampling)  # loads every kernel; captures the bucket's graph
        runner.execute_sampled(step, sampling)
        plan = runner.launch_plan(bucket, bucket, all_rows=True, with_sampling=True, decode=True)
        graph_us = device_us(device, stream, lambda: runner.graphs.run(bucket, lambda: None), reps)

        kinds: OrderedDict[str, list] = OrderedDict()
        for label, launch in plan:
            kinds.setdefault(label, []).append(launch)
        kernels = []
        for label, launches in kinds.items():
            with device.capture(stream) as cap:
                for launch in launches:
                    launch()
            try:
                kernels.append(KernelKind(label, len(launches), device_us(device, stream, lambda: cap.graph.launch(stream), reps)))
            finally:
                cap.graph.destroy()

        def eager() -> None:
            for _, launch in plan:
                launch()

        t0 = time.perf_counter()
        for _ in range(max(3, reps // 5)):
            eager()
        stream.synchronize()
        eager_us = 1e6 * (time.perf_counter() - t0) / max(3, reps // 5)

        split = {"pack+upload": 0.0, "replay call": 0.0, "wait+download": 0.0}
        runs = reps
        wall0 = time.perf_counter()
        for _ in range(runs):
            t0 = time.perf_counter()
            runner.inputs.pack(step, padded_tokens=bucket, all_rows=True, sampling=sampling, stream=stream)
            t1 = time.perf_counter()
            runner.graphs.run(bucket, eager)
            t2 = time.perf_counter()
            out = np.empty(batch, np.int32)
            device.copy_device_to_host(out, runner.buffers["tokens"])
            t3 = time.perf_counter()
            split["pack+upload"] += t1 - t0
            split["replay call"] += t2 - t1
            split["wait+download"] += t3 - t2
        split = {k: 1e6 * v / runs for k, v in split.items()}
        wall0 = time.perf_counter()
        for _ in range(runs):
            runner.execute_sampled(step, sampling)
        runner_us = 1e6 * (time.perf_counter() - wall0) / runs
    finally:
        for s in seq_ids:
            cache.free_sequence(s)
        device.synchronize()
        cache.release_fenced()

    engine_step_us = _engine_decode_step_us(loaded, batch, engine_steps)
    bandwidth = _copy_bandwidth(device, copy_bytes, max(5, reps // 5))
    return DecodeProfile(
        batch=batch, context=context, device=device.describe(), launches=len(plan), graph_us=graph_us,
        eager_us=eager_us, kernels=kernels, runner_us=runner_us, runner_split_us=split,
        engine_step_us=engine_step_us, weight_bytes=loaded.weights.nbytes, copy_bandwidth=bandwidth,
    )


def _engine_decode_step_us(loaded: LoadedModel, batch: int, steps: int) -> float:
    """Mean Engine.step wall time over decode steps of `batch` real requests (greedy, no end token)."""
    cfg = BenchConfig(model=loaded.path, batches=(batch,), batch_gen_tokens=steps, prompt_tokens=(), gen_tokens=())
    work = Workloads(loaded, cfg)
    try:
        work.decode(batch, 4)  # warm-up
        samples = [work.decode(batch, steps) for _ in range(2)]
    finally:
        work.close()
    return 1e6 * batch / statistics.fmean(samples)  # tokens/s over `batch` rows -> seconds per step
