"""The leak check's seeded workload: what each request asks for and how it is meant to end.

Every request is planned from (seed, index) alone, so a plan never has to be stored: the driver asks
for plan i when it submits request i, and a run is reproduced exactly by its seed and settings. The
mix covers every way a request can end (RELIABILITY "Leak checks"): run to max tokens, stop at a
stop string or at the end-of-generation token, cancelled while waiting / during prompt evaluation /
mid-decode / racing its final step, failed by an injected sampler or forward-pass fault, parallel
samples sharing their prompt's blocks (some cancelled), and requests that can never fit the pool.
Preemption is not planned per request: a deliberately small KV pool makes it happen. With prefix
caching (shared_prefixes), three random prompts in four start with at least half of one of SHARED_BASES
seeded prompts (not those of CANCEL_PROMPT, which must take several steps), so that requests of every plan
take cached blocks and share them while they run.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

import numpy as np

from hipcore.errors import RocmforgeError, UsageError
from hipcore.tokenizer.chat_template import chat_template_from_metadata, encode_chat, render_chat
from hipcore.engine.sampler import SamplingParams
from hipcore.engine.scheduler import blocks_for

MAX_SAMPLES = 3  # n of the parallel-sample requests is 2 or 3
MAX_N = 1024  # SamplingParams' largest n
WATERMARK_ALLOWANCE = 2  # the scheduler keeps ~1% of the pool (at least one block) free at admission
SHARED_BASES = 2  # prompts that random prompts start with, when shared_prefixes


class Plan(enum.IntEnum):
    """How a request is meant to end (the int value is stored in the outcome arrays)."""

    LENGTH = 0  # sampled until its max tokens
    STOP = 1  # stop strings that ordinary text soon contains
    EOS = 2  # a short chat question answered greedily: the model ends it with its end token
    CANCEL_WAITING = 3  # cancelled before it is admitted
    CANCEL_PROMPT = 4  # cancelled between chunks of its prompt evaluation
    CANCEL_DECODE = 5  # cancelled after a few generated tokens
    CANCEL_FINAL = 6  # cancelled while the step that produces its last token runs (the cancel loses)
    FAIL_SAMPLING = 7  # the sampler raises for it (EngineHooks.fail_sampling)
    FAIL_STEP = 8  # the forward pass raises for its batch (EngineHooks.fail_step): its batch fails with it
    PARALLEL = 9  # n = 2 or 3 samples forked from one prompt (shared blocks, copy on write)
    PARALLEL_CANCEL = 10  # the same, cancelled mid-decode
    REJECT = 11  # needs more blocks than the pool has: rejected at admission

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")


# Shares of the mix, in percent. FAIL_STEP is small because each one fails its whole batch.
MIX = {
    Plan.LENGTH: 30, Plan.STOP: 12, Plan.EOS: 8, Plan.CANCEL_WAITING: 6, Plan.CANCEL_PROMPT: 6,
    Plan.CANCEL_DECODE: 7, Plan.CANCEL_FINAL: 6, Plan.FAIL_SAMPLING: 6, Plan.FAIL_STEP: 2,
    Plan.PARALLEL: 10, Plan.PARALLEL_CANCEL: 4, Plan.REJECT: 3,
}
_KINDS = np.array([int(k) for k in MIX], dtype=np.int64)
_WEIGHTS = np.array(list(MIX.values()), dtype=np.float64) / sum(MIX.values())

# Endings (hipcore.engine.request.Ending values) each plan may legitimately end with. Sampling can end any
# generating request early at an end token or a stop string, and a FAIL_STEP fault fails every
# request of its batch (the driver records those as collateral, which is always accepted).
_NATURAL = frozenset({"length", "eos", "stop"})
ACCEPTED_ENDINGS: dict[Plan, frozenset[str]] = {
    Plan.LENGTH: _NATURAL, Plan.STOP: _NATURAL, Plan.EOS: _NATURAL, Plan.CANCEL_FINAL: _NATURAL,
    Plan.PARALLEL: _NATURAL,
    # Cancelled at the first look after a step: a one-token request admitted at once may be done by then.
    Plan.CANCEL_WAITING: frozenset({"cancelled"} | _NATURAL),
    Plan.CANCEL_PROMPT: frozenset({"cancelled"}),
    Plan.CANCEL_DECODE: frozenset({"cancelled"} | _NATURAL),  # a sampled end token may come first
    Plan.PARALLEL_CANCEL: frozenset({"cancelled"} | _NATURAL),
    Plan.FAIL_SAMPLING: frozenset({"failed"} | _NATURAL),
    Plan.FAIL_STEP: frozenset({"failed"} | _NATURAL),
    Plan.REJECT: frozenset({"rejected"}),
}

STOP_CANDIDATES = ("e", "a", "o", "t", " ", "i", "n", "s")

# "Some real text": plain prompts, and short chat questions a small instruct model answers in a
# few tokens and then ends with its end-of-turn token (the EOS plan).
TEXT_PROMPTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a small village by the sea,",
    "GPU memory is allocated in pages; the KV cache",
    "def fibonacci(n):\n    ",
    "The capital of France is",
    "Water boils at 100 degrees Celsius, and",
)
CHAT_QUESTIONS = (
    "Say yes.",
    "Answer with one word: the capital of France?",
    "What is 2+2? Answer with a number only.",
    "Reply with one word: hello",
)


@dataclass(frozen=True)
class WorkloadShape:
    """The knobs of the workload (a subset of the leak-check settings)."""

    seed: int
    max_tokens: int  # most new tokens of a request (each draws its own limit up to this)
    prompt_min: int
    prompt_max: int
    step_tokens: int  # the engine's max_step_tokens: prompts longer than this take several steps
    block_size: int
    parallel: int
    shared_prefixes: bool = False  # prompts that start alike, for the prefix cache (module docstring)

    def validate(self) -> None:
        if self.max_tokens < 1:
            raise UsageError(f"--max-tokens must be at least 1, got {self.max_tokens}")
        if not 1 <= self.prompt_min <= self.prompt_max:
            raise UsageError(f"--prompt-tokens needs 1 <= MIN <= MAX, got {self.prompt_min}-{self.prompt_max}")
        if self.step_tokens < 2:
            raise UsageError(f"--step-tokens must be at least 2 (so a prompt can take several steps), got {self.step_tokens}")

    @property
    def long_prompt(self) -> tuple[int, int]:
        """Prompt lengths of CANCEL_PROMPT requests: more than one step's budget, at most two."""
        return self.step_tokens + 1, 2 * self.step_tokens

    def largest_request_blocks(self) -> int:
        """Blocks the largest planned request (REJECT aside) needs with the pool to itself."""
        bs, m = self.block_size, self.max_tokens
        longest = max(self.prompt_max, self.long_prompt[1], _chat_prompt_budget(self))
        single = blocks_for(longest + m, bs)
        # Forked samples share only the prompt's full blocks, so the worst prompt length is not
        # always the longest one (31 tokens share one block, 32 share two).
        forked = max(p // bs + MAX_SAMPLES * (blocks_for(p + m, bs) - p // bs)
                     for p in range(self.prompt_min, self.prompt_max + 1))
        return max(single, forked)

    def default_kv_blocks(self) -> int:
        """A deliberately small pool: about 60% of what `parallel` typical requests hold at once, so
        that preemption happens, but never less than the largest request needs (plus the
        admission watermark), so that nothing planned to run is rejected."""
        typical = blocks_for((self.prompt_min + self.prompt_max) // 2 + (self.max_tokens + 1) // 2, self.block_size)
        pressured = -(-self.parallel * typical * 6 // 10)
        return max(self.largest_request_blocks() + WATERMARK_ALLOWANCE, pressured)


def _chat_prompt_budget(shape: WorkloadShape) -> int:
    """Chat prompts are rendered from the model's template; their length is only known then. The
    pool default assumes they stay under this many tokens (SmolLM2's are 31-43); longer ones are
    cut to it from the left, keeping the assistant turn that makes the model answer."""
    return max(shape.prompt_max, 48)


@dataclass(frozen=True)
class RequestPlan:
    index: int
    kind: Plan
    prompt: list[int]
    params: SamplingParams
    trigger: int  # generated tokens at which the planned cancel or fault fires (0: during the prompt)
    cancel_at_once: bool = False  # CANCEL_WAITING: cancel right after submitting, before any step

    @property
    def samples(self) -> int:
        return self.params.n

    @property
    def slots(self) -> int:
        """How many of the engine's sequence slots it may occupy (a rejected request never runs)."""
        return 1 if self.kind == Plan.REJECT else self.params.n


class Workload:
    """Plans request i of a seeded run. `text_prompts` and `chat_prompts` are token ids prepared by
    the caller with the model's tokenizer (empty tuples: random ids only)."""

    def __init__(self, shape: WorkloadShape, vocab_size: int, usable_blocks: int, max_context: int,
                 text_prompts: tuple[tuple[int, ...], ...] = (), chat_prompts: tuple[tuple[int, ...], ...] = ()):
        shape.validate()
        self.shape = shape
        self.vocab_size = vocab_size
        self.usable_blocks = usable_blocks
        self.max_context = max_context
        budget = _chat_prompt_budget(shape)
        self.text_prompts = tuple(p[-shape.prompt_max:] for p in text_prompts if p)
        self.chat_prompts = tuple(p[-budget:] for p in chat_prompts if p)
        longest = max(shape.prompt_max, shape.long_prompt[1])
        bases = np.random.default_rng([shape.seed, 1 << 20])
        self.bases = [bases.integers(0, vocab_size, size=longest).tolist()
                      for _ in range(SHARED_BASES)] if shape.shared_prefixes else []

    def plan(self, index: int) -> RequestPlan:
        s = self.shape
        rng = np.random.default_rng([s.seed, index])
        kind = Plan(int(rng.choice(_KINDS, p=_WEIGHTS)))
        seed = int(rng.integers(0, 2**63))
        sampled = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=seed)
        max_tokens = int(rng.integers(1, s.max_tokens + 1))
        prompt = self._random_prompt(rng, s.prompt_min, s.prompt_max)
        trigger = 0
        if kind in (Plan.LENGTH, Plan.STOP) and self.text_prompts and rng.random() < 0.25:
            prompt = list(self.text_prompts[int(rng.integers(len(self.text_prompts)))])
        if kind == Plan.LENGTH:
            params = SamplingParams(max_tokens=max_tokens, **sampled)
        elif kind == Plan.STOP:
            stops = tuple(rng.choice(STOP_CANDIDATES, size=3, replace=False).tolist())
            params = SamplingParams(max_tokens=s.max_tokens, stop=stops, **sampled)
        elif kind == Plan.EOS:
            if self.chat_prompts:
                prompt = list(self.chat_prompts[int(rng.integers(len(self.chat_prompts)))])
            params = SamplingParams(temperature=0.0, max_tokens=s.max_tokens, seed=seed)
        elif kind == Plan.CANCEL_WAITING:
            params = SamplingParams(max_tokens=max_tokens, **sampled)
            return RequestPlan(index, kind, prompt, params, 0, cancel_at_once=bool(rng.random() < 0.5))
        elif kind == Plan.CANCEL_PROMPT:  # (never a shared prefix: a cached start could leave one step to cancel in)
            prompt = self._random_prompt(rng, *s.long_prompt, shared=False)
            params = SamplingParams(max_tokens=max_tokens, **sampled)
        elif kind in (Plan.CANCEL_DECODE, Plan.PARALLEL_CANCEL, Plan.CANCEL_FINAL):
            max_tokens = max(3, max_tokens)
            n = self._samples(rng) if kind == Plan.PARALLEL_CANCEL else 1
            params = SamplingParams(max_tokens=max_tokens, n=n, **sampled)
            trigger = max_tokens - 1 if kind == Plan.CANCEL_FINAL else int(rng.integers(1, max_tokens - 1))
        elif kind in (Plan.FAIL_SAMPLING, Plan.FAIL_STEP):
            params = SamplingParams(max_tokens=max_tokens, **sampled)
            trigger = int(rng.integers(0, max_tokens))
        elif kind == Plan.PARALLEL:
            params = SamplingParams(max_tokens=max_tokens, n=self._samples(rng), **sampled)
        else:
            return self._rejected(index, rng, prompt, SamplingParams(max_tokens=max_tokens, **sampled))
        return RequestPlan(index, kind, prompt, params, trigger)

    def ladder_plan(self, index: int) -> RequestPlan:
        """A short greedy request (2 prompt tokens, 3 new): submitted n at a time by the warm-up, they
        decode together in batches of exactly n sequences."""
        rng = np.random.default_rng([self.shape.seed, index, 2])
        return RequestPlan(index, Plan.LENGTH, self._random_prompt(rng, 2, 2), SamplingParams(temperature=0.0, max_tokens=3), 0)

    def prompt_shape_plan(self, index: int, length: int) -> RequestPlan:
        """A greedy request of `length` random prompt tokens and one new token. The warm-up runs them one at a
        time at distinct lengths, so that the runner's launch plans of prompt steps, kept for a bounded number
        of shapes (hipcore/model/forward.py: PROMPT_PLAN_CACHE_SIZE), are at that bound before the baseline."""
        rng = np.random.default_rng([self.shape.seed, index, 3])
        return RequestPlan(index, Plan.LENGTH, self._random_prompt(rng, length, length),
                           SamplingParams(temperature=0.0, max_tokens=1), 0)

    def filler_plan(self, index: int) -> RequestPlan:
        """A request that costs (nearly) nothing: rejected at admission when the pool allows, else one
        prompt token and one new token. The warm-up runs `finished_bound` of them so that the finished
        records have grown to their bound before the baseline (their growth is legitimate)."""
        rng = np.random.default_rng([self.shape.seed, index, 1])
        return self._rejected(index, rng, self._random_prompt(rng, 1, 1), SamplingParams(temperature=0.0, max_tokens=1))

    def _rejected(self, index: int, rng: np.random.Generator, prompt: list[int], params: SamplingParams) -> RequestPlan:
        """REJECT: more parallel samples than the pool has blocks, so it never computes anything."""
        n = self.usable_blocks + 1
        if n > MAX_N:  # SamplingParams' limit: a prompt longer than the pool instead, if the context allows
            too_long = self.usable_blocks * self.shape.block_size + 1
            if too_long >= self.max_context:  # cannot be rejected: an ordinary (short) request instead
                return RequestPlan(index, Plan.LENGTH, prompt, params, 0)
            prompt, n = self._random_prompt(rng, too_long, too_long), 1
        return RequestPlan(index, Plan.REJECT, prompt, replace(params, n=n), 0)

    def _samples(self, rng: np.random.Generator) -> int:
        """2 or 3, but never more than the engine's sequence slots (--parallel)."""
        return min(int(rng.integers(2, MAX_SAMPLES + 1)), self.shape.parallel)

    def _random_prompt(self, rng: np.random.Generator, low: int, high: int, shared: bool = True) -> list[int]:
        length = int(rng.integers(low, high + 1))
        prompt = rng.integers(0, self.vocab_size, size=length).tolist()
        # Which base, and where its cut ends, come from the prompt's own random ids: the plan's draws stay those of
        # a run without shared prefixes, so every request keeps its plan and its length.
        pick = prompt[0] % 4
        if shared and self.bases and pick < 3:
            cut = length - prompt[-1] % (length // 2 + 1)  # at least half of it: long enough to fill a block
            prompt = self.bases[pick % SHARED_BASES][:cut] + prompt[cut:]
        return prompt


def text_prompts(loaded) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """Token ids of the plain-text prompts and of the chat questions rendered with the model's
    template. A model whose tokenizer or template cannot do it simply gets random prompts."""
    tok = loaded.tokenizer
    try:
        text = tuple(tuple(tok.encode(t)) for t in TEXT_PROMPTS)
    except RocmforgeError:
        return (), ()
    try:
        template = chat_template_from_metadata(loaded.gguf.metadata)
        bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
        eos = tok.token_text(tok.eos_id) if tok.eos_id is not None else ""
        chat = tuple(tuple(encode_chat(tok, render_chat(template, [{"role": "user", "content": q}], bos_token=bos,
                                                          eos_token=eos)))
                     for q in CHAT_QUESTIONS)
    except RocmforgeError:
        chat = ()
    return text, chat

