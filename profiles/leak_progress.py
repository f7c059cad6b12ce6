"""Progress of a leak-check run: tokens that stay generated, not steps.

A leak can keep the engine busy without progress: blocks that never come back leave just enough
room to admit a request and never to let it grow, so it preempts itself and recomputes its prompt
forever, and every step computes something. The driver asks `fruitless_preemption` after each
step and ends the run when a request was preempted MAX_FRUITLESS_PREEMPTIONS times in a row
without keeping a new generated token (preemption keeps generated tokens; only the KV is
recomputed), naming the blocks that never came back (`blocks_not_back`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

# Clean runs under the small default pool preempt a request a few times at most before it gains a
# token; a request recomputing because blocks leaked does it once a step (18,000 times in 120 s).
MAX_FRUITLESS_PREEMPTIONS = 50
BLOCKS_NAMED = 20


@dataclass
class PreemptionProgress:
    """Per request in flight: its preemptions seen so far and the tokens it kept at the last one."""

    preemptions_seen: int = 0
    kept_at_last_preemption: int = 0
    fruitless: int = 0  # preemptions in a row with no new generated token kept


def kept_tokens(request) -> int:
    return sum(len(seq.tokens) - seq.num_prompt for seq in request.seqs)


def fruitless_preemption(inflight: Iterable[tuple[int, object]]) -> str | None:
    """Update each in-flight entry's PreemptionProgress (entry.request, entry.plan, entry.progress);
    the reason to end the run, or None."""
    for rid, entry in inflight:
        request, p = entry.request, entry.progress
        if request.preemptions == p.preemptions_seen:
            continue
        kept = kept_tokens(request)
        new = request.preemptions - p.preemptions_seen
        p.fruitless = p.fruitless + new if kept <= p.kept_at_last_preemption else 0
        p.preemptions_seen, p.kept_at_last_preemption = request.preemptions, kept
        if p.fruitless >= MAX_FRUITLESS_PREEMPTIONS:
            return (f"request {rid} ({entry.plan.kind.label}) was preempted {p.fruitless} times in a row without keeping "
                    f"a new generated token ({kept} kept; it recomputes its prompt and cannot grow)")
    return None


def blocks_not_back(cache) -> str:
    """Once every request in flight was cancelled: the blocks still held by no table, i.e. the ones
    that never came back."""
    held = {b for seq_id in cache.sequences() for b in cache.block_table(seq_id)}
    lost = [b for b in range(1, cache.config.num_blocks) if cache.refcount(b) and b not in held]
    if not lost:
        return f"{cache.num_usable_blocks - cache.num_free_blocks} KV blocks not free, none without a table"
    shown = ", ".join(f"{b} (refcount {cache.refcount(b)})" for b in lost[:BLOCKS_NAMED])
    more = f" and {len(lost) - BLOCKS_NAMED} more" if len(lost) > BLOCKS_NAMED else ""
    return f"KV blocks that never came back (held by no table): {shown}{more}"
