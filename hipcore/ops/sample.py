"""sample: pick each row's next token on the device, by the host sampler's rules (hipcore/engine/sampler.py).
The numpy filters below (top-k, top-p, min-p, softmax) are this op's reference and the host sampler's math.

Kernel `sample_f32(out p, logits p, params p, vocab i, workspace p, chunks i, mask p)` (kernels/sample.hip):
logits float32 [rows, vocab], params float32 [rows, 5] = (temperature, top_k, top_p, min_p, uniform), out int32
[rows]; grid = rows * chunks. mask: 0 (none), or uint32 [rows, mask_words(vocab)], a grammar's allowed tokens
per row in llguidance's packed layout (token t is bit t % 32 of word t // 32; an unconstrained row's words all
ones): the kernel sets each forbidden logit to -inf, in place, before it samples. A greedy row, a row with a top_k of at most SPLIT_TOP_K, and a whole-vocabulary
row without min-p (see below), is split over its `chunks` workgroups when there is a workspace (zeroed once when allocated, at least
workspace_bytes(rows, chunks); the kernel leaves its counters at zero after every launch; launches that
share one run one after another), every other row is one workgroup's (the others of its chunks return at
once). temperature <= 0 is greedy (numpy's argmax); otherwise top-k, top-p,
min-p and temperature in llama.cpp's order, then the uniform (drawn on the host from the request's
seeded generator, exactly one per token as Sampler.sample draws it) picks against the cumulative
distribution. The same seed therefore gives the same tokens as the host sampler, up to float32
rounding where a cumulative sum meets its threshold (the host works in float64).

No top-k and no top-p (top_k <= 0, top_p >= 1: OpenAI's and vLLM's defaults) is the whole vocabulary: nothing
then needs the candidates in order, so the draw runs over every token (min-p applied) in token-id order, with
no sort, on the host and on the device alike (whole_vocabulary).

What stays on the host (the engine's device_samplable says so): penalties (they need the token history), and
a top_k above MAX_TOP_K, or of 0 with top_p < 1 (they need a sort of the whole vocabulary).

Ties: among logits equal to the k-th largest the device keeps the lowest token ids and orders equal
logits by id; the host's top_k_filter leaves that order to numpy's argpartition. Real logits rarely
tie exactly; the reference below states the device's rule.
"""

from __future__ import annotations

from dataclasses import dataclass
import itertools
import math
from typing import Any, Protocol, Sequence

import numpy as np

from hipcore.ops.launch_checks import INT32_MAX, check_memory, check_sizes, row_block
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Buffer, Device, Dim3, Stream
from hipcore.runtime.kernels import get_kernel

OP = "sample"
ENTRY = "sample_f32"
SIGNATURE = "pppipip"
PARAMS_PER_ROW = 5  # temperature, top_k, top_p, min_p, uniform
MAX_TOP_K = 1024  # the kernel's shared-memory candidate capacity (kMaxTopK)
SPLIT_TOP_K = 64  # rows with top_k up to this are split over the chunks with a workspace (kSplitTopK)
MAX_THREADS = 1024
# A greedy row's logits per workgroup: 4,096 (16 KiB, four a thread of a 1,024-thread workgroup); Llama 3's
# 128,256 take 32 workgroups instead of one, which alone read them in 16 us on an NVIDIA H100 (latency-bound
# on one SM). At most MAX_CHUNKS, so that the last workgroup's pick among the chunks' stays one load a thread.
CHUNK_LOGITS = 4096
MAX_CHUNKS = 64
COUNTER_BYTES_ALIGNMENT = 256  # kernels/sample.hip: kCounterBytesAlignment


def chunks_for(vocab: int) -> int:
    """Workgroups a greedy row of `vocab` logits is split over."""
    return max(1, min(MAX_CHUNKS, -(-vocab // CHUNK_LOGITS)))


def mask_words(vocab: int) -> int:
    """uint32 words of one row's token mask."""
    return -(-vocab // 32)


def unpack_mask(mask: np.ndarray, vocab: int) -> np.ndarray:
    """bool [rows, vocab] of packed uint32 [rows, mask_words(vocab)] masks: may each token come next."""
    words = np.ascontiguousarray(np.asarray(mask, dtype=np.uint32).reshape(-1, mask_words(vocab)))
    return np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :vocab].astype(bool)


def apply_mask(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The logits [rows, vocab] with every token the packed mask forbids at -inf (a copy)."""
    logits = np.asarray(logits, dtype=np.float32)
    return np.where(unpack_mask(mask, logits.shape[-1]).reshape(logits.shape), logits, np.float32(-np.inf))


def workspace_bytes(rows: int, chunks: int) -> int:
    """Bytes of the split rows' workspace: a counter a row (padded), then a value, an id and a sum a chunk, then
    SPLIT_TOP_K candidates (a value and an id) a chunk."""
    if chunks <= 1:
        return 0
    counters = -(-rows * 4 // COUNTER_BYTES_ALIGNMENT) * COUNTER_BYTES_ALIGNMENT
    return counters + rows * chunks * (12 + SPLIT_TOP_K * 8)


def workspace_size(max_rows: int, vocab: int) -> int:
    """Bytes of a workspace with which every launch of up to max_rows rows splits its rows (those it splits)."""
    return workspace_bytes(max_rows, chunks_for(vocab))


class RowParams(Protocol):
    """What a row's sampling needs of a request's parameters (the engine's SamplingParams has it)."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    greedy: bool


@dataclass
class SamplingRows:
    """The per-row sampling inputs of one step, in sample-row order."""

    temperature: np.ndarray  # float32 [R]; <= 0 means greedy
    top_k: np.ndarray  # int32 [R]
    top_p: np.ndarray  # float32 [R]
    min_p: np.ndarray  # float32 [R]
    uniform: np.ndarray  # float64 [R]: the draw in [0, 1) of each non-greedy row
    # uint32 [R, mask_words(vocab)]: the rows' packed token masks (a grammar's allowed tokens; all ones for an
    # unconstrained row), or None when no row is constrained
    mask: np.ndarray | None = None

    @classmethod
    def build(cls, params: Sequence[RowParams], uniforms: Sequence[float]) -> "SamplingRows":
        return cls(
            np.array([0.0 if p.greedy else p.temperature for p in params], dtype=np.float32),
            np.array([p.top_k for p in params], dtype=np.int32),
            np.array([p.top_p for p in params], dtype=np.float32),
            np.array([p.min_p for p in params], dtype=np.float32),
            np.asarray(uniforms, dtype=np.float64),
        )

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[float, int, float, float, float]]) -> "SamplingRows":
        """From one (temperature, top_k, top_p, min_p, uniform) tuple per row (temperature 0 for a greedy row):
        what build() makes, in one conversion of the whole table instead of one per column (the engine makes
        these every decode step)."""
        table = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.float64, count=PARAMS_PER_ROW * len(rows))
        table = table.reshape(len(rows), PARAMS_PER_ROW)
        # float64 holds every int32 top_k exactly, and rounding a float64 to float32 is what build() does
        return cls(table[:, 0].astype(np.float32), table[:, 1].astype(np.int32), table[:, 2].astype(np.float32),
                   table[:, 3].astype(np.float32), table[:, 4].copy())

    @classmethod
    def greedy(cls, rows: int) -> "SamplingRows":
        zeros = np.zeros(rows, dtype=np.float32)
        return cls(zeros, np.zeros(rows, dtype=np.int32), zeros + 1, zeros, np.zeros(rows))

    def __len__(self) -> int:
        return int(self.temperature.shape[0])

    def pack_into(self, out: np.ndarray) -> None:
        """Write the rows into float32 out [R, PARAMS_PER_ROW] (the kernel's params layout)."""
        out[:, 0] = self.temperature
        out[:, 1] = self.top_k
        out[:, 2] = self.top_p
        out[:, 3] = self.min_p
        out[:, 4] = self.uniform


# ---- reference -----------------------------------------------------------------------------------
# The filters: each takes candidate (ids, logits) and returns the kept subset.

def top_k_filter(ids: np.ndarray, logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep the k largest logits, sorted descending (k <= 0 keeps all, still sorted)."""
    if 0 < k < logits.shape[0]:
        part = np.argpartition(-logits, k - 1)[:k]
        ids, logits = ids[part], logits[part]
    order = np.argsort(-logits, kind="stable")
    return ids[order], logits[order]


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits.astype(np.float64) - np.max(logits))
    return shifted / shifted.sum()


def top_p_filter(ids: np.ndarray, logits: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    """Keep the shortest prefix (of candidates sorted descending) whose probability reaches p."""
    if p >= 1.0:
        return ids, logits
    cumulative = np.cumsum(softmax(logits))
    keep = int(np.searchsorted(cumulative, p, side="left")) + 1
    keep = min(keep, logits.shape[0])
    return ids[:keep], logits[:keep]


def min_p_filter(ids: np.ndarray, logits: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    """Keep tokens whose probability is at least p times the best one's (in logit space)."""
    if p <= 0.0:
        return ids, logits
    keep = logits >= np.max(logits) + math.log(p)
    return ids[keep], logits[keep]




def whole_vocabulary(top_k: int, top_p: float) -> bool:
    """True when no filter needs the candidates sorted (no top-k, no top-p): the draw then runs over the
    whole vocabulary in token-id order, which needs no sort (a sort of 50k-250k logits per token is what
    made plain temperature sampling slow on the host, and what the device kernel has no room for)."""
    return int(top_k) <= 0 and float(top_p) >= 1.0


def pick(logits: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float, uniform: float) -> int:
    """The token of one row: Sampler.sample's chain (no penalties) with the draw given, and the device's
    tie rule for the top-k candidates (by logit descending, then token id ascending)."""
    logits = np.asarray(logits, dtype=np.float32)
    if temperature <= 0:
        return int(np.argmax(logits))
    if whole_vocabulary(top_k, top_p):
        ids, kept = np.arange(logits.shape[0]), logits
    else:
        k = max(1, min(int(top_k), logits.shape[0]))
        ids = np.argsort(-logits, kind="stable")[:k]
        kept = logits[ids]
        ids, kept = top_p_filter(ids, kept, float(top_p))
    ids, kept = min_p_filter(ids, kept, float(min_p))
    cumulative = np.cumsum(softmax(kept / np.float32(temperature)))
    at = int(np.searchsorted(cumulative, float(uniform) * cumulative[-1], side="right"))
    return int(ids[min(at, ids.shape[0] - 1)])


def reference(logits: np.ndarray, params: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """int32 [rows] for logits [rows, vocab] and params [rows, PARAMS_PER_ROW], with the packed token mask
    uint32 [rows, mask_words(vocab)] applied first where given."""
    if mask is not None:
        logits = apply_mask(logits, mask)
    params = np.asarray(params, dtype=np.float64).reshape(-1, PARAMS_PER_ROW)
    return np.array([pick(row, t, int(k), p, m, u) for row, (t, k, p, m, u) in zip(np.asarray(logits), params)],
                    dtype=np.int32)


@cpu_kernel(ENTRY, SIGNATURE)
def _host(device: CpuDevice, grid: Dim3, block: Dim3, out: int, logits: int, params: int, vocab: int, workspace: int,
          chunks: int, mask: int) -> None:
    rows = grid[0] // chunks
    x = device.view(logits, np.float32, (rows, vocab))
    if mask:  # in place, as the kernel does
        x[:] = apply_mask(x, device.view(mask, np.uint32, (rows, mask_words(vocab))))
    device.view(out, np.int32, rows)[:] = reference(x, device.view(params, np.float32, (rows, PARAMS_PER_ROW)))


def launch(device: Device, stream: Stream | None, out: Any, logits: Any, params: Any, rows: int, vocab: int,
           workspace: Buffer | None = None, mask: Any = None) -> None:
    """out[rows] = the picked token of each row of logits [rows, vocab] under params [rows, 5], among the tokens
    the packed mask uint32 [rows, mask_words(vocab)] allows where one is given (its forbidden logits are set to
    -inf in place). With a
    workspace (zeroed once after allocation, workspace_size(...) bytes or more) greedy rows, rows with a top_k
    of at most SPLIT_TOP_K and whole-vocabulary rows without min-p are split over chunks_for(vocab)
    workgroups; without one, or one too small for `rows`, every row is one workgroup's."""
    check_sizes(OP, rows=rows, vocab=vocab)
    check_memory(OP, "out", out, rows * 4)
    check_memory(OP, "logits", logits, rows * vocab * 4)
    check_memory(OP, "params", params, rows * PARAMS_PER_ROW * 4)
    if mask is not None:
        check_memory(OP, "mask", mask, rows * mask_words(vocab) * 4)
    chunks = chunks_for(vocab)
    if workspace is not None and not isinstance(workspace, Buffer):
        raise ValueError(f"{OP}: workspace must be a Buffer (its size decides whether greedy rows are split)")
    if workspace is None or workspace.nbytes < workspace_bytes(rows, chunks):
        chunks = 1
    if rows * chunks > INT32_MAX:
        raise ValueError(f"{OP}: {rows} rows need {rows * chunks} workgroups, more than a launch takes")
    # programmatic: the entry waits for the kernel ahead first (hip_compat.h: rf_grid_dependency_sync)
    kernel = get_kernel(device, OP, ENTRY, SIGNATURE, programmatic=True)
    kernel.launch(rows * chunks, row_block(vocab, MAX_THREADS),
                  (out, logits, params, vocab, workspace if chunks > 1 else 0, chunks, 0 if mask is None else mask), stream=stream)
