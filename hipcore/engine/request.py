"""Requests and their sequences as the engine and the scheduler track them, and how they end."""

from __future__ import annotations

import enum
import queue
import time
from dataclasses import dataclass, field
from typing import Any

from hipcore.engine.text_buffer import TextBuffer
from hipcore.kvcache.prefix_index import BlockKeys


class Ending(str, enum.Enum):
    """Every way a request can end. All of them go through the engine's one release path."""

    EOS = "eos"  # an end-of-generation token
    STOP = "stop"  # a stop string matched
    LENGTH = "length"  # max tokens, or the context is full
    CANCELLED = "cancelled"
    FAILED = "failed"  # an error while it ran (a kernel or sampler error, an injected fault)
    REJECTED = "rejected"  # can never fit the KV pool or the context
    DROPPED = "dropped"  # preempted and then dropped (the engine shut down before it could resume)


class Phase(str, enum.Enum):
    """Where a request is; used to say where it was when it ended (leak reports, cancel tests)."""

    WAITING = "waiting"
    PROMPT = "prompt"  # its prompt is being evaluated (possibly in chunks)
    DECODE = "decode"
    FINISHED = "finished"


class CancelResult(str, enum.Enum):
    CANCELLED = "cancelled"  # it will end at the start of the next step
    ALREADY_FINISHED = "already finished"
    UNKNOWN = "unknown request"


@dataclass(eq=False)  # identity semantics: sequences are tracked in sets and dicts
class Sequence:
    """One token stream with its own KV blocks. A request with n parallel samples has n of them."""

    seq_id: int
    request: "Request"
    tokens: list[int]  # prompt + generated, in order
    num_prompt: int
    num_cached: int = 0  # tokens whose K/V are in the cache
    finished: bool = False
    ending: Ending | None = None
    decoder: Any = None  # the tokenizer's stream decoder for this sequence
    stop_checker: Any = None
    sampler: Any = None
    output: TextBuffer = field(default_factory=TextBuffer, repr=False)  # text emitted so far (see `text`)
    _keys: BlockKeys | None = field(default=None, repr=False)  # (see `block_keys`)

    @property
    def block_keys(self) -> BlockKeys:
        """The prefix cache's keys of the full blocks of `tokens`, each hashed once for all the sequence's lookups and
        hashings (queue, admission, prompt end, preemption, release). The engine only appends to `tokens`, which
        leaves every full block's key valid; a new token list gets new keys."""
        keys = self._keys
        if keys is None or keys.tokens is not self.tokens:
            keys = self._keys = BlockKeys(self.tokens)
        return keys

    def copy_block_keys(self, other: "Sequence") -> None:
        """Its tokens are a copy of `other`'s (a parallel sample's at the fork): the keys hashed so far are its too."""
        self._keys = other.block_keys.fork(self.tokens)

    @property
    def text(self) -> str:
        """The text emitted so far."""
        return self.output.value()

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.num_prompt:]

    @property
    def pending(self) -> int:
        """Tokens still to compute before the next sample."""
        return len(self.tokens) - self.num_cached

    @property
    def in_prompt(self) -> bool:
        return self.num_cached < self.num_prompt


@dataclass(eq=False)
class Request:
    request_id: int
    prompt_ids: list[int]
    params: Any  # hipcore.engine.sampler.SamplingParams
    arrival: int  # submission order, for FIFO admission and newest-first preemption
    seqs: list[Sequence] = field(default_factory=list)
    phase: Phase = Phase.WAITING
    ending: Ending | None = None
    error: str | None = None
    # SimpleQueue: a put per token from the engine thread; queue.Queue's Condition costs several times more
    events: "queue.SimpleQueue[Event]" = field(default_factory=queue.SimpleQueue)
    preemptions: int = 0
    submitted_at: float = field(default_factory=time.perf_counter)
    admitted_at: float | None = None  # the scheduler's first admission (a preempted request keeps it)
    first_token_at: float | None = None
    finished_at: float | None = None
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at its first admission (none computed)
    tag: str = ""  # free-form label from the caller (leak-check records the planned ending)

    @property
    def live_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs if not s.finished]


@dataclass(frozen=True)
class Event:
    """What a request's stream yields: text and token ids as they come, then one final event."""

    request_id: int
    seq_index: int  # which parallel sample (0 unless n > 1)
    token_ids: tuple[int, ...] = ()
    text: str = ""
    finished: bool = False
    ending: Ending | None = None
    error: str | None = None
    cached_tokens: int = 0  # the final event's: prompt tokens found in the prefix cache (FinishedRecord's)
    # With SamplingParams.logprobs: the token's log-probability and the top ones [(id, logprob)] (Sampler.logprobs)
    logprobs: tuple | None = None

    # The engine makes one per token per sequence. The __init__ that frozen=True generates sets each field
    # through object.__setattr__ (~1.2 us for seven); storing into __dict__ takes ~0.3 us. dataclass keeps an
    # __init__ the class defines, and frozen still refuses every later assignment.
    def __init__(self, request_id: int, seq_index: int, token_ids: tuple[int, ...] = (), text: str = "",
                 finished: bool = False, ending: Ending | None = None, error: str | None = None, cached_tokens: int = 0,
                 logprobs: tuple | None = None):
        fields = self.__dict__
        fields["request_id"] = request_id
        fields["seq_index"] = seq_index
        fields["token_ids"] = token_ids
        fields["text"] = text
        fields["finished"] = finished
        fields["ending"] = ending
        fields["error"] = error
        fields["cached_tokens"] = cached_tokens
        fields["logprobs"] = logprobs


@dataclass(frozen=True)
class FinishedRecord:
    """What the engine remembers of an ended request (kept up to a bound)."""

    request_id: int
    ending: Ending
    phase_at_end: Phase
    seq_ids: tuple[int, ...]
    prompt_tokens: int
    generated_tokens: tuple[tuple[int, ...], ...]  # per sequence
    texts: tuple[str, ...]
    error: str | None
    preemptions: int
    tag: str
    seconds: float
    time_to_first_token: float | None
    cached_tokens: int = 0  # of the prompt, found in the prefix cache (OpenAI's usage.prompt_tokens_details)
