"""Token sampling (greedy, penalties, top-k, top-p, min-p, temperature, seeded draw) and stops.

The filter order is llama.cpp's default sampler chain (common/common.h,
`common_params_sampling::samplers`): penalties -> top-k -> top-p -> min-p -> temperature -> draw.
llama.cpp also lists DRY, top-n-sigma, typical-p and XTC in that chain, but all four are disabled
by default and we do not offer them, so the remaining order is the one above. Keeping llama.cpp's
order matters because the filters do not commute: top-p and min-p look at probabilities at
temperature 1 (temperature is applied after them), so `--temp 2 --top-p 0.9` keeps the same
candidates here as in llama.cpp, and only their relative weights change.

Greedy (temperature 0) still applies the penalties first, as llama.cpp does, then takes the
argmax (ties go to the lowest token id, like numpy's argmax).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Iterable, Sequence

import numpy as np

from hipcore.engine.text_buffer import TextBuffer
from hipcore.errors import UsageError
from hipcore.ops.sample import MAX_TOP_K, min_p_filter, softmax, top_k_filter, top_p_filter, whole_vocabulary

MAX_STOP_STRINGS = 16
_INT32_MAX = 2**31 - 1
UNIFORM_BATCH = 64  # Sampler.next_uniform's draws per generator call
MAX_STOP_STRING_CHARS = 256
MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit


@dataclass(frozen=True)
class SamplingParams:
    """What to sample and when to stop. Defaults are llama.cpp's (llama-cli) defaults.

    temperature 0 means greedy. top_k 0, top_p 1 and min_p 0 each disable their filter.
    repeat_last_n is the penalty window in tokens: 0 disables penalties, -1 means the whole history.
    seed None draws a fresh seed from the OS; an int makes sampling reproducible.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = field(default_factory=tuple)
    n: int = 1  # parallel samples of one prompt; they share the prompt's KV blocks
    # Generate through end-of-generation tokens up to max_tokens (llama.cpp's --ignore-eos, vLLM's ignore_eos):
    # fixed output lengths for benchmarks. Stop strings still end the request.
    ignore_eos: bool = False
    # A constraint's grammar in llguidance's text (hipcore/engine/grammar.py, compile_grammar): each step's
    # logits are masked to the tokens it allows before the chain above. None: unconstrained.
    grammar: str | None = None
    # Log-probabilities of each sampled token and of the `logprobs` most likely ones (0: the sampled token's
    # alone; OpenAI's top_logprobs, at most MAX_LOGPROBS), from the distribution sample() draws from. None: off.
    logprobs: int | None = None

    def __post_init__(self) -> None:
        # Accept any sequence of stop strings but store a tuple, so the params stay hashable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        self.validate()

    def validate(self) -> None:
        """Raise UsageError (exit 2) with a one-line message on the first bad value."""
        _check_real("temperature", self.temperature, low=0.0, high=100.0, hint="0 means greedy")
        _check_int("top_k", self.top_k, low=0, high=1 << 31, hint="0 disables top-k")
        _check_real("top_p", self.top_p, low=0.0, high=1.0, low_open=True, hint="1 disables top-p")
        _check_real("min_p", self.min_p, low=0.0, high=1.0, hint="0 disables min-p")
        _check_real("repeat_penalty", self.repeat_penalty, low=0.0, high=100.0, low_open=True,
                    hint="1 disables it")
        _check_int("repeat_last_n", self.repeat_last_n, low=-1, high=1 << 31,
                   hint="0 disables penalties, -1 uses the whole history")
        _check_real("presence_penalty", self.presence_penalty, low=-2.0, high=2.0, hint="0 disables it")
        _check_real("frequency_penalty", self.frequency_penalty, low=-2.0, high=2.0,
                    hint="0 disables it")
        if self.seed is not None:
            _check_int("seed", self.seed, low=0, high=(1 << 64) - 1, hint="leave it out for a random seed")
        _check_int("max_tokens", self.max_tokens, low=1, high=1 << 31, hint="the number of tokens to generate")
        _check_int("n", self.n, low=1, high=1024, hint="the number of parallel samples")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, low=0, high=MAX_LOGPROBS, hint="the most likely tokens reported")
        if not isinstance(self.ignore_eos, bool):
            raise UsageError(f"ignore_eos must be true or false, got {self.ignore_eos!r}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise UsageError(f"too many stop strings: {len(self.stop)} (at most {MAX_STOP_STRINGS})")
        for text in self.stop:
            if not isinstance(text, str) or not text:
                raise UsageError(f"stop strings must be non-empty text, got {text!r}")
            if len(text) > MAX_STOP_STRING_CHARS:
                raise UsageError(
                    f"stop string too long: {len(text)} characters (at most {MAX_STOP_STRING_CHARS})")

    def for_sample(self, index: int) -> "SamplingParams":
        """The params of parallel sample `index`: a seeded request gives each sample its own seed."""
        if index == 0 or self.seed is None:
            return self
        return replace(self, seed=(self.seed + index) % (1 << 64))

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalties_active(self) -> bool:
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0)


def _check_real(name: str, value, *, low: float, high: float, hint: str, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UsageError(f"{name} must be a finite number, got {value!r} ({hint})")
    too_low = value <= low if low_open else value < low
    if too_low or value > high:
        bracket = "(" if low_open else "["
        raise UsageError(f"{name} must be in {bracket}{low:g}, {high:g}], got {value:g} ({hint})")


def _check_int(name: str, value, *, low: int, high: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise UsageError(f"{name} must be a whole number, got {value!r} ({hint})")
    if not low <= int(value) <= high:
        raise UsageError(f"{name} must be between {low} and {high}, got {int(value)} ({hint})")


# --- the filters: each takes candidate (ids, logits) and returns the kept subset ------------------

def apply_penalties(logits: np.ndarray, history: Sequence[int], params: SamplingParams) -> np.ndarray:
    """llama.cpp's penalties over the last `repeat_last_n` tokens of `history`, on a copy.

    Repeat penalty divides a positive logit and multiplies a negative one (so it always lowers the
    token); frequency subtracts count * penalty; presence subtracts the penalty once.
    """
    if not params.penalties_active or len(history) == 0:
        return logits
    window = np.asarray(history, dtype=np.int64)
    if params.repeat_last_n > 0:
        window = window[-params.repeat_last_n:]
    window = window[(window >= 0) & (window < logits.shape[0])]
    ids, counts = np.unique(window, return_counts=True)
    out = logits.astype(np.float32, copy=True)
    seen = out[ids]
    seen = np.where(seen <= 0, seen * params.repeat_penalty, seen / params.repeat_penalty)
    seen = seen - counts * params.frequency_penalty - params.presence_penalty
    out[ids] = seen
    return out


class Sampler:
    """Picks the next token from a logits vector; holds the seeded generator of one request."""

    def __init__(self, params: SamplingParams, constraint=None):
        """constraint: the sequence's TokenConstraint (hipcore/engine/grammar.py) when params.grammar is set."""
        params.validate()
        self.params = params
        self.constraint = constraint
        seed = params.seed if params.seed is not None else int(np.random.SeedSequence().entropy % (1 << 64))
        self.seed = seed
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._drawn: list[float] = []  # next_uniform's draws not taken yet, the next one last
        # Asked every step; params are frozen. device_row: the row of SamplingRows.from_rows without the uniform;
        # top_k capped at int32's largest (the device reads it as a float; only a greedy row, which ignores it,
        # can hold more and still be samplable on the device).
        # A constrained row samples on the device too, its grammar's mask uploaded every step (the engine's
        # StepLauncher); log-probabilities need the row's logits on the host.
        self.device_samplable = device_samplable(params) and params.logprobs is None
        self.logprobs: tuple | None = None  # the last sampled token's (logprob, [(id, logprob)...]) with params.logprobs
        self.greedy = params.greedy
        self.device_row = (0.0 if params.greedy else float(params.temperature), min(int(params.top_k), _INT32_MAX),
                           float(params.top_p), float(params.min_p))

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """The next token id. `history` is every token so far (prompt and generated)."""
        logits = np.asarray(logits)
        if logits.ndim != 1 or logits.shape[0] == 0:
            raise UsageError(f"sample() needs one non-empty row of logits, got shape {logits.shape}")
        params = self.params
        if self.constraint is not None:
            logits = self.constraint.mask(logits)
        logits = apply_penalties(logits, history, params)
        if params.greedy:
            return self._accepted(int(np.argmax(logits)), logits)
        ids = np.arange(logits.shape[0], dtype=np.int64)
        kept = logits.astype(np.float32, copy=False)
        if self.constraint is not None:  # only the tokens the grammar allows are candidates
            allowed = np.isfinite(kept)
            ids, kept = ids[allowed], kept[allowed]
        if not whole_vocabulary(params.top_k, params.top_p):  # else: every token, in id order, no sort
            ids, kept = top_k_filter(ids, kept, params.top_k)
            ids, kept = top_p_filter(ids, kept, params.top_p)
        ids, kept = min_p_filter(ids, kept, params.min_p)
        probs = softmax(kept / params.temperature)
        # One uniform draw against the cumulative distribution: reproducible for a given seed.
        cumulative = np.cumsum(probs)
        pick = int(np.searchsorted(cumulative, self.next_uniform() * cumulative[-1], side="right"))
        return self._accepted(int(ids[min(pick, ids.shape[0] - 1)]), logits)

    def accept_picked(self, token: int) -> None:
        """A token picked on the device (under the grammar's mask where constrained): the grammar moves on."""
        if self.constraint is not None:
            self.constraint.accept(token)

    def _accepted(self, token: int, logits: np.ndarray) -> int:
        if self.constraint is not None:
            self.constraint.accept(token)
        if self.params.logprobs is not None:
            self.logprobs = token_logprobs(logits, token, self.params.logprobs)
        return token

    def next_uniform(self) -> float:
        """The one draw sample() makes for a non-greedy pick. A caller that picks elsewhere (the device
        sampler, hipcore/ops/sample.py) takes it here, so the seeded sequence of draws stays the same.

        Drawn UNIFORM_BATCH at a time (one generator call costs ~0.4 us, about what a whole batch costs):
        a batch of n draws is exactly the next n single draws, and nothing else draws from this generator."""
        drawn = self._drawn
        if not drawn:
            drawn += reversed(self._rng.random(UNIFORM_BATCH).tolist())
        return drawn.pop()


def token_logprobs(logits: np.ndarray, token: int, top: int) -> tuple:
    """(the token's log-probability, [(id, logprob)] of the `top` most likely, most likely first) under the
    distribution the sampler draws from before its filters: the model's logits after the penalties and the
    grammar's mask, at temperature 1 (vLLM's and OpenAI's convention: the filters change which token is drawn, not
    the reported probabilities)."""
    row = np.asarray(logits, dtype=np.float64)
    finite = row[np.isfinite(row)]
    peak = finite.max()
    log_total = peak + math.log(np.exp(finite - peak).sum())
    chosen = float(row[token] - log_total)
    if top == 0:
        return chosen, ()
    best = np.argpartition(-row, min(top, row.shape[0] - 1))[:top]
    best = best[np.argsort(-row[best], kind="stable")]
    return chosen, tuple((int(i), float(row[i] - log_total)) for i in best if np.isfinite(row[i]))


def device_samplable(params: SamplingParams) -> bool:
    """True when the device sampler (hipcore/ops/sample.py) picks exactly what Sampler(params) would: no
    penalties (they need the token history) and either a top_k the kernel can hold or the whole vocabulary
    (no top-k, no top-p: OpenAI's defaults; a top_k of 0 with top_p < 1 needs a sort of every logit)."""
    return not params.penalties_active and (params.greedy or 0 < params.top_k <= MAX_TOP_K
                                            or whole_vocabulary(params.top_k, params.top_p))


# --- stops ----------------------------------------------------------------------------------------

class StopReason(str, Enum):
    EOS = "eos"                  # an end-of-sequence or end-of-turn token
    STOP_STRING = "stop"         # one of the stop strings appeared in the text
    MAX_TOKENS = "length"        # max_tokens generated


class StopChecker:
    """Decides when generation ends, and which text may be shown so far.

    Feed it each generated token with the text it decoded to (from the tokenizer's stream decoder).
    Text that could be the start of a stop string is held back until it is clear either way, so a
    stop string that spans several tokens is never printed, nor anything after it.
    """

    def __init__(self, *, eos_ids: Iterable[int], stop_strings: Sequence[str] = (), max_tokens: int,
                 output: TextBuffer | None = None):
        """output: where released text goes (`output` reads it); the engine gives the sequence's own, so the
        text is kept once."""
        _check_int("max_tokens", max_tokens, low=1, high=1 << 31, hint="the number of tokens to generate")
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.stop_strings = tuple(stop_strings)
        for text in self.stop_strings:
            if not isinstance(text, str) or not text:
                raise UsageError(f"stop strings must be non-empty text, got {text!r}")
        self.max_tokens = int(max_tokens)
        self.tokens_seen = 0
        self.reason: StopReason | None = None
        self._released = TextBuffer() if output is None else output  # everything released so far (`output`)
        self._held = ""

    @property
    def finished(self) -> bool:
        return self.reason is not None

    def push(self, token_id: int, text: str) -> str:
        """Record one generated token; return the text that can be shown now (maybe empty)."""
        if self.reason is not None:
            raise UsageError("push() after generation has already stopped")
        self.tokens_seen += 1
        if int(token_id) in self.eos_ids:
            self.reason = StopReason.EOS
            return self._release(self._take_held())
        if not self.stop_strings:  # nothing is ever held back: the text goes out as it comes
            if self.tokens_seen >= self.max_tokens:
                self.reason = StopReason.MAX_TOKENS
            if text:
                self._released.append(text)
            return text
        pending = self._held + text
        cut = self._first_stop(pending)
        if cut is not None:
            self.reason = StopReason.STOP_STRING
            self._held = ""
            return self._release(pending[:cut])
        if self.tokens_seen >= self.max_tokens:
            self.reason = StopReason.MAX_TOKENS
            self._held = ""
            return self._release(pending)
        keep = self._partial_stop_suffix(pending)
        self._held = pending[len(pending) - keep:] if keep else ""
        return self._release(pending[:len(pending) - keep])

    def flush(self) -> str:
        """Release held-back text when generation ends for another reason (e.g. cancelled)."""
        return self._release(self._take_held())

    def _take_held(self) -> str:
        held, self._held = self._held, ""
        return held

    @property
    def output(self) -> str:
        """Everything released so far."""
        return self._released.value()

    def _release(self, text: str) -> str:
        if text:
            self._released.append(text)
        return text

    def _first_stop(self, text: str) -> int | None:
        hits = [i for i in (text.find(s) for s in self.stop_strings) if i >= 0]
        return min(hits) if hits else None

    def _partial_stop_suffix(self, text: str) -> int:
        """Length of the longest suffix of text that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stop_strings:
            for length in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:length]):
                    best = length
                    break
        return best
