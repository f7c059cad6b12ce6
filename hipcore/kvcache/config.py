"""The shape of a KV cache and every size derived from it, in checked Python-int arithmetic.

One place computes bytes per token, per block and per pool, so the cache that allocates, the
profile that reports and `rocmforge profile-kv` that plans can never disagree.

Layer groups (docs/architecture.md, "The release path of a KV block"). A model declares per layer
whether it attends globally or through a sliding window: `layer_windows[i]` is 0 for a global
(full-attention) layer and W > 0 for a layer whose query at position p reads only the keys at
positions p - W + 1 ... p (W positions, itself included: llama.cpp's standard SWA mask, which hides a
key when p - key >= W, and Hugging Face's `sliding_window`). An empty tuple means every layer is
global (llama, qwen2, qwen3, phi3): one group, exactly the cache of before. With at least one window the
cache keeps two groups, as vLLM's hybrid KV cache manager does:
  global  the layers with window 0: one pool of `num_blocks` blocks; a sequence keeps every block.
  local   the layers with a window: their own pool of `window_blocks` blocks and their own block
          tables; a sequence keeps only the blocks that still hold a position some future query can
          read (the group's window is the largest of its layers'), the rest go back to the pool.
A model whose every layer has a window (a one-layer gpt-oss) keeps both groups: the global group then holds no
layer, so its blocks cost no memory and only count each sequence's positions (table length, capacity); the local
pool is the whole cache, about a window (plus a step) per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

from hipcore.kvcache.dtypes import DEFAULT_KV_DTYPE, KvDtype, kv_dtype
from hipcore.kvcache.errors import KvConfigError
from hipcore.runtime.ledger import format_bytes

DEFAULT_BLOCK_SIZE = 16
MAX_BLOCK_SIZE = 256
NULL_BLOCK = 0  # never handed out, never freed; padding in block tables points at it
RESERVED_BLOCKS = 1

# Limits that reject absurd configurations before anything is allocated. Slots are int32 in the
# slot mapping and the kernels, hence the slot cap; 1 PiB per cache is far past any real device.
MAX_LAYERS = 1024
MAX_KV_HEADS = 1024
MAX_HEAD_DIM = 4096
MAX_SLOTS = 2**31 - 1
MAX_CACHE_BYTES = 2**50
MAX_WINDOW = 2**31 - 1  # a window is a token count; past the int32 positions of the kernels it means nothing

GLOBAL_GROUP = "global"  # layers that attend to every position: a sequence keeps all its blocks
LOCAL_GROUP = "local"  # sliding-window layers: a sequence keeps only the blocks inside the window


def _check_int(name: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise KvConfigError(f"KV cache {name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise KvConfigError(f"KV cache {name} must be between {low:,} and {high:,}, got {value:,}")
    return value


@dataclass(frozen=True)
class KvCacheConfig:
    """Shape of a paged KV cache. `num_blocks` counts the null block, so num_blocks - 1 are usable.

    Pool layout, per layer and for K and V separately: [blocks, n_kv_heads, block_size, row],
    where a row is head_dim elements of `dtype` (row_bytes bytes) and `blocks` is the layer's group's
    pool size (num_blocks for a global layer, window_blocks for a sliding-window one). One block of
    one pool is contiguous, so copy-on-write copies 2 x (the group's layers) contiguous ranges.

    The interface a model family sets (see the module docstring):
      layer_windows  per layer, 0 (or None) = global attention, W > 0 = a sliding window of W tokens;
                     () = every layer global. Normalised to a tuple of ints; all zeros become ().
      window_blocks  blocks of the local group's pool, its null block included; 0 = as many as the
                     global pool (never the first to run out, saves nothing). The memory plan sizes it
                     with `window_pool_blocks` so that a local layer holds only about a window a sequence.
    """

    n_layers: int
    n_kv_heads: int
    head_dim: int
    num_blocks: int
    block_size: int = DEFAULT_BLOCK_SIZE
    dtype: str = DEFAULT_KV_DTYPE
    layer_windows: tuple[int, ...] = ()
    window_blocks: int = 0

    def __post_init__(self) -> None:
        _check_int("n_layers", self.n_layers, 1, MAX_LAYERS)
        _check_int("n_kv_heads", self.n_kv_heads, 1, MAX_KV_HEADS)
        _check_int("head_dim", self.head_dim, 1, MAX_HEAD_DIM)
        _check_block_size(self.block_size)
        _check_int("num_blocks", self.num_blocks, RESERVED_BLOCKS + 1, MAX_SLOTS // self.block_size)
        object.__setattr__(self, "layer_windows", _check_layer_windows(self.layer_windows, self.n_layers))
        if self.layer_windows:
            limit = MAX_SLOTS // self.block_size
            if self.window_blocks == 0:
                object.__setattr__(self, "window_blocks", self.num_blocks)
            _check_int("window_blocks", self.window_blocks, RESERVED_BLOCKS + 1, limit)
        elif self.window_blocks != 0:
            raise KvConfigError(f"KV cache window_blocks is {self.window_blocks!r} but no layer has a sliding "
                                "window (layer_windows is empty); leave it 0")
        object.__setattr__(self, "dtype", self.format.name)  # normalised spelling; raises if unknown
        self.format.row_bytes(self.head_dim)  # q8_0 needs head_dim % 32 == 0
        if self.cache_bytes > MAX_CACHE_BYTES:
            raise KvConfigError(
                f"KV cache of {self.num_blocks:,} blocks would need {format_bytes(self.cache_bytes)}, past the "
                f"{format_bytes(MAX_CACHE_BYTES)} limit; use fewer blocks"
            )

    @classmethod
    def for_memory(cls, budget_bytes: int, n_layers: int, n_kv_heads: int, head_dim: int,
                   block_size: int = DEFAULT_BLOCK_SIZE, dtype: str = DEFAULT_KV_DTYPE,
                   layer_windows: tuple[int, ...] = (), window_blocks: int = 0) -> "KvCacheConfig":
        """The largest cache (null blocks included) whose pools fit in `budget_bytes`.

        With sliding-window layers, `window_blocks` (0: as many as the global pool) is taken first
        and the global pool gets the rest of the budget."""
        _check_int("memory budget", budget_bytes, 0, 2**63 - 1)
        windows = _check_layer_windows(layer_windows, n_layers)
        probe = cls(n_layers, n_kv_heads, head_dim, RESERVED_BLOCKS + 1, block_size, dtype, windows,
                    (window_blocks or RESERVED_BLOCKS + 1) if windows else 0)
        if probe.layer_windows and not probe.global_layers:
            return cls._window_only_for_memory(probe, budget_bytes, window_blocks)
        if probe.layer_windows and window_blocks:
            room, per_block = budget_bytes - window_blocks * probe.window_bytes_per_block, probe.bytes_per_block
        else:  # one group, or a local pool as large as the global one: each global block brings its local twin
            room, per_block = budget_bytes, probe.bytes_per_block + probe.window_bytes_per_block
        num_blocks = min(max(room, 0) // per_block, MAX_SLOTS // block_size, MAX_CACHE_BYTES // per_block)
        if num_blocks < RESERVED_BLOCKS + 1:
            raise KvConfigError(
                f"a KV budget of {format_bytes(budget_bytes)} holds no usable block: one block of {block_size} "
                f"tokens needs {format_bytes(per_block)} and block 0 is reserved, so at least "
                f"{format_bytes(budget_bytes - room + (RESERVED_BLOCKS + 1) * per_block)} is needed"
            )
        return cls(n_layers, n_kv_heads, head_dim, num_blocks, block_size, dtype, probe.layer_windows, window_blocks)

    @classmethod
    def _window_only_for_memory(cls, probe: "KvCacheConfig", budget_bytes: int, window_blocks: int) -> "KvCacheConfig":
        """for_memory of a model whose every layer has a window: the budget is the local pool's (`window_blocks`
        when given, else as many blocks as fit); the global group, holding no layer, gets as many blocks, which
        cost nothing (a caller that knows the contexts, as the memory plan does, sizes it for them)."""
        per_block = probe.window_bytes_per_block
        fitting = min(budget_bytes // per_block, MAX_SLOTS // probe.block_size, MAX_CACHE_BYTES // per_block)
        blocks = window_blocks or fitting
        if blocks < RESERVED_BLOCKS + 1 or blocks * per_block > budget_bytes:
            raise KvConfigError(
                f"a KV budget of {format_bytes(budget_bytes)} holds no usable block: one block of {probe.block_size} "
                f"tokens needs {format_bytes(per_block)} and block 0 is reserved, so at least "
                f"{format_bytes(max(blocks, RESERVED_BLOCKS + 1) * per_block)} is needed")
        return cls(probe.n_layers, probe.n_kv_heads, probe.head_dim, blocks, probe.block_size, probe.dtype,
                   probe.layer_windows, blocks)

    @property
    def window_only(self) -> bool:
        """Every layer has a sliding window: the global group holds no layer (it only counts positions)."""
        return bool(self.layer_windows) and not self.global_layers

    @property
    def format(self) -> KvDtype:
        return kv_dtype(self.dtype)

    @property
    def row_bytes(self) -> int:
        """One (token, KV head) row of K (or V) in one layer."""
        return self.format.row_bytes(self.head_dim)

    @property
    def block_bytes_per_pool(self) -> int:
        """One block in one pool (one layer's K, or its V)."""
        return self.n_kv_heads * self.block_size * self.row_bytes

    @property
    def pool_bytes(self) -> int:
        """One pool of a global layer: its K (or V) for every block of the global group."""
        return self.num_blocks * self.block_bytes_per_pool

    @property
    def window_pool_bytes(self) -> int:
        """One pool of a sliding-window layer: its K (or V) for every block of the local group (0 if none)."""
        return self.window_blocks * self.block_bytes_per_pool

    @property
    def bytes_per_block(self) -> int:
        """One global block across K and V of every global layer: what taking it from the free list costs."""
        return 2 * len(self.global_layers) * self.block_bytes_per_pool

    @property
    def window_bytes_per_block(self) -> int:
        """One local block across K and V of every sliding-window layer (0 without a local group)."""
        return 2 * len(self.window_layers) * self.block_bytes_per_pool

    @property
    def bytes_per_token(self) -> int:
        """K + V of one token in every layer (KV heads, not query heads; scales included): what a token
        inside the window costs. Past the window a token costs only `global_bytes_per_token`."""
        return 2 * self.n_layers * self.n_kv_heads * self.row_bytes

    @property
    def global_bytes_per_token(self) -> int:
        return 2 * len(self.global_layers) * self.n_kv_heads * self.row_bytes

    @property
    def window_bytes_per_token(self) -> int:
        return 2 * len(self.window_layers) * self.n_kv_heads * self.row_bytes

    @property
    def cache_bytes(self) -> int:
        return 2 * (len(self.global_layers) * self.pool_bytes + len(self.window_layers) * self.window_pool_bytes)

    # ---- layer groups --------------------------------------------------------------------------

    @property
    def global_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.n_layers) if not self.layer_window(i))

    @property
    def window_layers(self) -> tuple[int, ...]:
        return tuple(i for i, w in enumerate(self.layer_windows) if w)

    @property
    def groups(self) -> tuple[str, ...]:
        """The layer groups present, global first."""
        return (GLOBAL_GROUP, LOCAL_GROUP) if self.layer_windows else (GLOBAL_GROUP,)

    @property
    def window(self) -> int:
        """The local group's window: the largest of its layers' (a block leaves the group only when
        every local layer has left it behind); 0 without a local group."""
        return max(self.layer_windows, default=0)

    def layer_window(self, layer: int) -> int:
        """0 for a global layer, else its window in tokens."""
        _check_int("layer", layer, 0, self.n_layers - 1)
        return self.layer_windows[layer] if self.layer_windows else 0

    def layer_group(self, layer: int) -> str:
        return LOCAL_GROUP if self.layer_window(layer) else GLOBAL_GROUP

    def group_blocks(self, group: str) -> int:
        """Blocks of a group's pool, its null block included."""
        if group == GLOBAL_GROUP:
            return self.num_blocks
        if group == LOCAL_GROUP and self.layer_windows:
            return self.window_blocks
        raise KvConfigError(f"the KV cache has no layer group {group!r} (it has {', '.join(self.groups)})")

    def layer_num_blocks(self, layer: int) -> int:
        """Blocks of the pool `layer`'s K and V live in (what its kernels get as num_blocks)."""
        return self.group_blocks(self.layer_group(layer))

    def group_bytes_per_block(self, group: str) -> int:
        self.group_blocks(group)  # refuses an absent group
        return self.bytes_per_block if group == GLOBAL_GROUP else self.window_bytes_per_block

    def first_kept_position(self, length: int) -> int:
        """The lowest position of a sequence of `length` tokens that the next token (at position
        `length`) may still read in the local group; every block wholly below it can be freed."""
        return max(0, length - self.window + 1) if self.window else 0

    def window_blocks_per_sequence(self) -> int:
        """The most local blocks a decoding sequence holds: W positions span at most
        ceil((W - 1) / block_size) + 1 blocks (0 without a local group)."""
        return self.blocks_for_tokens(self.window - 1) + 1 if self.window else 0

    def sequence_bytes(self, n_tokens: int) -> int:
        """Device bytes a decoding sequence of n_tokens holds: every block in the global group, at most
        a window's blocks in the local group. Window-true and GQA-true: what profile-kv plans with."""
        blocks = self.blocks_for_tokens(n_tokens)
        local = min(blocks, self.window_blocks_per_sequence())
        return blocks * self.bytes_per_block + local * self.window_bytes_per_block

    def window_pool_blocks(self, max_seqs: int, max_step_tokens: int) -> int:
        """Local pool blocks (null included) with which `max_seqs` sequences, stepping at most
        `max_step_tokens` tokens together, can run without the local pool being the one that runs out.

        Per sequence, a reserve of n tokens at length L holds positions [L' - W + 1, L + n), where L' is
        the length at its previous reserve (blocks it freed then wait for the step fence): at most
        ceil((W - 1) / bs) + 1 + ceil(n_prev / bs) + ceil(n / bs) blocks, and the ceil terms of all
        sequences together add at most 2 x (max_step_tokens / bs + max_seqs). Never more than the global
        pool: a local block always has a global twin (same sequence, same table index)."""
        _check_int("max_seqs", max_seqs, 1, MAX_SLOTS)
        _check_int("max_step_tokens", max_step_tokens, 1, MAX_SLOTS)
        if not self.window:
            return 0
        per_seq = self.blocks_for_tokens(self.window - 1) + 3
        wanted = max_seqs * per_seq + 2 * self.blocks_for_tokens(max_step_tokens) + RESERVED_BLOCKS
        return min(wanted, self.num_blocks)

    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - RESERVED_BLOCKS

    @property
    def usable_tokens(self) -> int:
        return self.usable_blocks * self.block_size

    @property
    def num_slots(self) -> int:
        """Slot indices run over [0, num_slots): slot = block * block_size + offset."""
        return self.num_blocks * self.block_size

    def blocks_for_tokens(self, n_tokens: int) -> int:
        """Blocks a fresh sequence of n_tokens needs: ceil(n_tokens / block_size)."""
        return -(-n_tokens // self.block_size)


def _check_layer_windows(windows: object, n_layers: int) -> tuple[int, ...]:
    """A tuple of ints, one per layer (None -> 0, global), or () when no layer has a window."""
    if windows is None:
        return ()
    if isinstance(windows, (str, bytes)) or not hasattr(windows, "__iter__"):
        raise KvConfigError(f"KV cache layer_windows must be a sequence of window lengths, one per layer, got {windows!r}")
    out = tuple(0 if w is None else w for w in windows)  # type: ignore[union-attr]
    if not out:
        return ()
    if len(out) != n_layers:
        raise KvConfigError(f"KV cache layer_windows has {len(out)} entries for {n_layers} layers; give one per layer "
                            "(0 = global attention)")
    for i, w in enumerate(out):
        _check_int(f"window of layer {i}", w, 0, MAX_WINDOW)
    if not any(out):
        return ()
    return out


def _check_block_size(block_size: object) -> int:
    _check_int("block_size", block_size, 1, MAX_BLOCK_SIZE)
    if block_size & (block_size - 1):  # type: ignore[operator]
        raise KvConfigError(f"KV cache block_size must be a power of two (1, 2, 4 ... {MAX_BLOCK_SIZE}), got {block_size}")
    return block_size  # type: ignore[return-value]
