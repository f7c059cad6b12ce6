"""Property tests: random add / reserve / fork / free / cancel-mid-step / fence sequences on a small
cache, with every invariant of docs/architecture.md ("KV cache invariants") checked after every operation, and the cached data
checked against a model (so a wrong copy-on-write, or a late write landing in a reused block, shows).
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

CONFIG = KvCacheConfig(n_layers=2, n_kv_heads=1, head_dim=32, num_blocks=12, block_size=4, dtype="f32")


def row_value(token: int, layer: int, kind: str) -> float:
    """What token `token` stores in (layer, kind): exact in f32, distinct across tokens and pools."""
    return float(token * 8 + layer * 2 + (kind == "v"))


class KvCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.device = CpuDevice(capacity=64 << 20)
        self.kv_baseline = self.device.ledger.bytes_by_tag()["kv"]
        self.cache = KvCache(self.device, CONFIG)
        self.tokens: dict[int, list[int]] = {}  # model: the token values each live sequence holds
        self.next_seq = 0
        self.next_token = 1
        self.step: int | None = None  # fence id of the step in flight
        self.in_flight: list[tuple[int, int]] = []  # (slot, token) writes the device has not done yet
        self.busy: dict[int, int] = {}  # sequences in the step in flight -> tokens written before it

    # ---- helpers -------------------------------------------------------------------------------

    def pick(self, index: int, pool: list[int]) -> int:
        return pool[index % len(pool)]

    def live(self) -> list[int]:
        return sorted(self.tokens)

    def idle(self) -> list[int]:
        return [s for s in self.live() if s not in self.busy]

    def write(self, slot: int, token: int) -> None:
        """The device writing one token's rows (possibly late: after its sequence was cancelled)."""
        shape = (CONFIG.num_blocks, CONFIG.n_kv_heads, CONFIG.block_size, CONFIG.row_bytes)
        for layer in range(CONFIG.n_layers):
            for kind, pool in (("k", self.cache.k_pools[layer]), ("v", self.cache.v_pools[layer])):
                rows = np.full((1, CONFIG.n_kv_heads, CONFIG.head_dim), row_value(token, layer, kind), np.float32)
                kv_store_reference(self.device.view(pool.ptr, np.uint8, shape), rows, np.array([slot]), CONFIG.format)

    # ---- operations ----------------------------------------------------------------------------

    @rule()
    def add(self) -> None:
        self.cache.add_sequence(self.next_seq)
        self.tokens[self.next_seq] = []
        self.next_seq += 1

    @precondition(lambda self: self.idle())
    @rule(index=st.integers(0, 100), n=st.integers(0, 11))
    def append_now(self, index: int, n: int) -> None:
        """Reserve and write at once (a step that has already finished)."""
        seq = self.pick(index, self.idle())
        before = self.snapshot()
        needed = self.cache.blocks_needed(seq, n)
        ok = self.cache.reserve(seq, n)
        assert ok == (needed <= before[2])
        if not ok:
            assert self.snapshot() == before  # all or nothing
            return
        start = len(self.tokens[seq])
        for slot in self.cache.slot_mapping(seq, start, n).tolist():
            self.write(slot, self.next_token)
            self.tokens[seq].append(self.next_token)
            self.next_token += 1

    @precondition(lambda self: self.step is None and self.idle())
    @rule(data=st.data())
    def launch_step(self, data: st.DataObject) -> None:
        """Begin a step: some sequences reserve tokens whose writes land only when the step finishes."""
        self.step = self.cache.begin_step()
        chosen = data.draw(st.lists(st.sampled_from(self.idle()), unique=True, max_size=3))
        for seq in chosen:
            n = data.draw(st.integers(1, 6))
            if not self.cache.reserve(seq, n):
                continue
            start = len(self.tokens[seq])
            self.busy[seq] = start
            for slot in self.cache.slot_mapping(seq, start, n).tolist():
                self.in_flight.append((slot, self.next_token))
                self.tokens[seq].append(self.next_token)
                self.next_token += 1

    @precondition(lambda self: self.step is not None)
    @rule(release_all=st.booleans())
    def finish_step(self, release_all: bool) -> None:
        for slot, token in self.in_flight:  # includes writes of sequences cancelled meanwhile
            self.write(slot, token)
        self.in_flight.clear()
        self.busy.clear()
        self.cache.release_fenced(None if release_all else self.step)
        self.step = None

    @precondition(lambda self: self.idle())
    @rule(index=st.integers(0, 100))
    def fork(self, index: int) -> None:
        parent = self.pick(index, self.idle())
        free = self.cache.num_free_blocks
        self.cache.fork(parent, self.next_seq)
        assert self.cache.num_free_blocks == free  # a fork allocates nothing
        assert self.cache.block_table(self.next_seq) == self.cache.block_table(parent)
        self.tokens[self.next_seq] = list(self.tokens[parent])
        self.next_seq += 1

    @precondition(lambda self: self.tokens)
    @rule(index=st.integers(0, 100))
    def free_or_cancel(self, index: int) -> None:
        """Any ending: finished, or cancelled while its step is still in flight."""
        seq = self.pick(index, self.live())
        others = {s: self.cache.block_table(s) for s in self.live() if s != seq}
        self.cache.free_sequence(seq)
        del self.tokens[seq]
        self.busy.pop(seq, None)
        assert {s: self.cache.block_table(s) for s in others} == others

    @precondition(lambda self: self.step is None)
    @rule()
    def release_fenced(self) -> None:
        self.cache.release_fenced()

    # ---- checks after every step ---------------------------------------------------------------

    def snapshot(self):
        return ({s: self.cache.block_table(s) for s in self.live()}, {s: self.cache.seq_len(s) for s in self.live()},
                self.cache.num_free_blocks, self.cache.num_pending_blocks)

    @invariant()
    def invariants_hold(self) -> None:
        self.cache.check_invariants()
        profile = self.cache.memory_profile()
        assert profile.free_blocks + profile.pending_blocks + profile.physical_blocks == CONFIG.num_blocks - 1
        assert profile.capacity_tokens == self.cache.num_free_blocks * CONFIG.block_size
        assert profile.total_tokens == sum(len(t) for t in self.tokens.values())
        assert self.device.ledger.bytes_by_tag()["kv"] - self.kv_baseline == CONFIG.cache_bytes == profile.pool_bytes_total
        for seq, toks in self.tokens.items():
            assert self.cache.seq_len(seq) == len(toks)

    @invariant()
    def data_is_what_was_written(self) -> None:
        for seq, toks in self.tokens.items():
            written = self.busy.get(seq, len(toks))
            for layer in range(CONFIG.n_layers):
                k, v = gather_kv(self.cache, seq, layer)
                expect_k = [row_value(t, layer, "k") for t in toks[:written]]
                expect_v = [row_value(t, layer, "v") for t in toks[:written]]
                assert k[:written, 0, 0].tolist() == expect_k, f"sequence {seq} layer {layer} K"
                assert v[:written, 0, 0].tolist() == expect_v, f"sequence {seq} layer {layer} V"

    def teardown(self) -> None:
        # Quiescence: end everything by the ordinary paths; every block and byte comes back.
        for seq in self.live():
            self.cache.free_sequence(seq)
        self.cache.release_fenced()
        self.cache.check_invariants(quiescent=True)
        assert self.cache.num_free_blocks == CONFIG.num_blocks - 1
        self.cache.close()
        assert self.device.ledger.bytes_by_tag()["kv"] == self.kv_baseline
        assert self.device.ledger.live() == []


KvCacheMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow],
)
test_kv_cache_state_machine = KvCacheMachine.TestCase
