"""The prefix-caching workloads of `rocmforge profile-kv --workloads` (hipcore/kvcache/prefix_cache.py): what a
chat's growing history and a shared system prompt leave in the KV cache, and how much of each prompt the cache
already held (the hit rate, in prompt tokens, as vLLM counts it).

  chat    C conversations of T turns, run together turn by turn: each turn's prompt is the whole history (every
          earlier prompt and reply) plus new user tokens, so from the second turn on it starts with what the
          conversation's last turn left cached. A snapshot per turn, once every prompt is in the cache.
  system  one request with a system prompt and a user part alone (its blocks are cached when it ends), then the
          others together, each the same system prompt and its own user part: they share the system prompt's
          blocks (reference counted) instead of each computing and holding its own.
"""

from __future__ import annotations

from hipcore.engine.sampler import SamplingParams
from profiles.kv_workload_run import Bench, WorkloadResult, WorkloadRun, WorkloadSpec

USER_TEXT_START = 500  # where the user parts' text starts in the prompt source, away from the system prompt's


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def prefix_blocks_needed(spec: WorkloadSpec, block_size: int) -> int:
    """Usable blocks the two workloads need at their peak, by the engine's admission rule."""
    chat = spec.chat_turns * (spec.chat_turn_tokens + spec.chat_reply_tokens)
    system = spec.system_tokens + spec.system_user_tokens + spec.chat_reply_tokens
    return max(spec.chat_conversations * _blocks(chat, block_size), spec.system_requests * _blocks(system, block_size))


def _reply_params(spec: WorkloadSpec) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=spec.chat_reply_tokens, ignore_eos=True)


class _HitRate:
    """The cache's hit counters between two readings."""

    def __init__(self, run: WorkloadRun):
        self.run = run
        self.queries, self.hits = self._read()

    def _read(self) -> tuple[int, int]:
        profile = self.run.bench.cache.memory_profile()
        return profile.prefix_query_tokens, profile.prefix_hit_tokens

    def note(self, label: str) -> None:
        queries, hits = self._read()
        asked, found = queries - self.queries, hits - self.hits
        rate = f" ({found / asked:.0%})" if asked else ""
        self.run.notes.append(f"{label}: {found:,} of {asked:,} prompt tokens found in the prefix cache{rate}")
        self.queries, self.hits = queries, hits


def multi_turn_chat(bench: Bench, spec: WorkloadSpec) -> WorkloadResult:
    run = WorkloadRun(bench)
    conversations, turns = spec.chat_conversations, spec.chat_turns
    histories: list[list[int]] = [[] for _ in range(conversations)]
    rate = _HitRate(run)
    for turn in range(turns):
        for c, history in enumerate(histories):
            history += run.text(1 + 13 * (c * turns + turn), spec.chat_turn_tokens)
        ids = [run.submit_tokens(list(history), _reply_params(spec)) for history in histories]
        lengths = [len(history) for history in histories]
        run.step_until(lambda: all(run.cached(rid) and run.cached(rid)[0] >= n for rid, n in zip(ids, lengths)))
        label = f"turn {turn + 1}: {conversations} prompts of {lengths[0]:,}+ tokens"
        run.snapshot(label, *ids)
        run.engine.run_until_idle()
        rate.note(f"turn {turn + 1}")
        for history, rid in zip(histories, ids):
            record = run.engine.finished_record(rid)
            history += list(record.generated_tokens[0]) if record is not None else []
    return run.finish("chat", f"{conversations} conversations of {turns} turns, each turn's prompt the whole history "
                              f"plus {spec.chat_turn_tokens} user tokens, replies of {spec.chat_reply_tokens}")


def shared_system_prompt(bench: Bench, spec: WorkloadSpec) -> WorkloadResult:
    run = WorkloadRun(bench)
    system = run.text(0, spec.system_tokens)

    def prompt(i: int) -> list[int]:
        return system + run.text(USER_TEXT_START + 37 * i, spec.system_user_tokens)

    rate = _HitRate(run)
    first = run.submit_tokens(prompt(0), _reply_params(spec))
    run.engine.run_until_idle()
    run.snapshot("the first request ended")
    rate.note("the first request")
    others = spec.system_requests - 1
    ids = [run.submit_tokens(prompt(i + 1), _reply_params(spec)) for i in range(others)]
    length = len(prompt(1))
    run.step_until(lambda: all(run.cached(rid) and run.cached(rid)[0] >= length for rid in ids))
    run.snapshot(f"{others} more, running together", *ids)
    run.engine.run_until_idle()
    rate.note(f"the {others} others")
    del first
    return run.finish("system", f"{spec.system_requests} requests sharing a {spec.system_tokens}-token system prompt, "
                                f"each with {spec.system_user_tokens} user tokens: one alone, then the rest together")


PREFIX_WORKLOADS = (multi_turn_chat, shared_system_prompt)
