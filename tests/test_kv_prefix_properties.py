"""Property tests of prefix caching: random prompts over a three-token alphabet (so that prefixes repeat) start,
grow, register, end with or without their tokens hashed, and the cache is flushed, on a small pool (so that
eviction happens), with and without a sliding-window group; after every operation every invariant holds (the hash
entries checked against each live sequence's tokens) and every position a sequence may read holds the K/V its own
prefix wrote there: a block shared through the cache, or evicted and handed out again, shows if it is wrong.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hipcore.kvcache.cache import KvCache
from hipcore.kvcache.config import KvCacheConfig
from hipcore.ops.kv_gather import gather_kv
from hipcore.ops.kv_store import reference as kv_store_reference
from hipcore.runtime.cpu import CpuDevice

BS = 2
CONFIGS = {
    "plain": KvCacheConfig(n_layers=1, n_kv_heads=1, head_dim=32, num_blocks=14, block_size=BS, dtype="f32"),
    "windowed": KvCacheConfig(n_layers=2, n_kv_heads=1, head_dim=32, num_blocks=14, block_size=BS, dtype="f32",
                              layer_windows=(3, 0), window_blocks=10),
}
TOKENS = st.lists(st.integers(1, 3), min_size=1, max_size=9)


def prefix_value(prefix: tuple[int, ...], layer: int) -> float:
    """What the last token of `prefix` stores in `layer`: it depends on the whole prefix, as a model's K/V does."""
    return float(hash((prefix, layer)) % 1_000_003)


class PrefixCacheMachine(RuleBasedStateMachine):
    config: KvCacheConfig

    def __init__(self) -> None:
        super().__init__()
        self.device = CpuDevice(capacity=64 << 20)
        self.cache = KvCache(self.device, self.config, prefix_caching=True)
        self.tokens: dict[int, list[int]] = {}
        self.next_seq = 0

    def write(self, seq: int, start: int) -> None:
        """The step that computes tokens start... of `seq` (reserved already), finished at once."""
        toks = self.tokens[seq]
        cfg = self.config
        for layer in range(cfg.n_layers):
            group = cfg.layer_group(layer)
            slots = self.cache.slot_mapping(seq, start, len(toks) - start, group)
            shape = (cfg.layer_num_blocks(layer), cfg.n_kv_heads, BS, cfg.row_bytes)
            for pos, slot in zip(range(start, len(toks)), slots.tolist()):
                value = prefix_value(tuple(toks[:pos + 1]), layer)
                rows = np.full((1, cfg.n_kv_heads, cfg.head_dim), value, np.float32)
                for pool in (self.cache.k_pools[layer], self.cache.v_pools[layer]):
                    view = self.device.view(pool.ptr, np.uint8, shape)
                    kv_store_reference(view, rows, np.array([slot]), cfg.format)

    @rule(tokens=TOKENS)
    def start(self, tokens: list[int]) -> None:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        cached = self.cache.add_sequence(seq, tokens)
        assert cached % BS == 0 and cached < len(tokens)
        assert self.cache.seq_len(seq) == cached
        self.tokens[seq] = list(tokens)  # the cached part is checked by data_is_the_prefixes
        if not self.cache.reserve(seq, len(tokens) - cached):
            self.cache.free_sequence(seq)
            del self.tokens[seq]
            return
        self.write(seq, cached)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), more=TOKENS)
    def grow(self, data: st.DataObject, more: list[int]) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        start = len(self.tokens[seq])
        if self.cache.reserve(seq, len(more)):
            self.tokens[seq] += more
            self.write(seq, start)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def register(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.cache.register_computed(seq, self.tokens[seq])

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), hashed=st.booleans())
    def end(self, data: st.DataObject, hashed: bool) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        toks = self.tokens.pop(seq)
        self.cache.free_sequence(seq, computed=toks if hashed else None)

    @rule()
    def release_fenced(self) -> None:
        self.cache.release_fenced()

    @rule()
    def flush(self) -> None:
        self.cache.flush_prefix_cache()
        assert self.cache.num_cached_blocks == 0

    @invariant()
    def invariants_hold(self) -> None:
        self.cache.check_invariants(sequence_tokens=self.tokens)
        p = self.cache.memory_profile()
        assert p.free_blocks + p.pending_blocks + p.cached_blocks + p.physical_blocks == p.total_blocks - p.reserved_blocks

    @invariant()
    def data_is_the_prefixes(self) -> None:
        cfg = self.config
        for seq, toks in self.tokens.items():
            for layer in range(cfg.n_layers):
                window = cfg.layer_windows[layer] if cfg.layer_windows else 0
                first = max(0, len(toks) - window) if window else 0  # what the next query may read
                k, v = gather_kv(self.cache, seq, layer)
                expect = [prefix_value(tuple(toks[:p + 1]), layer) for p in range(first, len(toks))]
                assert k[first:, 0, 0].tolist() == expect, f"sequence {seq} layer {layer} K"
                assert v[first:, 0, 0].tolist() == expect, f"sequence {seq} layer {layer} V"

    def teardown(self) -> None:
        for seq in list(self.tokens):
            self.cache.free_sequence(seq, computed=self.tokens[seq])
        self.cache.release_fenced()
        self.cache.check_invariants(quiescent=True)
        self.cache.flush_prefix_cache()
        usable = self.cache.num_usable_blocks
        assert self.cache.num_free_blocks == usable and self.cache.num_cached_blocks == 0
        self.cache.close()


class PlainMachine(PrefixCacheMachine):
    config = CONFIGS["plain"]


class WindowedMachine(PrefixCacheMachine):
    config = CONFIGS["windowed"]


_SETTINGS = settings(max_examples=80, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PlainMachine.TestCase.settings = _SETTINGS
WindowedMachine.TestCase.settings = _SETTINGS
test_prefix_cache_state_machine = PlainMachine.TestCase
test_prefix_cache_window_state_machine = WindowedMachine.TestCase
