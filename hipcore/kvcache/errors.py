"""Errors of the KV cache.

Running out of blocks is NOT an error: `KvCache.reserve` returns False and changes nothing, so the
scheduler can preempt or queue. These exceptions are for a bad configuration (a user's mistake,
exit 2), a call with an id or count that makes no sense (the caller's bug, caught before anything
changes), and a broken invariant (our bug, named precisely so it can be found).
"""

from __future__ import annotations

from hipcore.errors import RocmforgeError, UsageError


class KvConfigError(UsageError):
    """A KV cache configuration that cannot work (bad shape, dtype, block size, or absurd size)."""


class KvCacheError(RocmforgeError):
    """A call the cache refuses before touching anything: unknown or duplicate sequence id,
    a negative count, a slot range outside the sequence."""


class KvInvariantError(KvCacheError):
    """A KV cache invariant does not hold (docs/architecture.md, "KV cache invariants"); the message names
    the block and the sequence involved."""
