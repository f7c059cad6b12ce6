"""KvCache: the paged KV pools on a device, and a block table per sequence.

Usage by an engine (one thread owns the cache; memory_profile may be read from any thread):

    cache.add_sequence(7)
    if not cache.reserve(7, len(prompt)):        # no space: nothing changed; preempt or queue
        ...
    slots = cache.slot_mapping(7, 0, len(prompt)) # where the prompt's K/V rows go
    ... launch the step (kv_store writes through slots, attention reads through block tables) ...
    device.synchronize()                          # or wait for the step's event
    cache.release_fenced()                        # blocks released meanwhile become reusable
    cache.free_sequence(7)                        # any ending: finished, cancelled, failed, preempted

Freed blocks are not reusable at once: they wait on a pending list until `release_fenced()` says
the device work that might still touch them has finished (invariant 9). An engine that pipelines
steps calls `begin_step()` before launching each step and `release_fenced(step)` once that step
is known finished; blocks released while later steps were in flight wait for those.

A model with sliding-window layers (KvCacheConfig.layer_windows) gets two layer groups, each with its
own block pool and block tables (block_group.py): `reserve` grows both at once (all or nothing) and,
in the local group, releases the blocks that every window layer has left behind. Queries that take a
`group` argument default to the global group, which is the only one of a llama model.

With prefix caching (prefix_cache.py), `add_sequence(seq_id, prefix=prompt)` starts the sequence with the blocks
of the longest cached prefix of the prompt (its length is what it returns), `register_computed` hashes a
sequence's computed full blocks, and `free_sequence(seq_id, computed=tokens)` hashes them on the way out: those
blocks go to the LRU of cached blocks (after the fence) instead of the free list, and a reservation evicts them,
least recently used first, before it says "no space".
"""

from __future__ import annotations

import threading
from typing import Iterable, Mapping, Sequence

import numpy as np

from hipcore.kvcache.block_counts import BlockCounts
from hipcore.kvcache.block_group import BlockGroup
from hipcore.kvcache.config import GLOBAL_GROUP, LOCAL_GROUP, NULL_BLOCK, KvCacheConfig
from hipcore.kvcache.errors import KvCacheError, KvInvariantError
from hipcore.kvcache.group_view import KvGroupView, group_view
from hipcore.kvcache.invariants import check_group_invariants, check_prefix_invariants
from hipcore.kvcache.pools import allocate_pools, copy_block
from hipcore.kvcache.prefix_cache import PrefixCacheMethods, PrefixCaching
from hipcore.kvcache.prefix_index import BlockHash, BlockKeys
from hipcore.kvcache.profile import MemoryProfile, build_profile
from hipcore.runtime.device import Buffer, Device, Stream


class KvCache(BlockCounts, PrefixCacheMethods):
    """Paged K/V pools (one K and one V allocation per layer, tag "kv", sized by the layer's group) and
    per-sequence block tables in each layer group."""

    def __init__(self, device: Device, config: KvCacheConfig, label: str = "kv", *, prefix_caching: bool = False,
                 model_identity: str = "", block_hash: BlockHash = hash):
        """prefix_caching: keep released full blocks for prompts that start alike (module docstring); model_identity
        (the model file's name and size, say) and block_hash go into every block's key (prefix_index.py)."""
        self.device = device
        self.config = config
        self._lock = threading.RLock()
        self._groups: dict[str, BlockGroup] = {
            group: BlockGroup(group, config.group_blocks(group), config.block_size,
                              config.window if group == LOCAL_GROUP else 0, block_hash)
            for group in config.groups}
        self._model_identity, self._block_hash = model_identity, block_hash
        self.prefix = PrefixCaching(config, self._groups, model_identity, block_hash) if prefix_caching else None
        self._pool = self._groups[GLOBAL_GROUP].pool  # the global group's (the only one of a llama model)
        self._tables = self._groups[GLOBAL_GROUP].tables
        self._group_list = tuple(self._groups.values())
        self._window_groups = tuple(group for group in self._group_list if group.window)
        self._lengths: dict[int, int] = {}
        self._launched_step = 0
        self._closed = False
        pools: tuple[tuple[Buffer, ...], tuple[Buffer, ...]] = allocate_pools(device, config, label)  # (pools.py)
        self.k_pools, self.v_pools = pools

    # ---- sequences -----------------------------------------------------------------------------

    def add_sequence(self, seq_id: int, prefix: Sequence[int] | None = None, keys: BlockKeys | None = None) -> int:
        """Start a sequence: empty (no blocks until `reserve`), or, given the tokens it starts with and with prefix
        caching on, holding the blocks of their longest cached prefix. Returns its length: the tokens whose K/V it
        has already (a multiple of the block size, below len(prefix)). `keys`: the BlockKeys of a token list that
        starts with `prefix` (the sequence's own, kept from one call to the next, so that each of its blocks is
        hashed once: prefix_index.py); without them the blocks are hashed on every call."""
        with self._lock:
            self._check_open()
            _check_seq_id(seq_id)
            if seq_id in self._tables:
                raise KvCacheError(f"sequence {seq_id} already exists in the KV cache")
            for group in self._groups.values():
                group.add(seq_id)
            length = self.prefix.attach(seq_id, prefix, keys) if self.prefix is not None and prefix else 0
            self._lengths[seq_id] = length
            return length

    def reserve(self, seq_id: int, n_tokens: int, stream: Stream | None = None) -> bool:
        """Extend sequence `seq_id` by n_tokens slots (taking blocks as needed, copying a shared
        partly filled last block first) in every layer group; in the local group, the blocks every
        window layer has left behind go back to the pool (through the fence). False when a group has
        not enough free blocks: then nothing changed in any group. A copy-on-write copy is queued on
        `stream`, before the step's writes."""
        return self.reserve_each(((seq_id, n_tokens),), stream) == 1

    def reserve_each(self, items: Iterable[tuple[int, int]], stream: Stream | None = None) -> int:
        """reserve(seq_id, n_tokens) for each (seq_id, n_tokens) in order, up to the first that does not fit;
        returns how many were reserved (theirs stand; the one that did not fit changed nothing, and the rest
        were not tried). One call for a whole decode step: a call per sequence cost more than the work."""
        with self._lock:
            lengths, groups, window_groups = self._lengths, self._group_list, self._window_groups
            done = 0
            for seq_id, n_tokens in items:
                # The fast path of a decode step: the tokens fit in the sequence's own partly filled last block in
                # every group, so nothing is taken, copied or released. (A live id is a non-negative int key of
                # _lengths, and a closed cache has none; `type() is int` refuses a bool that hashes as 0 or 1.)
                length = lengths.get(seq_id) if type(seq_id) is int else None
                if length is not None and type(n_tokens) is int and n_tokens > 0:
                    for group in groups:
                        if not group.appends_in_place(seq_id, length, n_tokens):
                            break
                    else:
                        for group in window_groups:
                            group.advance_window(seq_id, length)
                        lengths[seq_id] = length + n_tokens
                        done += 1
                        continue
                    # Next most common: the last block is full and one new block per group takes the tokens
                    # (the general path's plan, take and apply for that case, without building them).
                    for group in groups:
                        if not group.appends_new_block(seq_id, length, n_tokens) or not group.pool.num_available:
                            break
                    else:
                        for group in groups:
                            group.append_block(seq_id, group.pool.take(1, seq_id)[0])  # type: ignore[index]
                        for group in window_groups:
                            group.advance_window(seq_id, length)
                        lengths[seq_id] = length + n_tokens
                        done += 1
                        continue
                if not self._reserve_general(seq_id, n_tokens, stream):
                    break
                done += 1
            return done

    def _reserve_general(self, seq_id: int, n_tokens: int, stream: Stream | None) -> bool:
        """reserve() of one sequence, any case (the caller holds the lock)."""
        self._table(seq_id)
        _check_count("n_tokens", n_tokens)
        length = self._lengths[seq_id]
        groups = self._group_list  # (global first: the order every group-wise step below keeps)
        plans = [group.plan(seq_id, length, n_tokens) for group in groups]
        for group, plan in zip(groups, plans):
            if plan.blocks_taken > group.pool.num_available:
                return False
        taken = [group.pool.take(plan.blocks_taken, seq_id) or [] for group, plan in zip(groups, plans)]
        fence = self._launched_step
        try:
            for group, plan, blocks in zip(groups, plans, taken):
                if plan.copy_on_write:
                    copy_block(self.device, self.config, self.k_pools, self.v_pools, group.tables[seq_id][-1],
                               blocks[0], stream, group.name)
        except BaseException:
            for group, blocks in zip(groups, taken):
                group.pool.discard_unused(blocks, fence)
            raise
        for group, plan, blocks in zip(groups, plans, taken):
            group.apply(seq_id, plan, blocks, fence)
        self._lengths[seq_id] += n_tokens
        return True

    def fork(self, parent_id: int, child_id: int) -> None:
        """Make `child_id` a sequence sharing every block (and the length) of `parent_id`.
        Allocates nothing; whichever of them appends into the shared last block copies it first."""
        with self._lock:
            parent = self._table(parent_id)
            _check_seq_id(child_id)
            if child_id in self._tables:
                raise KvCacheError(f"cannot fork {parent_id} into {child_id}: sequence {child_id} already exists")
            del parent
            for group in self._groups.values():
                group.fork(parent_id, child_id)
            self._lengths[child_id] = self._lengths[parent_id]

    def free_sequence(self, seq_id: int, computed: Sequence[int] | None = None, keys: BlockKeys | None = None) -> None:
        """End a sequence: its blocks lose one reference each (last block first); blocks nobody holds
        any more wait for the step fence. Freeing an unknown (or already freed) id is an error. Every
        layer group gives back what the sequence holds in it (global first, then local). `computed`: as
        register_computed's, hashed first (with caching on), so that those blocks are cached, not freed; `keys`: as
        add_sequence's."""
        with self._lock:
            self._table(seq_id)
            if self.prefix is not None and computed:
                self.prefix.register(seq_id, computed, self._lengths[seq_id], keys)
            for group in self._groups.values():
                group.free(seq_id, self._launched_step)
            del self._lengths[seq_id]

    # ---- the step fence ------------------------------------------------------------------------

    def begin_step(self) -> int:
        """Call before launching device work that reads or writes the pools; returns the step's
        fence id. Only needed by engines that keep more than one step in flight."""
        with self._lock:
            self._launched_step += 1
            return self._launched_step

    def release_fenced(self, completed_step: int | None = None) -> int:
        """Pending blocks become free. Call after the device finished the work that may touch them:
        with no argument, everything launched so far has finished (e.g. after synchronize); with a
        step id from `begin_step`, that step and all before it have. Returns how many blocks moved."""
        with self._lock:
            if completed_step is not None:
                _check_count("completed_step", completed_step)
                if completed_step > self._launched_step:
                    raise KvCacheError(f"step {completed_step} was never begun (the last begun is {self._launched_step})")
            return sum(group.pool.release_fenced(completed_step) for group in self._groups.values())

    # ---- queries -------------------------------------------------------------------------------

    def has_sequence(self, seq_id: int) -> bool:
        with self._lock:
            return seq_id in self._tables

    def sequences(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(self._tables)

    def seq_len(self, seq_id: int) -> int:
        with self._lock:
            self._table(seq_id)
            return self._lengths[seq_id]

    def block_table(self, seq_id: int, group: str = GLOBAL_GROUP) -> tuple[int, ...]:
        """The sequence's table in `group`; in the local group, entries out of the window are the null block."""
        with self._lock:
            self._table(seq_id)
            return tuple(self._group(group).tables[seq_id])

    def block_tables(self, seq_ids: Iterable[int], width: int | None = None, group: str = GLOBAL_GROUP) -> np.ndarray:
        """int32 [len(seq_ids), width] tables of `group` padded with the null block (what attention kernels
        read); width defaults to the longest table."""
        with self._lock:
            owner, ids = self._group(group), list(seq_ids)
            tables = owner.tables
            # Every id a live sequence's: one set of types (a bool would find the table of 0 or 1 as a key) and
            # one lookup each; the per-id check only where that fails, to name what is wrong.
            longest = None
            if set(map(type, ids)) <= {int}:
                try:
                    longest = max(map(len, map(tables.__getitem__, ids)), default=0)
                except KeyError:
                    pass
            if longest is None:
                for seq_id in ids:
                    self._table(seq_id)  # refuses an unknown id
                longest = max((len(tables[seq_id]) for seq_id in ids), default=0)
            width = longest if width is None else width
            _check_count("width", width)
            if width > self.config.num_blocks:  # no table can hold more blocks than the pool has
                raise KvCacheError(f"block table width {width:,} is more than the pool's {self.config.num_blocks:,} "
                                   "blocks; no sequence's table can be that long")
            if width < longest:
                raise KvCacheError(f"block table width {width} is shorter than the longest table ({longest} blocks)")
            return owner.rows.gather(ids, width)

    def slot_mapping(self, seq_id: int, start: int, count: int, group: str = GLOBAL_GROUP) -> np.ndarray:
        """int32 slots (block * block_size + offset) of the sequence's tokens [start, start + count) in
        `group`'s pools."""
        with self._lock:
            self._table(seq_id)
            owner = self._group(group)
            table = owner.tables[seq_id]
            _check_count("start", start)
            _check_count("count", count)
            if start + count > self._lengths[seq_id]:
                raise KvCacheError(
                    f"slots [{start}, {start + count}) of sequence {seq_id} are past its {self._lengths[seq_id]} "
                    f"reserved tokens; reserve first"
                )
            if count and start < owner.kept_from[seq_id]:
                raise KvCacheError(
                    f"position {start} of sequence {seq_id} is out of the {group} group's window: its block went "
                    f"back to the pool (the group keeps positions from {owner.kept_from[seq_id]} on)"
                )
            bs = self.config.block_size
            positions = np.arange(start, start + count, dtype=np.int64)
            blocks = np.asarray(table, dtype=np.int64)[positions // bs] if count else positions
            return (blocks * bs + positions % bs).astype(np.int32)

    def blocks_needed(self, seq_id: int | None, n_tokens: int, group: str = GLOBAL_GROUP) -> int:
        """Free blocks of `group` that `reserve(seq_id, n_tokens)` would take (seq_id None: a new sequence)."""
        with self._lock:
            _check_count("n_tokens", n_tokens)
            owner = self._group(group)
            if seq_id is None:
                return self.config.blocks_for_tokens(n_tokens)
            self._table(seq_id)
            return owner.plan(seq_id, self._lengths[seq_id], n_tokens).blocks_taken

    @property
    def groups(self) -> tuple[str, ...]:
        """The layer groups, global first (docs/architecture.md, "The release path of a KV block")."""
        return tuple(self._groups)

    def group_view(self, group: str) -> KvGroupView:
        """`group`'s pools as its layers' kernels see them (group_view.py); the forward pass hands it to
        the layers of a sliding-window group."""
        with self._lock:
            self._check_open()
            self._group(group)
            return group_view(self.config, self.k_pools, self.v_pools, group)

    def memory_profile(self) -> MemoryProfile:
        """The profile of the open cache; a closed one has no pools to describe, so it refuses."""
        with self._lock:
            if self._closed:
                raise KvCacheError("the KV cache is closed: its pools were freed, so it has no memory profile")
            return build_profile(self.config, self._groups, self._lengths, self.prefix)

    # ---- invariants ----------------------------------------------------------------------------

    def check_invariants(self, quiescent: bool = False, sequence_tokens: Mapping[int, Sequence[int]] | None = None) -> None:
        """Raise KvInvariantError naming what broke (docs/architecture.md, KV cache invariants 1, 2, 7; and 6 when
        `quiescent`: no sequence left, nothing pending, every usable block free or cached); with prefix caching, the
        hash entries too, against each live sequence's computed tokens where `sequence_tokens` gives them."""
        with self._lock:
            if self._closed:
                raise KvInvariantError("the KV cache is closed; its invariants are not defined any more")
            for group in self._groups.values():
                check_group_invariants(self.config, group, self._lengths)
                if self.prefix is not None:
                    check_prefix_invariants(group, self.prefix.salts[group.name], self.config.block_size,
                                            sequence_tokens)
            for buf in self.k_pools + self.v_pools:
                if buf.freed:
                    raise KvInvariantError(f"pool {buf.label} was freed while the cache is open")
            if quiescent:
                if self._tables:
                    raise KvInvariantError(f"not quiescent: sequences {sorted(self._tables)[:10]} are still live")
                for group in self._groups.values():
                    if group.pool.num_pending:
                        raise KvInvariantError(f"not quiescent: {group.pool.num_pending} {group.name} blocks still wait "
                                               "for the step fence")

    # ---- lifetime ------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Free every pool. Idempotent; the cache refuses all use afterwards."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pools, self.k_pools, self.v_pools = self.k_pools + self.v_pools, (), ()
            for group in self._groups.values():
                group.clear()
            self._lengths.clear()
            for buf in pools:
                if not buf.freed:
                    buf.free()

    def __enter__(self) -> "KvCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise KvCacheError("the KV cache is closed")

    def _table(self, seq_id: int) -> list[int]:
        self._check_open()
        _check_seq_id(seq_id)
        table = self._tables.get(seq_id)
        if table is None:
            raise KvCacheError(f"unknown sequence {seq_id!r} in the KV cache")
        return table

    def _group(self, group: str) -> BlockGroup:
        owner = self._groups.get(group)
        if owner is None:
            raise KvCacheError(f"the KV cache has no layer group {group!r} (it has {', '.join(self._groups)})")
        return owner


def _check_seq_id(seq_id: object) -> None:
    if not isinstance(seq_id, int) or isinstance(seq_id, bool) or seq_id < 0:
        raise KvCacheError(f"sequence ids are non-negative integers, got {seq_id!r}")


def _check_count(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise KvCacheError(f"{name} must be a non-negative integer, got {value!r}")
