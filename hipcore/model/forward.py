"""The forward pass over the paged KV cache, as a fixed sequence of op launches, for every model family.

The same code runs on every backend: on the cpu backend each launch runs the op's numpy reference,
on a GPU it launches the op's HIP kernel. Buffers are allocated once, sized for the largest step
(max_step_tokens tokens, max_seqs sequences, and the largest decode bucket), so addresses stay fixed:
a decode-only step replays a graph captured for its batch-size bucket (decode_graphs.py); prompt and
mixed steps of up to 128 tokens are padded to a few shapes and replay a graph from a shape's fourth step
(prompt_graphs.py); larger ones launch eagerly. Everything that changes per step lives in one buffer,
uploaded in one copy (step_inputs.py).

Per layer, the blocks of the model's family (hipcore/model/families/, over hipcore/model/blocks.py); the
llama layer, with the fused kernels when the weights allow them (projections.py picks fused_matvec for
steps of a few tokens, fused_matmul beyond, the single ops otherwise):
    q, k, v = rope(rmsnorm(x) @ [Wq; Wk; Wv])      1 launch (else rmsnorm, 3 products, 2 ropes)
    kv_store(k, v); attn = paged_attention(q)       2 launches (1 where the q|k|v launch stored k and v:
                                                    fused_qmatvec's decode steps into f16/bf16/f32 caches;
                                                    prompt steps' attention: prompt_attention where it takes them)
    x += attn @ Wo                                  1 launch (else product + add)
    h = silu(rmsnorm(x) @ Wg) * (rmsnorm(x) @ Wu)   1 launch (else rmsnorm, 2 products, silu_mul)
    x += h @ Wd                                     1 launch (else product + add)
Then the output head (the final norm folded into the vocabulary projection) on the rows that sample
(decode: every row) and, when the caller wants tokens, sampling on the device (hipcore/ops/sample.py).

A layer of a sliding-window group (the cache's local group) gets that group's cache view and step inputs
in its StepContext (its pool, slots and block tables); every other layer gets the cache and inputs
themselves, so a model without sliding windows runs exactly as before.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import numpy as np

from hipcore.errors import UnsupportedModelError
from hipcore.gguf.config import ModelConfig
from hipcore.kvcache.cache import KvCache
from hipcore.kvcache.config import GLOBAL_GROUP, LOCAL_GROUP
from hipcore.model.batch import StepBatch
from hipcore.model.activations import activation_sizes, step_capacity
from hipcore.model.blocks import StepContext
from hipcore.model.families import family_for, gpt_oss
from hipcore.model import yarn
from hipcore.model.moe_blocks import check_moe_weights, init_moe_buffers
from hipcore.model.decode_graphs import DecodeGraphs
from hipcore.model.launched_steps import LaunchedSteps, PendingStep
from hipcore.model.prompt_graphs import CAPTURE_AT_RUN, PromptGraphs, padded_shape, padded_shapes
from hipcore.model.step_inputs import StepInputs
from hipcore.model.weights import ModelWeights
from hipcore.model.projections import Launch, ProjectionPlanner
from hipcore.ops import embedding, kernel_choice, sample, select_rows
from hipcore.ops.kernel_choice import SWITCHES
from hipcore.ops.sample import SamplingRows
from hipcore.runtime.device import Buffer, Device, Stream

PLAN_CACHE_MAX_TOKENS = 128  # launch plans of decode steps up to this size are kept (decode buckets)
# Plans of other steps (prompts, prompt chunks, mixed steps) kept, the least recently used dropped first: a
# long prompt comes in chunks of max_step_tokens, all of one shape, and building a plan costs ~7 us a launch
# in Python (1.3 ms for the demo model's 183 launches of a 512-token step, on the cpu backend's host), time
# in which the device has nothing to run yet.
PROMPT_PLAN_CACHE_SIZE = 16  # (and the graphs of padded shapes, prompt_graphs.py: a server's mixed steps can take more than 8)


def check_device(config: ModelConfig, device: Device) -> None:
    """UnsupportedModelError (exit 4) where the model needs a kernel the device lacks: gpt-oss's attention sinks;
    UsageError (exit 2) where a numeric setting of the environment is bad (kernel_choice.check_settings). The loader
    asks before anything is allocated; the runner asks again."""
    kernel_choice.check_settings()
    if config.architecture == "gpt-oss":
        gpt_oss.check_backend(device)


class ModelRunner(LaunchedSteps):
    """Executes StepBatches for one model on one device: logits of the sampled rows, or their tokens.

    Steps run in launch order on one stream. launch_sampled/collect split a step so that the host can
    prepare the next one meanwhile; a decode step may follow the one before it on the device (its token ids
    are that step's tokens, copied there on the stream), so it can be launched before those tokens are read,
    and its sampling may wait for its rows' token masks (hipcore/model/launched_steps.py).
    """

    def __init__(self, device: Device, config: ModelConfig, weights: ModelWeights, cache: KvCache, *, max_step_tokens: int, max_seqs: int,
                 max_context: int | None = None, use_graphs: bool = True):
        if config.rope_scaling not in ("none", "linear", "yarn"):
            raise UnsupportedModelError(f"rope scaling {config.rope_scaling!r} is not supported yet (none, linear, yarn)")
        self.family = family_for(config.architecture)
        check_moe_weights(config, weights.layers)
        check_device(config, device)
        if weights.rope_pairs_adjacent:  # NEOX pairs uploaded side by side (weights.py, NEOX_AS_NORM): NORM mode
            config = dataclasses.replace(config, rope_type="norm")
        self.device, self.config, self.weights, self.cache = device, config, weights, cache
        self.max_step_tokens, self.max_seqs = max_step_tokens, max_seqs
        block_size = cache.config.block_size
        self.max_blocks = -(-min(max_context or config.context_length, config.context_length) // block_size)
        self.token_capacity, self.row_capacity = step_capacity(max_step_tokens, max_seqs)
        self.stream = device.default_stream
        # YaRN: its frequencies are the uploaded divisors (weights.rope_freqs) and its magnitude m scales q and k,
        # so every score by m^2 (yarn.py)
        self.scale = config.attention_scale * yarn.magnitude(config) ** 2
        self.freq_scale = 1.0 / config.rope_scaling_factor if config.rope_scaling == "linear" else 1.0
        self.buffers: dict[str, Buffer] = {}
        self.inputs: StepInputs | None = None
        self.graphs = DecodeGraphs(device, self.stream, max_seqs, capture=use_graphs)
        # decode steps with constrained rows: the same buckets' launches up to the logits; their sample launch,
        # reading the token masks, comes after (at once, or once the masks are known: launch_before_masks)
        self.forward_graphs = DecodeGraphs(device, self.stream, max_seqs, capture=use_graphs)
        # Prompt and mixed steps padded to recurring shapes, replayed from graphs (off: ROCMFORGE_PROMPT_GRAPHS=0)
        self.pad_prompt_steps = SWITCHES.prompt_graphs
        self.prompt_graphs = PromptGraphs(device, self.stream, capture=use_graphs)
        self._outstanding: list[PendingStep] = []  # launched, not collected, in launch order
        # (before anything that may fail: close() clears them)
        self._plans: dict[tuple[int, int, bool, bool, bool], list[Launch]] = {}
        self._prompt_plans: OrderedDict[tuple[int, int, bool, bool, bool], list[Launch]] = OrderedDict()
        self._read_stream = self._kept_event = None
        try:
            # collect() of a step whose tokens were kept reads them on a stream of its own, after the event:
            # on the runner's stream the read would wait for the step launched after it.
            self._read_stream = device.create_stream()
            self._kept_event = device.create_event()
            window_group = LOCAL_GROUP in cache.groups
            sizes = activation_sizes(config, max_step_tokens, max_seqs, self.max_blocks, block_size, window_group)
            for name, (nbytes, tag) in sizes.items():
                if name.startswith("step_inputs"):  # StepInputs allocates its own
                    continue
                self.buffers[name] = device.allocate(nbytes, tag=tag, label=f"runner.{name}")
            for name in ("attention_workspace", "matmul_workspace", "sample_workspace"):
                if name in self.buffers:
                    self.buffers[name].fill(0)  # the kernels keep their counters at zero from here on
            init_moe_buffers(self.buffers)
            self.inputs = StepInputs(device, tokens=self.token_capacity, rows=self.row_capacity,
                                     seqs=max(max_seqs, self.row_capacity), max_blocks=self.max_blocks,
                                     window_group=window_group)
        except BaseException:
            self.close()
            raise
        factors = weights.rope_freqs.buffer if weights.rope_freqs is not None else None
        self.products = ProjectionPlanner(device, self.stream, config, self.buffers, self.freq_scale, factors)

    def close(self) -> None:
        """Destroy the decode graphs and free every buffer; idempotent."""
        self.graphs.close()
        self.forward_graphs.close()
        self.prompt_graphs.close()
        self._plans.clear()
        self._prompt_plans.clear()
        self._outstanding.clear()
        for handle in (self._kept_event, self._read_stream):
            if handle is not None:
                handle.destroy()
        self._kept_event = self._read_stream = None
        if self.inputs is not None:
            self.inputs.close()
            self.inputs = None
        for buf in self.buffers.values():
            if not buf.freed:
                buf.free()
        self.buffers.clear()

    # ---- one step -----------------------------------------------------------------------------

    def execute(self, batch: StepBatch) -> np.ndarray:
        """float32 logits [len(batch.sample_rows), vocab] of the rows that sample."""
        self._check_none_outstanding()
        rows, all_rows = self._run(batch, None, want_tokens=False)
        return self._download_rows(self.buffers["logits"], batch, rows, all_rows, self.config.vocab_size, np.float32)

    def _run(self, batch: StepBatch, sampling: SamplingRows | None, *, want_tokens: bool,
             token_ids_from: Buffer | None = None, masks_later: bool = False) -> tuple[int, bool]:
        """Stage and launch one step; returns (logits rows computed, whether they are all token rows)."""
        n, s, r = batch.num_tokens, batch.num_seqs, int(batch.sample_rows.shape[0])
        if n > self.max_step_tokens or s > self.max_seqs:
            raise ValueError(f"step of {n} tokens / {s} sequences exceeds the runner's {self.max_step_tokens} / {self.max_seqs}")
        if batch.block_tables.shape[1] > self.max_blocks:
            raise ValueError(f"block tables of {batch.block_tables.shape[1]} blocks exceed the runner's {self.max_blocks}")
        kv = self.cache.config
        batch.validate(kv.block_size, kv.num_blocks, kv.window_blocks if LOCAL_GROUP in self.cache.groups else None)
        assert self.inputs is not None, "the runner is closed"
        decode = batch.is_decode_only
        if masks_later or (sampling is not None and sampling.mask is not None):
            assert sampling is not None
            return self._run_masked(batch, sampling, decode, token_ids_from, masks_later)
        bucket = self.graphs.bucket_for(n) if decode else None
        if bucket is not None:
            self.inputs.pack(batch, padded_tokens=bucket, all_rows=True, sampling=sampling, stream=self.stream)
            self._take_token_ids(token_ids_from, n)
            plan = self.launch_plan(bucket, bucket, all_rows=True, with_sampling=True, decode=True)
            self.graphs.run(bucket, lambda: _run_all(plan))
            return bucket, True
        padded = None if decode or not self.pad_prompt_steps else self.padded_prompt_shape(n, r)
        if padded is not None:
            t, rows = padded
            self.inputs.pack(batch, padded_tokens=t, all_rows=False, sampling=sampling, stream=self.stream,
                             padded_rows=rows)
            self._take_token_ids(token_ids_from, n)
            plan = self.launch_plan(t, rows, all_rows=False, with_sampling=want_tokens, decode=False)
            self.prompt_graphs.run((t, rows, False, want_tokens, False), lambda: _run_all(plan))
            return rows, False
        self.inputs.pack(batch, padded_tokens=n, all_rows=decode, sampling=sampling, stream=self.stream)
        self._take_token_ids(token_ids_from, n)
        rows = n if decode else r
        _run_all(self.launch_plan(n, rows, all_rows=decode, with_sampling=want_tokens, decode=decode))
        return rows, decode

    def _run_masked(self, batch: StepBatch, sampling: SamplingRows, decode: bool, token_ids_from: Buffer | None,
                    masks_later: bool) -> tuple[int, bool]:
        """A step with constrained rows: the sample launch takes their token masks (all ones for the other rows).
        A decode step is padded to its bucket and replays that bucket's forward graph (its launches up to the
        logits), then the masked sample launch: at once, or once the masks are given (launch_before_masks). (32
        constrained streams beside 32 free ones on the Llama-3.1-8B shape ran their steps eagerly at 24 against
        13 ms on an NVIDIA H100.) A prompt step runs unpadded and eagerly."""
        n, r = batch.num_tokens, int(batch.sample_rows.shape[0])
        bucket = self.graphs.bucket_for(n) if decode else None
        rows = bucket or (n if decode else r)
        assert self.inputs is not None
        if not masks_later:
            self._upload_mask(batch, sampling.mask, rows)
        if not decode:
            self.inputs.pack(batch, padded_tokens=n, all_rows=False, sampling=sampling, stream=self.stream)
            self._take_token_ids(token_ids_from, n)
            _run_all(self.launch_plan(n, r, all_rows=False, with_sampling=True, decode=False, masked=True))
            return r, False
        self.inputs.pack(batch, padded_tokens=rows, all_rows=True, sampling=sampling, stream=self.stream)
        self._take_token_ids(token_ids_from, n)
        plan = self.launch_plan(rows, rows, all_rows=True, with_sampling=False, decode=True)
        if bucket is not None:
            self.forward_graphs.capture = self.graphs.capture  # bench --no-graphs turns both off
            self.forward_graphs.run(bucket, lambda: _run_all(plan))
        else:
            _run_all(plan)
        if not masks_later:
            self._sample_launch(rows, masked=True)[1]()
        return rows, True

    def _upload_mask(self, batch: StepBatch, mask: np.ndarray | None, rows: int,
                     stream: Stream | None = None) -> None:
        """The step's token masks [sample rows, words] into the token_mask buffer's first `rows` rows (on `stream`,
        else the runner's; a decode step's padding rows all ones)."""
        r, words = int(batch.sample_rows.shape[0]), sample.mask_words(self.config.vocab_size)
        if mask is None or mask.shape != (r, words):
            raise ValueError(f"token mask of shape {None if mask is None else mask.shape} for {r} rows of "
                             f"{self.config.vocab_size} logits")
        if rows != r:  # decode: row i is token i, the sample rows among them; padding rows all ones
            full = np.full((rows, words), 0xFFFFFFFF, dtype=np.uint32)
            full[batch.sample_rows] = mask
            mask = full
        self._mask_upload = np.ascontiguousarray(mask, dtype=np.uint32)  # kept until the copy is done
        self.device.copy_host_to_device(self.buffers["token_mask"], self._mask_upload, stream=stream or self.stream)

    def padded_prompt_shape(self, tokens: int, rows: int) -> tuple[int, int] | None:
        """(token rows, logits rows) of a prompt or mixed step as this runner runs it (None: unpadded)."""
        return padded_shape(tokens, rows, self.token_capacity, self.row_capacity)

    def fill_prompt_caches(self) -> int:
        """Bring the kept prompt-step plans and their graphs to their bound (leak-check's warm-up, as the
        tokenizer's fill_piece_caches: what a long run fills later is no leak). Runs steps of padding alone
        (nothing stored, nothing read back) at up to PROMPT_PLAN_CACHE_SIZE + 1 padded shapes, sampling on the
        device and not (the engine takes either per step), each until its graph is captured. Returns
        the shapes run. Only between steps: nothing may be outstanding."""
        self._check_none_outstanding()
        assert self.inputs is not None, "the runner is closed"
        if not self.pad_prompt_steps:
            return 0
        shapes = [(t, rows, want_tokens) for t, rows in padded_shapes(self.token_capacity, self.row_capacity)
                  for want_tokens in (True, False)][:PROMPT_PLAN_CACHE_SIZE + 1]
        for t, rows, want_tokens in shapes:
            self.inputs.pack_padding(t, rows, stream=self.stream)
            for _ in range(CAPTURE_AT_RUN):
                plan = self.launch_plan(t, rows, all_rows=False, with_sampling=want_tokens, decode=False)
                self.prompt_graphs.run((t, rows, False, want_tokens, False), lambda: _run_all(plan))
        self.stream.synchronize()
        return len(shapes)

    def _take_token_ids(self, source: Buffer | None, n: int) -> None:
        """The step's first n token ids from `source` on the device, over the uploaded ones (on the stream)."""
        if source is not None:
            assert self.inputs is not None
            self.device.copy_device_to_device(self.inputs.buffer, source, 4 * n,
                                              dst_offset=4 * self.inputs.offsets["token_ids"], stream=self.stream)

    # ---- the launch sequence ------------------------------------------------------------------

    def launch_plan(self, t: int, r: int, *, all_rows: bool, with_sampling: bool, decode: bool,
                    masked: bool = False) -> list[Launch]:
        """The step's launches, in order, for t token rows whose logits are wanted at r rows (all_rows:
        r == t and row i is token i; else rows listed in the step inputs' sample_rows); decode: every
        token is its own sequence's next token. Plans are kept per shape: every decode plan (their shapes are
        few, one per batch size), and the PROMPT_PLAN_CACHE_SIZE most recently used of the others, which come in
        every (tokens, rows) shape (kept without a bound, they grew for thousands of requests: leak-check saw
        ~20 MiB per 1,000 requests on the demo model). masked: the sample launch takes the token masks."""
        key = (t, r, all_rows, with_sampling, decode)  # decode changes the plan (the attention op)
        if masked:
            key += ("masked",)
        kept = self._plans if decode and t <= PLAN_CACHE_MAX_TOKENS else self._prompt_plans
        plan = kept.get(key)
        if plan is None:
            plan = self._build_plan(t, r, all_rows, with_sampling, decode, masked)
            kept[key] = plan
            if len(self._prompt_plans) > PROMPT_PLAN_CACHE_SIZE:
                dropped, _ = self._prompt_plans.popitem(last=False)
                if len(dropped) == 5:  # a shape's graph goes with its plan (masked plans have none)
                    self.prompt_graphs.drop(dropped)
        elif kept is self._prompt_plans:
            self._prompt_plans.move_to_end(key)
        return plan

    def _build_plan(self, t: int, r: int, all_rows: bool, with_sampling: bool, decode: bool,
                    masked: bool = False) -> list[Launch]:
        cfg, w, b, dev, st = self.config, self.weights, self.buffers, self.device, self.stream
        inputs, products = self.inputs, self.products
        assert inputs is not None
        h, v = cfg.hidden_size, cfg.vocab_size
        ids = inputs.addr("token_ids")
        ctx = StepContext(dev, st, cfg, b, self.cache, inputs, products, self.max_blocks, self.scale, decode)
        contexts = {GLOBAL_GROUP: ctx}
        if LOCAL_GROUP in self.cache.groups:  # sliding-window layers: their group's pool, slots and tables
            contexts[LOCAL_GROUP] = dataclasses.replace(ctx, cache=self.cache.group_view(LOCAL_GROUP),
                                                        inputs=inputs.for_group(LOCAL_GROUP))
        plan: list[Launch] = [("embedding", lambda: embedding.launch(
            dev, st, b["x"], w.token_embd.buffer, ids, t, h, v, w.token_embd.fmt))]
        plan += self.family.input_launches(ctx, t)

        for i, lw in enumerate(w.layers):
            plan += self.family.layer_launches(contexts[self.cache.config.layer_group(i)], i, lw, t)

        if r == 0:  # a step of prompt chunks only: nothing samples, so no logits are computed
            return plan
        rows = b["x"]
        if not all_rows:
            plan.append(("select_rows", lambda: select_rows.launch(
                dev, st, b["rows"], b["x"], inputs.addr("sample_rows"), r, h, t)))
            rows = b["rows"]
        plan += products.head(w.output, w.output_norm, rows, r)
        plan += self.family.output_launches(ctx, r)  # e.g. gemma2's final logit soft-capping
        if with_sampling:
            plan.append(self._sample_launch(r, masked))
        return plan

    def _sample_launch(self, r: int, masked: bool) -> Launch:
        """Sampling the r logits rows on the device into the tokens buffer (masked: under the token masks)."""
        dev, st, b, inputs, v = self.device, self.stream, self.buffers, self.inputs, self.config.vocab_size
        assert inputs is not None
        return ("sample", lambda: sample.launch(dev, st, b["tokens"], b["logits"], inputs.addr("sampling"), r, v,
                                                b.get("sample_workspace"), b["token_mask"] if masked else None))


def _run_all(plan: list[Launch]) -> None:
    for _, launch in plan:
        launch()
