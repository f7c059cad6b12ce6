"""paged_attention: causal grouped-query attention that reads K and V through block tables.

One op serves prompt evaluation and decode alike: every query token attends to the keys of its
own sequence at positions 0..its own position (its own K/V is written by kv_store first). A token
with a negative position is padding: its output rows are zero. With a sliding window (`window` > 0,
Gemma's local layers) a token at position p sees only positions p - window < j <= p (llama.cpp's
LLAMA_SWA_TYPE_STANDARD: the window counts the token itself); keys before the window are never read, and
the block-table entries wholly before it may hold anything (the KV cache frees those blocks). With a soft
cap (`softcap` > 0, Gemma 2) every scaled score S becomes softcap * tanh(S / softcap) before the softmax.
With sinks (gpt-oss's attn_sinks: float32 [n_heads], one logit per query head) every softmax has one more term in
its denominator, exp(sink - m) with m the largest of the scores and the sink, and nothing more in its sum of values
(ggml's soft_max with sinks). The sink entries, `paged_attention_<kv dtype>[_softcap]_sinks` (the signature below and
`sinks p` last), run on every backend (kernels/paged_attention.hip adds the sink in the merge of a token's keys, or in
the combine of its splits).

Kernels `paged_attention_<kv dtype>` (f16, bf16, f32, q8_0; kernels/paged_attention.hip), and
`paged_attention_<kv dtype>_softcap` for a soft cap (its own entry points, so that the kernels without one
compile as if it did not exist), with the signature
    (out p, q p, k_pool p, v_pool p, block_tables p, token_seq p, positions p, workspace p,
     n_tokens i, n_heads i, n_kv_heads i, head_dim i, block_size i, max_blocks i, num_blocks i, slots i,
     window i, scale f, softcap f)
q, out: float32 [n_tokens, n_heads, head_dim] (out may be q); pools: [num_blocks, n_kv_heads,
block_size, row_bytes] (the KvCache layout); block_tables: int32 [n_seqs, max_blocks]; token_seq,
positions: int32 [n_tokens]. Query head h reads KV head h // (n_heads / n_kv_heads), as llama.cpp does.

Geometry (1-D grid): `slots` workgroups of 4 warps per (token, KV head); the kernel makes each token's
plan from its own context length, which is what lets a graph captured once serve every later step:
- a launch of at most 64 (token, query head) pairs (a decode step of a few sequences) gives a token of
  at most 512 keys one workgroup per query head (slots >= the group size);
- otherwise a workgroup serves a chunk of at most 4 of the group's query heads, and a token's keys are
  split among up to slots / chunks workgroups (this launcher picks how many: enough workgroups to
  fill a GPU, none once the tokens alone fill it, no more splits than the longest context has
  128-key pieces). Splitting needs a workspace for the partial results and a counter per (token, KV
  head, chunk): a Buffer of at least `workspace_size(...)` bytes, zeroed once when allocated
  (Buffer.fill(0)); the kernel leaves its counters at zero after every launch. Launches that share a
  workspace must run one after another (one stream). Without a workspace no keys are split.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hipcore.kvcache.dtypes import KV_DTYPES, KvDtype
from hipcore.ops.launch_checks import INT32_MAX, check_memory, check_sizes
from hipcore.runtime.cpu import CpuDevice, cpu_kernel
from hipcore.runtime.device import Buffer, Device, Stream
from hipcore.runtime.errors import DeviceError
from hipcore.runtime.kernels import get_kernel, wavefront_size

OP = "paged_attention"
SIGNATURE = "pppppppp iiiiiiiii ff"
WARPS = 4  # per workgroup: the kernel's launch bounds
MAX_GROUP_HEADS = 4  # query heads a workgroup serves
MAX_HEAD_DIM = 256  # 8 elements per lane, 32 lanes per key at most
MIN_KEYS_PER_SPLIT = 128  # the kernel's kMinKeysPerSplit
MAX_SPLITS = 64  # the kernel's kMaxSplits
SPREAD_MAX_CONTEXT = 512  # the kernel's kSpreadMaxContext
SPREAD_MAX_WORKGROUPS = 64  # the kernel's kSpreadMaxWorkgroups
# Splits stop once the (token, KV head, chunk) workgroups alone reach this: a split costs a fence, an
# atomic and a combine, which measured slower than unsplit work at 64 sequences (H100, 132 SMs).
TARGET_WORKGROUPS = 256
COUNTER_BYTES_ALIGNMENT = 256
POOL_ALIGNMENT = {"f16": 16, "bf16": 16, "f32": 16, "q8_0": 2}  # the widest aligned load of a row
Q_ALIGNMENT = 16  # q is read with 16-byte loads


def first_visible(positions: np.ndarray, window: int) -> np.ndarray:
    """int64: the first key position each token attends to (0 without a window)."""
    pos = np.asarray(positions, dtype=np.int64)
    return np.maximum(pos - window + 1, 0) if window > 0 else np.zeros_like(pos)


def reference(q: np.ndarray, k_pool: np.ndarray, v_pool: np.ndarray, fmt: KvDtype, block_tables: np.ndarray,
              token_seq: np.ndarray, positions: np.ndarray, scale: float, window: int = 0,
              softcap: float = 0.0, sinks: np.ndarray | None = None) -> np.ndarray:
    """float32 [T, n_heads, head_dim]. Pools are uint8 [num_blocks, n_kv_heads, block_size, row_bytes].
    window > 0: each token sees its last `window` positions (itself included); only their blocks are read.
    softcap > 0: the scaled scores are capped, softcap * tanh(S / softcap), before the softmax.
    sinks: float32 [n_heads], a logit per query head added to every softmax's denominator."""
    n_tokens, n_heads, head_dim = q.shape
    num_blocks, n_kv_heads, block_size, _ = k_pool.shape
    if n_heads % n_kv_heads:
        raise DeviceError(f"paged_attention: {n_heads} query heads do not group over {n_kv_heads} KV heads")
    group = n_heads // n_kv_heads
    out = np.zeros((n_tokens, n_heads, head_dim), dtype=np.float32)
    token_seq, positions = np.asarray(token_seq), np.asarray(positions)
    real = positions >= 0  # padding tokens keep zero rows
    for s in np.unique(token_seq[real]):
        idx = np.nonzero((token_seq == s) & real)[0]
        pos = positions[idx].astype(np.int64)
        ctx = int(pos.max()) + 1
        n_blk = -(-ctx // block_size)
        if n_blk > block_tables.shape[1]:
            raise DeviceError(f"paged_attention: position {ctx - 1} is past the block table of {block_tables.shape[1]} blocks")
        first = first_visible(pos, window)
        first_blk = int(first.min()) // block_size  # blocks wholly before every token's window are not read
        blocks = block_tables[s, first_blk:n_blk].astype(np.int64)
        if blocks.min() < 1 or blocks.max() >= num_blocks:
            raise DeviceError(f"paged_attention: sequence {int(s)} reads block outside [1, {num_blocks})")
        # [n_blk, n_kv, bs, hd] -> [n_kv, keys from first_blk * block_size to ctx, hd]
        base = first_blk * block_size
        k = fmt.decode(k_pool[blocks], head_dim).transpose(1, 0, 2, 3).reshape(n_kv_heads, -1, head_dim)[:, :ctx - base]
        v = fmt.decode(v_pool[blocks], head_dim).transpose(1, 0, 2, 3).reshape(n_kv_heads, -1, head_dim)[:, :ctx - base]
        qs = q[idx].reshape(len(idx), n_kv_heads, group, head_dim).transpose(1, 2, 0, 3)  # [kv, g, n, hd]
        scores = np.einsum("kgnd,kcd->kgnc", qs, k, dtype=np.float64) * scale
        if softcap > 0:
            scores = softcap * np.tanh(scores / softcap)
        key_pos = np.arange(base, ctx)[None, :]
        scores[..., (key_pos > pos[:, None]) | (key_pos < first[:, None])] = -np.inf
        top = scores.max(axis=-1, keepdims=True)
        if sinks is not None:  # [kv, g, 1, 1]: query head kv * group + g's logit
            sink = np.asarray(sinks, dtype=np.float64).reshape(n_kv_heads, group, 1, 1)
            top = np.maximum(top, sink)
        p = np.exp(scores - top)
        total = p.sum(axis=-1, keepdims=True) + (np.exp(sink - top) if sinks is not None else 0.0)
        p /= total
        o = np.einsum("kgnc,kcd->kgnd", p, v.astype(np.float64))  # [kv, g, n, hd]
        out[idx] = o.transpose(2, 0, 1, 3).reshape(len(idx), n_heads, head_dim)
    return out


def kernel_name(kv_dtype: str, softcap: bool = False, sinks: bool = False) -> str:
    return f"paged_attention_{kv_dtype}" + ("_softcap" if softcap else "") + ("_sinks" if sinks else "")


def takes_sinks(device: Device) -> bool:
    """Whether the sink entries run on this device: on every backend (host kernels on the cpu, kernels/paged_attention.hip's
    `_sinks` entries on the GPUs)."""
    return True


SINKS_SIGNATURE = SIGNATURE + " p"


def _register(fmt: KvDtype, softcap: bool, with_sinks: bool = False) -> None:
    @cpu_kernel(kernel_name(fmt.name, softcap, with_sinks), (SINKS_SIGNATURE if with_sinks else SIGNATURE).replace(" ", ""))
    def host(dev: CpuDevice, grid, block, out: int, q: int, k_pool: int, v_pool: int, block_tables: int,
             token_seq: int, positions: int, workspace: int, n_tokens: int, n_heads: int, n_kv_heads: int,
             head_dim: int, block_size: int, max_blocks: int, num_blocks: int, slots: int, window: int,
             scale: float, softcap: float, sinks: int = 0) -> None:
        pool_shape = (num_blocks, n_kv_heads, block_size, fmt.row_bytes(head_dim))
        seqs = dev.view(token_seq, np.int32, n_tokens)
        n_seqs = int(seqs.max()) + 1 if n_tokens else 0
        result = reference(
            dev.view(q, np.float32, (n_tokens, n_heads, head_dim)),
            dev.view(k_pool, np.uint8, pool_shape), dev.view(v_pool, np.uint8, pool_shape), fmt,
            dev.view(block_tables, np.int32, (n_seqs, max_blocks)), seqs,
            dev.view(positions, np.int32, n_tokens), scale, window, softcap,
            dev.view(sinks, np.float32, n_heads) if with_sinks else None,
        )
        dev.view(out, np.float32, (n_tokens, n_heads, head_dim))[:] = result  # computed in full first: out may be q


for _fmt in KV_DTYPES.values():
    for _softcap in (False, True):
        _register(_fmt, _softcap)
        _register(_fmt, _softcap, with_sinks=True)


# ---- geometry and workspace --------------------------------------------------------------------


def head_chunks(n_heads: int, n_kv_heads: int) -> int:
    """Workgroups per (token, KV head, split): the group's query heads in balanced chunks of <= 4."""
    return -(-(n_heads // n_kv_heads) // MAX_GROUP_HEADS)


def split_limit(n_tokens: int, n_heads: int, n_kv_heads: int, max_context: int) -> int:
    """The most workgroups a token's keys are split among: enough for TARGET_WORKGROUPS in all, at most
    MAX_SPLITS, and no more than the longest context (max_context keys) has pieces of 128 keys."""
    groups = n_tokens * n_kv_heads * head_chunks(n_heads, n_kv_heads)
    return max(1, min(MAX_SPLITS, TARGET_WORKGROUPS // groups, -(-max_context // MIN_KEYS_PER_SPLIT)))


def spreads(n_tokens: int, n_heads: int, n_kv_heads: int) -> bool:
    """Whether a launch is small enough for the kernel to give short contexts one workgroup per query head."""
    return n_heads > n_kv_heads and n_tokens * n_heads <= SPREAD_MAX_WORKGROUPS


def slot_count(n_tokens: int, n_heads: int, n_kv_heads: int, splits: int) -> int:
    """Workgroups per (token, KV head) for `splits` splits of each head chunk's keys: room for the
    one-workgroup-per-query-head plan too where the launch is small enough for it."""
    slots = head_chunks(n_heads, n_kv_heads) * splits
    return max(slots, n_heads // n_kv_heads) if spreads(n_tokens, n_heads, n_kv_heads) else slots


def split_stride(n_heads: int, n_kv_heads: int, slots: int) -> int:
    """Splits per (token, query head) the kernel may make with `slots` (the workspace's stride)."""
    return max(1, min(MAX_SPLITS, slots // head_chunks(n_heads, n_kv_heads)))


def workspace_bytes(n_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, slots: int) -> int:
    """Workspace one launch of n_tokens with `slots` workgroups per (token, KV head) uses (0: it never splits)."""
    stride = split_stride(n_heads, n_kv_heads, slots)
    if stride <= 1:
        return 0
    counters = n_tokens * n_kv_heads * head_chunks(n_heads, n_kv_heads) * 4
    counters = -(-counters // COUNTER_BYTES_ALIGNMENT) * COUNTER_BYTES_ALIGNMENT
    return counters + n_tokens * n_heads * stride * (head_dim + 2) * 4


def launch_slots(n_tokens: int, n_heads: int, n_kv_heads: int, max_context: int) -> int:
    """The slots this launcher uses for a launch of n_tokens over contexts up to max_context keys, given
    a large enough workspace."""
    return slot_count(n_tokens, n_heads, n_kv_heads, split_limit(n_tokens, n_heads, n_kv_heads, max_context))


def workspace_size(max_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, max_context: int) -> int:
    """Bytes of a workspace with which every launch of up to max_tokens tokens, over contexts of up to
    max_context keys, splits as much as this launcher wants (a few MiB at most: splitting stops once
    the tokens alone fill the GPU)."""
    largest = 0
    for n in range(1, max_tokens + 1):
        if split_limit(n, n_heads, n_kv_heads, max_context) <= 1:
            break  # it never grows with n: no launch of more tokens splits (at most TARGET_WORKGROUPS / 2 steps)
        largest = max(largest, workspace_bytes(n, n_heads, n_kv_heads, head_dim,
                                               launch_slots(n, n_heads, n_kv_heads, max_context)))
    return largest


def geometry(arch: str, n_tokens: int, n_heads: int, n_kv_heads: int, slots: int) -> tuple[int, int]:
    """(grid, block) of a launch: `slots` workgroups of 4 warps per (token, KV head)."""
    return n_tokens * n_kv_heads * slots, WARPS * wavefront_size(arch)


def check_operands(op: str, kv_dtype: str, out, q, k_pool, v_pool, block_tables, token_seq, positions, *,
                   n_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, block_size: int, max_blocks: int,
                   num_blocks: int, window: int, head_dim_multiple: int, max_head_dim: int,
                   out_itemsize: int = 4) -> None:
    """The checks an attention launch over the paged cache needs whatever its kernel (this op's and
    prompt_attention's, with their own head sizes): sizes, grouping, head size, block size, window, a pool
    block under 2 GiB, and every buffer large and aligned enough (out of `out_itemsize` bytes a value: 2 for
    prompt_attention's f16 output)."""
    check_sizes(op, n_tokens=n_tokens, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
                block_size=block_size, max_blocks=max_blocks, num_blocks=num_blocks)
    if n_heads % n_kv_heads:
        raise ValueError(f"{op}: {n_heads} query heads do not group over {n_kv_heads} KV heads")
    if head_dim % head_dim_multiple or head_dim > max_head_dim:
        raise ValueError(f"{op}: head_dim must be a multiple of {head_dim_multiple} up to {max_head_dim}, got {head_dim}")
    if block_size & (block_size - 1):
        raise ValueError(f"{op}: block_size must be a power of two, got {block_size}")
    if not 0 <= window <= INT32_MAX:
        raise ValueError(f"{op}: window must be 0 (none) or a positive key count, got {window}")
    row_bytes = KV_DTYPES[kv_dtype].row_bytes(head_dim)
    if n_kv_heads * block_size * row_bytes >= 2**31:
        raise ValueError(f"{op}: a pool block of {n_kv_heads} x {block_size} rows is 2 GiB or more")
    rows_bytes = n_tokens * n_heads * head_dim * 4
    check_memory(op, "q", q, rows_bytes, Q_ALIGNMENT)
    check_memory(op, "out", out, rows_bytes // 4 * out_itemsize)
    for name, pool in (("k_pool", k_pool), ("v_pool", v_pool)):
        check_memory(op, name, pool, num_blocks * n_kv_heads * block_size * row_bytes, POOL_ALIGNMENT[kv_dtype])
    check_memory(op, "block_tables", block_tables, max_blocks * 4)
    check_memory(op, "token_seq", token_seq, n_tokens * 4)
    check_memory(op, "positions", positions, n_tokens * 4)


def launch(device: Device, stream: Stream | None, out, q, k_pool, v_pool, block_tables, token_seq, positions, *,
           n_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, block_size: int, max_blocks: int,
           num_blocks: int, scale: float, kv_dtype: str, workspace: Buffer | None = None, window: int = 0,
           softcap: float = 0.0, sinks: Any = None) -> None:
    """Queue attention for n_tokens query tokens (see the module docstring); `workspace` (optional, zeroed
    once after allocation, at least workspace_size(...) bytes for full speed) lets decode split keys;
    window > 0 limits each token to its last `window` positions (0: the whole context); softcap > 0 caps
    the scaled scores (Gemma 2), 0 leaves them; sinks: float32 [n_heads] (gpt-oss), where takes_sinks."""
    op = kernel_name(kv_dtype, softcap > 0, sinks is not None)
    if sinks is not None:
        if not takes_sinks(device):
            raise ValueError(f"{OP}: attention sinks have no kernel on {device.backend} yet (takes_sinks)")
        check_memory(op, "sinks", sinks, n_heads * 4)
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"{OP}: no kernel for KV dtype {kv_dtype!r}; have {', '.join(KV_DTYPES)}")
    check_operands(op, kv_dtype, out, q, k_pool, v_pool, block_tables, token_seq, positions, n_tokens=n_tokens,
                   n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim, block_size=block_size,
                   max_blocks=max_blocks, num_blocks=num_blocks, window=window, head_dim_multiple=8,
                   max_head_dim=MAX_HEAD_DIM)
    if not (np.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"{op}: softcap must be 0 (none) or a positive finite cap, got {softcap}")

    max_keys = min(window, max_blocks * block_size) if window else max_blocks * block_size  # a token's most keys
    splits = split_limit(n_tokens, n_heads, n_kv_heads, max_keys) if workspace is not None else 1
    if workspace is not None and not isinstance(workspace, Buffer):
        raise ValueError(f"{op}: workspace must be a Buffer (its size decides how far keys are split)")
    while splits > 1 and workspace_bytes(n_tokens, n_heads, n_kv_heads, head_dim,
                                         slot_count(n_tokens, n_heads, n_kv_heads, splits)) > workspace.nbytes:
        splits -= 1
    slots = slot_count(n_tokens, n_heads, n_kv_heads, splits)
    # Without a workspace pointer the kernel splits nothing: none is passed where this launcher wants no split.
    workspace_address: Any = workspace if splits > 1 else 0
    grid, block = geometry(device.arch, n_tokens, n_heads, n_kv_heads, slots)
    if grid > INT32_MAX:
        raise ValueError(f"{op}: {n_tokens} tokens need {grid} workgroups, more than a launch takes")
    # programmatic: the entries wait for the kernel ahead (hip_compat.h: rf_grid_dependency_sync) once they have
    # prefetched the K and V rows they will read (kernels/paged_attention.hip: run)
    kernel = get_kernel(device, OP, op, (SIGNATURE if sinks is None else SINKS_SIGNATURE).replace(" ", ""),
                        programmatic=True)
    kernel.launch(grid, block,
                  [out, q, k_pool, v_pool, block_tables, token_seq, positions, workspace_address, n_tokens, n_heads,
                   n_kv_heads, head_dim, block_size, max_blocks, num_blocks, slots, window, scale, softcap,
                   *(() if sinks is None else (sinks,))], stream=stream)
