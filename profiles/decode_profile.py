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
  - bytes: each kind's weights read in the step, as its launches declare them (hipcore/model/launch.py), and its
    GB/s; a mixture of experts' expert launches read only the experts the step's tokens were routed to, counted
    from the routing buffer read back before each of them in one pass of the step's launches;
  - the floor: the active weights read once (every weight, but of a mixture's expert tensors only the selected
    experts) over the device's copy bandwidth, measured here.
"""

from __future__ import annotations

import statistics
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field

import numpy as np

from hipcore.engine.loader import LoadedModel
from hipcore.model.batch import SeqSlice, StepBatch, build_step_batch
from hipcore.model.launch import declared
from hipcore.ops.sample import SamplingRows
from hipcore.runtime.ledger import format_bytes
from profiles.bench import BenchConfig, Workloads


@dataclass
class KernelKind:
    name: str
    launches: int
    us_per_step: float  # GPU time of all launches of this kind in one step
    bytes_read: int | None = None  # weight bytes its launches read in one step; None: they read no weight

    @property
    def us_per_launch(self) -> float:
        return self.us_per_step / self.launches

    @property
    def gb_per_s(self) -> float | None:
        """Weight bytes read per second, in GB/s (what a kind that streams its weights is bound by)."""
        if self.bytes_read is None or self.us_per_step <= 0:
            return None
        return self.bytes_read / self.us_per_step / 1e3


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
    weight_bytes: int  # the active weights: what one step reads (a mixture: only its selected experts)
    copy_bandwidth: float  # bytes/s, device-to-device copy (read + write counted)
    total_weight_bytes: int | None = None  # every weight on the device (None: the same as weight_bytes)
    experts_selected: list[int] = field(default_factory=list)  # a mixture: distinct experts each MoE layer read
    experts_per_layer: int = 0  # a mixture: the experts each layer holds
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
        """Reading the active weights once (weight_bytes: every weight, but of a mixture's experts only those the step
        selected) at the copy's memory traffic (read + write bytes per second): a kernel that
        only reads moves its bytes through the same memory system, and the decode kernels reach well past half
        the copy figure (2,008 GB/s for Q4_K against a 2,998 GB/s copy on an NVIDIA H100 80GB HBM3), so half of
        it would be no floor."""
        return 1e6 * self.weight_bytes / self.copy_bandwidth if self.copy_bandwidth else 0.0

    @property
    def floor_ratio(self) -> float | None:
        """The graph step's time over the floor's."""
        return self.graph_us / self.floor_us if self.floor_us > 0 else None

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(kernels_us=self.kernels_us, floor_us=self.floor_us, host_us=self.host_us,
                   floor_ratio=self.floor_ratio)
        for k, kind in zip(out["kernels"], self.kernels):
            k.update(us_per_launch=kind.us_per_launch, gb_per_s=kind.gb_per_s)
        return out

    def weights_line(self) -> str:
        """Which weights the floor counts: all of them, or a mixture's active share."""
        total = self.total_weight_bytes
        if total is None or total == self.weight_bytes:
            return f"all {format_bytes(self.weight_bytes)} of weights"
        layers = self.experts_selected
        counts = f"{min(layers)}" if layers and min(layers) == max(layers) else \
            f"{min(layers)}-{max(layers)} (mean {statistics.fmean(layers):.1f})" if layers else ""
        experts = f", of each MoE layer's {self.experts_per_layer} experts the {counts} selected" if layers else ""
        return f"the active {format_bytes(self.weight_bytes)} of {format_bytes(total)} of weights{experts}"

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
            active = "" if self.total_weight_bytes in (None, self.weight_bytes) else "active "
            lines.append(f"the graph step ({self.graph_us:,.0f} us) is {self.floor_ratio:.2f}x the floor of "
                         f"{self.floor_us:,.0f} us ({format_bytes(self.weight_bytes)} of {active}weights read once at "
                         f"{self.copy_bandwidth / 1e9:,.0f} GB/s); the largest kind is {slow.name} at "
                         f"{slow.us_per_launch:.1f} us per launch")
        return lines


RESERVE_CHUNK = 256  # tokens a profiled sequence's KV is reserved at a time (a window group holds about that much more)


def decode_batch(cache, batch: int, context: int, seq_base: int = 10_000_000,
                 vocab_size: int | None = None) -> tuple[StepBatch, list[int]]:
    """A decode step of `batch` sequences each at position context - 1 (their KV reserved, contents as
    they are: a dense model's timing does not depend on them). With vocab_size, each sequence decodes a token of
    its own, so that a mixture's tokens route apart as a real batch's do; else all token 100. Returns the batch
    and the sequence ids to free."""
    ids = list(range(seq_base, seq_base + batch))
    tokens = [100 if vocab_size is None else (100 + 7919 * i) % vocab_size for i in range(batch)]
    cache.device.synchronize()  # the blocks released below may be read by nothing in flight
    for s in ids:
        cache.add_sequence(s)
        for start in range(0, context, RESERVE_CHUNK):
            if not cache.reserve(s, min(RESERVE_CHUNK, context - start)):
                raise RuntimeError(f"the KV cache has no room for {batch} sequences of {context} tokens")
            # a window group's blocks behind the window go back to its pool, as a prompt's chunks give them back
            cache.release_fenced()
    return build_step_batch(cache, [SeqSlice(s, [tok], context - 1, True) for s, tok in zip(ids, tokens)]), ids


def routed_experts(device, stream, plan) -> list[int | None]:
    """Runs the plan's launches once, in order; before each that reads experts by the step's routing (a mixture's
    expert launches), the number of distinct experts its routing buffer names. One entry per launch (None where the
    launch reads no experts). The routing buffer is shared by the layers, so it is read back before each launch. The
    rows that pad a batch to its decode bucket are routed too, and their experts read: they count."""
    selected: list[int | None] = []
    for entry in plan:
        launch = declared(entry)
        experts = launch.experts
        if experts is None:
            selected.append(None)
        else:
            ids = np.empty(experts.pairs, np.int32)
            stream.synchronize()
            device.copy_device_to_host(ids, experts.ids)
            selected.append(len(np.unique(ids)))
        launch[1]()
    stream.synchronize()
    return selected


@dataclass
class StepBytes:
    """The weight bytes of one step's launches: each launch's, the active total and the whole."""

    per_launch: list[int | None]  # None: the launch reads no weight
    active: int  # every weight, less the expert slices no token of the step selected
    total: int
    experts_selected: list[int]  # per expert launch of gate|up (one a MoE layer): distinct experts read
    experts_per_layer: int


def step_bytes(plan, selected: list[int | None], total: int) -> StepBytes:
    """What each launch of `plan` reads given routed_experts' counts, and the active weights (see StepBytes)."""
    per_launch: list[int | None] = []
    unread = 0
    layers, per_layer = [], 0
    for entry, count in zip(plan, selected, strict=True):
        launch = declared(entry)
        experts = launch.experts
        if experts is None:
            per_launch.append(launch.fixed_bytes() if launch.reads else None)
            continue
        read = experts.bytes_for(count)
        per_launch.append(launch.fixed_bytes() + read)
        unread += experts.bytes_for(experts.n_expert) - read
        per_layer = experts.n_expert
        if launch.label == "moe_gate_up":
            layers.append(count)
    return StepBytes(per_launch, total - unread, total, layers, per_layer)


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
    step, seq_ids = decode_batch(cache, batch, context, vocab_size=loaded.config.vocab_size)
    try:
        sampling = SamplingRows.greedy(batch)
        runner.execute_sampled(step, sampling)  # loads every kernel; captures the bucket's graph
        runner.execute_sampled(step, sampling)
        plan = runner.launch_plan(bucket, bucket, all_rows=True, with_sampling=True, decode=True)
        graph_us = device_us(device, stream, lambda: runner.graphs.run(bucket, lambda: None), reps)
        weights = step_bytes(plan, routed_experts(device, stream, plan), loaded.weights.nbytes)

        kinds: OrderedDict[str, list] = OrderedDict()
        kind_bytes: dict[str, int | None] = {}
        for (label, launch), nbytes in zip(plan, weights.per_launch):
            kinds.setdefault(label, []).append(launch)
            if nbytes is not None:
                kind_bytes[label] = kind_bytes.get(label, 0) + nbytes
        kernels = []
        for label, launches in kinds.items():
            with device.capture(stream) as cap:
                for launch in launches:
                    launch()
            try:
                kernels.append(KernelKind(label, len(launches), device_us(device, stream, lambda: cap.graph.launch(stream), reps),
                                          bytes_read=kind_bytes.get(label)))
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
        engine_step_us=engine_step_us, weight_bytes=weights.active, copy_bandwidth=bandwidth,
        total_weight_bytes=weights.total, experts_selected=weights.experts_selected,
        experts_per_layer=weights.experts_per_layer,
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
