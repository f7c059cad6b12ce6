"""What every `profile-kv --workloads` workload is made of: its sizes (WorkloadSpec), the engine and cache it runs
on (Bench), one run's requests and MemoryProfile snapshots (WorkloadRun), and what it returns (WorkloadResult)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from hipcore.engine.engine import Engine
from hipcore.engine.sampler import SamplingParams
from hipcore.errors import UsageError
from hipcore.kvcache import KvCache, KvInvariantError, MemoryProfile


@dataclass(frozen=True)
class WorkloadSpec:
    """Sizes kept small by default: on the cpu backend the demo model evaluates a few hundred prompt
    tokens per second at best, and every workload runs its own prompts."""

    lengths: tuple[int, ...] = (1, 17, 100)  # single sequences
    concurrent: int = 8  # sequences resident together, of lengths concurrent_base + 5 * i
    concurrent_base: int = 24
    append_tokens: int = 17  # a full block of 16 and one token: fragmentation shows
    fork_prompt: int = 40
    samples: int = 4
    fork_tokens: int = 4  # tokens each sample generates before the second fork snapshot (the first copies)
    chat_conversations: int = 4  # conversations run together, turn by turn
    chat_turns: int = 4
    chat_turn_tokens: int = 24  # user tokens each turn adds to the history
    chat_reply_tokens: int = 8  # tokens each reply adds
    system_tokens: int = 48  # the shared system prompt
    system_requests: int = 6  # one alone, then the others together
    system_user_tokens: int = 8

    def check(self, context: int) -> None:
        for name, value in (("--concurrent", self.concurrent), ("--samples", self.samples)):
            if not 1 <= value <= 256:
                raise UsageError(f"{name} must be between 1 and 256, got {value}")
        if not self.lengths or any(not 1 <= n for n in self.lengths):
            raise UsageError("--length values must be at least 1 token")
        if self.longest + 2 > context:
            raise UsageError(f"the longest workload sequence needs {self.longest + 2} tokens of context but the "
                             f"model has {context}; use shorter --length values")

    @property
    def concurrent_lengths(self) -> list[int]:
        return [self.concurrent_base + 5 * i for i in range(self.concurrent)]

    @property
    def max_seqs(self) -> int:
        return max(self.concurrent, self.samples, self.chat_conversations, self.system_requests)

    @property
    def longest(self) -> int:
        chat = self.chat_turns * (self.chat_turn_tokens + self.chat_reply_tokens)
        system = self.system_tokens + self.system_user_tokens + self.chat_reply_tokens
        return max(*self.lengths, *self.concurrent_lengths, self.append_tokens, self.fork_prompt + self.fork_tokens,
                   chat, system)


@dataclass(frozen=True)
class Snapshot:
    label: str
    profile: MemoryProfile

    def to_dict(self) -> dict[str, object]:
        return {"label": self.label, "profile": self.profile.to_dict()}


@dataclass(frozen=True)
class WorkloadResult:
    name: str
    description: str
    snapshots: tuple[Snapshot, ...]
    quiescent_after: bool  # once its requests ended: every block back, every count 0, no sequence left
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "description": self.description, "snapshots": [s.to_dict() for s in self.snapshots],
                "quiescent_after": self.quiescent_after, "notes": list(self.notes)}


@dataclass
class Bench:
    engine: Engine
    cache: KvCache
    device_text: str
    mode: str
    prompt_source: Callable[[int], list[int]]
    close: Callable[[], None]
    device: object = None  # the Device whose ledger holds the pools (and the weights, on a real model)


@dataclass
class WorkloadRun:
    bench: Bench
    snapshots: list[Snapshot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)

    @property
    def engine(self) -> Engine:
        return self.bench.engine

    def submit(self, length: int, params: SamplingParams) -> int:
        return self.submit_tokens(self.bench.prompt_source(length), params)

    def submit_tokens(self, tokens: list[int], params: SamplingParams) -> int:
        self.ids.append(self.engine.submit(tokens, params))
        return self.ids[-1]

    def text(self, start: int, length: int) -> list[int]:
        """`length` prompt tokens from position `start` of the prompt source (distinct starts: distinct text)."""
        return self.bench.prompt_source(start + length)[start:]

    def cached(self, rid: int) -> list[int]:
        """Tokens cached per live sample of a request (empty once it ended)."""
        request = self.engine.request(rid)
        return [] if request is None else [s.num_cached for s in request.live_seqs]

    def step_until(self, done: Callable[[], bool], limit: int = 100_000) -> None:
        for _ in range(limit):
            if done() or not self.engine.has_work():
                return
            self.engine.step()

    def snapshot(self, label: str, *expected: int) -> None:
        """The cache's profile now; `expected` are the requests that should be in it."""
        ended = [rid for rid in expected if self.engine.request(rid) is None]
        if ended:
            self.notes.append(f"{label}: request(s) {ended} ended early (end of text) and are not in the profile")
        self.snapshots.append(Snapshot(label, self.bench.cache.memory_profile()))

    def finish(self, name: str, description: str) -> WorkloadResult:
        for rid in self.ids:
            self.engine.cancel(rid)
        self.engine.run_until_idle()
        try:
            self.bench.cache.check_invariants(quiescent=True)
            quiescent = True
        except KvInvariantError as exc:
            quiescent = False
            self.notes.append(f"NOT quiescent after the workload: {exc}")
        # Cached blocks are evictable, not held: quiescent allows them. Each workload starts from an empty cache
        # and counts its own hits.
        self.bench.cache.flush_prefix_cache()
        self.bench.cache.reset_prefix_counts()
        return WorkloadResult(name, description, tuple(self.snapshots), quiescent, tuple(self.notes))


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens)
