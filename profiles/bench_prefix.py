"""`rocmforge bench --prefix-reuse`: a multi-turn chat load through the Engine, once with the prefix cache and once
without, on the same model: what reusing a conversation's history saves (issue 52).

The load: C conversations run together, turn by turn. Each turn adds `turn_tokens` random user tokens to every
conversation's history and asks for `reply_tokens` (end-of-generation ignored); the reply joins the history, so turn
t's prompt is the whole conversation so far. All C requests of a turn are submitted at once, as C chat clients of a
server would send them, and the turn ends when all have answered. Per turn: time to first token (submission to the
first token on the host: the queue, the prompt's steps and the first sample), p50 and p99 over the C requests, and
the share of prompt tokens the cache held. Over the run: tokens per second, prompt and generated tokens over the
wall time of all turns. Before either run, serve's warm-up (hipcore/engine/warmup.py: every decode batch-size class,
the prompt-step shapes) and two turns of the load both ways, so that neither run pays a first use the other does not.

Both runs use the same random user tokens (one seed); the replies are each run's own greedy tokens.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from hipcore.engine.engine import Engine
from hipcore.engine.sampler import SamplingParams
from hipcore.engine.warmup import warm_up
from hipcore.errors import UsageError

GPU_CHAT = dict(conversations=32, turns=8, turn_tokens=200, reply_tokens=32)
CPU_CHAT = dict(conversations=4, turns=3, turn_tokens=24, reply_tokens=4)


@dataclass(frozen=True)
class ChatLoad:
    conversations: int = 32
    turns: int = 8
    turn_tokens: int = 200
    reply_tokens: int = 32
    seed: int = 0

    def validate(self) -> None:
        for name, value in (("--conversations", self.conversations), ("--turns", self.turns),
                            ("--turn-tokens", self.turn_tokens), ("--reply-tokens", self.reply_tokens)):
            if value < 1:
                raise UsageError(f"{name} must be at least 1, got {value}")

    @property
    def context(self) -> int:
        """The longest conversation, with one spare token, rounded up to 64."""
        return -(-(self.turns * (self.turn_tokens + self.reply_tokens) + 2) // 64) * 64

    def warm_up(self) -> "ChatLoad":
        return ChatLoad(self.conversations, 2, self.turn_tokens, min(self.reply_tokens, 4), self.seed + 1)


@dataclass
class TurnFigures:
    turn: int
    prompt_tokens: int  # the mean prompt of the turn
    ttft_p50: float  # seconds
    ttft_p99: float
    hit_rate: float  # prompt tokens found in the prefix cache over prompt tokens submitted, this turn
    seconds: float


@dataclass
class ChatRun:
    prefix_caching: bool
    turns: list[TurnFigures] = field(default_factory=list)
    seconds: float = 0.0
    prompt_tokens: int = 0  # submitted
    computed_prompt_tokens: int = 0  # evaluated by the engine (submitted - found in the cache)
    generated_tokens: int = 0

    @property
    def tokens_per_second(self) -> float:
        return (self.prompt_tokens + self.generated_tokens) / self.seconds if self.seconds else 0.0

    @property
    def generated_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "tokens_per_second": self.tokens_per_second,
                "generated_per_second": self.generated_per_second}


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def run_chat_load(loaded, load: ChatLoad, *, prefix_caching: bool, tokenizer, say=lambda _m: None) -> ChatRun:
    """One run of the load on the loaded model's runner and cache, through an Engine of its own."""
    cache = loaded.cache
    cache.set_prefix_caching(prefix_caching)
    cache.reset_prefix_counts()
    runner = loaded.runner
    engine = Engine(runner, tokenizer, cache, max_seqs=runner.max_seqs, max_step_tokens=runner.max_step_tokens,
                    max_context=min(load.context, loaded.memory_plan.ctx_size))
    vocab = loaded.config.vocab_size
    low = min(100, vocab // 4)  # clear of the special tokens at the start of most vocabularies
    rng = np.random.default_rng(load.seed)
    histories: list[list[int]] = [[] for _ in range(load.conversations)]
    params = SamplingParams(temperature=0.0, max_tokens=load.reply_tokens)
    run = ChatRun(prefix_caching)
    computed_before = engine.stats.prompt_tokens
    try:
        for turn in range(1, load.turns + 1):
            for history in histories:
                history += [int(t) for t in rng.integers(low, vocab, load.turn_tokens)]
            queries, hits = _counts(cache)
            t0 = time.perf_counter()
            ids = [engine.submit(list(history), params) for history in histories]
            engine.run_until_idle()
            seconds = time.perf_counter() - t0
            records = [engine.finished_record(rid) for rid in ids]
            ttfts = [r.time_to_first_token for r in records if r is not None and r.time_to_first_token is not None]
            queries_now, hits_now = _counts(cache)
            submitted = sum(len(h) for h in histories)
            run.turns.append(TurnFigures(
                turn, submitted // len(histories), percentile(ttfts, 50), percentile(ttfts, 99),
                (hits_now - hits) / (queries_now - queries) if queries_now > queries else 0.0, seconds))
            run.seconds += seconds
            run.prompt_tokens += submitted
            for history, record in zip(histories, records):
                reply = list(record.generated_tokens[0]) if record is not None else []
                run.generated_tokens += len(reply)
                history += reply
            say(f"  turn {turn}: time to first token p50 {run.turns[-1].ttft_p50 * 1e3:,.1f} ms, "
                f"{run.turns[-1].hit_rate:.0%} of the prompts cached")
        run.computed_prompt_tokens = engine.stats.prompt_tokens - computed_before
    finally:
        engine.shutdown()
        cache.release_fenced()
        cache.flush_prefix_cache()
        cache.reset_prefix_counts()
    return run


def _counts(cache) -> tuple[int, int]:
    prefix = cache.prefix
    return (prefix.query_tokens, prefix.hit_tokens) if prefix is not None else (0, 0)


@dataclass
class PrefixReuseReport:
    load: ChatLoad
    with_cache: ChatRun
    without_cache: ChatRun

    def to_dict(self) -> dict:
        return {"load": asdict(self.load), "with_cache": self.with_cache.to_dict(),
                "without_cache": self.without_cache.to_dict(),
                "throughput_ratio": ratio(self.with_cache.tokens_per_second, self.without_cache.tokens_per_second)}

    def markdown(self) -> list[str]:
        """bench's table of the test: one row per turn, then the run's throughput."""
        load, on, off = self.load, self.with_cache, self.without_cache
        lines = [f"prefix reuse: {load.conversations} conversations x {load.turns} turns, {load.turn_tokens} user tokens "
                 f"and {load.reply_tokens} reply tokens a turn",
                 "",
                 "| turn | prompt | TTFT p50 cached | TTFT p50 uncached | p50 ratio | TTFT p99 cached | TTFT p99 uncached "
                 "| hit rate |",
                 "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for a, b in zip(on.turns, off.turns):
            lines.append(f"| {a.turn} | {a.prompt_tokens:,} | {_ms(a.ttft_p50)} | {_ms(b.ttft_p50)} | "
                         f"{_ratio(a.ttft_p50, b.ttft_p50)} | {_ms(a.ttft_p99)} | {_ms(b.ttft_p99)} | {a.hit_rate:.0%} |")
        lines += ["", "| run | seconds | prompt tokens computed | tokens/s (prompt + generated) | generated/s |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for name, r in (("prefix cache", on), ("no prefix cache", off)):
            lines.append(f"| {name} | {r.seconds:,.2f} | {r.computed_prompt_tokens:,} of {r.prompt_tokens:,} | "
                         f"{r.tokens_per_second:,.1f} | {r.generated_per_second:,.1f} |")
        lines.append(f"| ratio | | | {_ratio(on.tokens_per_second, off.tokens_per_second)} | "
                     f"{_ratio(on.generated_per_second, off.generated_per_second)} |")
        return lines


def ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _ratio(a: float, b: float) -> str:
    r = ratio(a, b)
    return "-" if r is None else f"{r:.2f}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def run_prefix_reuse(loaded, load: ChatLoad, *, tokenizer, say=lambda _m: None) -> PrefixReuseReport:
    """Warm up, then the load with the prefix cache and without."""
    load.validate()
    say("prefix reuse: warm-up")
    loaded.cache.set_prefix_caching(False)
    warm_up(loaded.engine, load.conversations)
    for caching in (True, False):
        run_chat_load(loaded, load.warm_up(), prefix_caching=caching, tokenizer=tokenizer)
    say("prefix reuse: with the prefix cache")
    on = run_chat_load(loaded, load, prefix_caching=True, tokenizer=tokenizer, say=say)
    say("prefix reuse: without it")
    off = run_chat_load(loaded, load, prefix_caching=False, tokenizer=tokenizer, say=say)
    return PrefixReuseReport(load, on, off)

