"""A prompt's whole life in a KvCache, for the prefix cache's tests (test_kv_prefix_cache, test_kv_prefix_invariants)."""

from __future__ import annotations

from hipcore.kvcache.cache import KvCache


def run(cache: KvCache, seq: int, tokens: list[int]) -> int:
    """A prompt evaluated and ended: added with its prefix looked up, the rest reserved, freed with its tokens
    computed (hashed on the way out), the step's fence released; invariants checked. Returns the cached tokens it
    started with."""
    cached = cache.add_sequence(seq, tokens)
    assert cache.reserve(seq, len(tokens) - cached)
    cache.free_sequence(seq, computed=tokens)
    cache.release_fenced()
    cache.check_invariants()
    return cached
