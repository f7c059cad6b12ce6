"""Constrained decoding: a grammar's token mask applied before sampling, with llguidance as the grammar engine.

A request's constraint (a JSON Schema, "any JSON object", a GBNF or Lark grammar) is compiled once into
llguidance's grammar text by `compile_grammar`, which checks it and raises UsageError naming what is wrong or
unsupported. The text goes into SamplingParams.grammar (a string, so the params stay hashable); each sequence
then gets a TokenConstraint: an LLMatcher that gives the allowed tokens of the next step as a bitmask and
advances with every accepted token. Once the grammar is complete only the end-of-generation tokens are allowed,
so a constrained answer ends by itself. llguidance was chosen over xgrammar and outlines-core
(docs/history/2026-12-06-grammar-engine.md): no required dependencies, GBNF and Lark as well as JSON Schema,
a compile of a few milliseconds and a mask of ~15 us a token on the demo model's 49,152-token vocabulary.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np

from hipcore.errors import UsageError
from hipcore.tokenizer.harmony import MARKERS

GRAMMAR_FAILURE = "the grammar failed"  # how a constraint's failure while sampling begins (the server's 400 reads it)
MAX_GRAMMAR_BYTES = 64 << 10  # a schema or grammar text: far above any tool's schema, far below a slow compile


class GrammarVocabulary:
    """llguidance's view of a model's vocabulary (token bytes, end-of-generation ids); ~0.6 s to build for a
    49k vocabulary, so built once per tokenizer, on the first constrained request."""

    def __init__(self, tokenizer: Any):
        import llguidance  # imported here: only constrained requests need it

        class _Wrapper:
            eos_token_id = next(iter(sorted(tokenizer.eot_ids)), tokenizer.eos_id)
            bos_token_id = tokenizer.bos_id
            tokens = [tokenizer.token_piece(i) for i in range(tokenizer.vocab_size)]
            # harmony's markers are rendered text to the tokenizer but tokens to the grammar: a JSON string must not
            # hold <|end|> or <|channel|> (harmony's split would cut the answer there); grammars name them <|end|>
            special_token_ids = [i for i in range(tokenizer.vocab_size)
                                 if tokenizer.is_special(i) or tokenizer.token_piece(i).decode("utf-8", "replace")
                                 in MARKERS]

            def __call__(self, text):
                return tokenizer.encode(text.decode("utf-8", "replace") if isinstance(text, bytes) else text,
                                        add_bos=False, parse_special=False)

        eot = sorted(tokenizer.eot_ids) or ([tokenizer.eos_id] if tokenizer.eos_id is not None else [])
        self.ll = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Wrapper()), eos_token=eot)
        self.vocab_size = tokenizer.vocab_size


_vocabularies: dict[int, GrammarVocabulary] = {}
_vocabularies_lock = threading.Lock()


def grammar_vocabulary(tokenizer: Any) -> GrammarVocabulary:
    with _vocabularies_lock:
        vocab = _vocabularies.get(id(tokenizer))
        if vocab is None or vocab.vocab_size != tokenizer.vocab_size:
            vocab = _vocabularies[id(tokenizer)] = GrammarVocabulary(tokenizer)
        return vocab


def _check_size(what: str, text: str) -> None:
    size = len(text.encode("utf-8"))
    if size > MAX_GRAMMAR_BYTES:
        raise UsageError(f"{what} is {size:,} bytes; at most {MAX_GRAMMAR_BYTES:,}")


JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}  # compact JSON


def compile_grammar(*, json_schema: Any = None, json_object: bool = False, gbnf: str | None = None,
                    lark: str | None = None, lark_prefix: str = "") -> str:
    """llguidance's grammar text for one constraint (exactly one of the first four given), checked; UsageError names
    the problem (a schema that is not JSON Schema, an unsupported keyword or format, a GBNF syntax error).
    lark_prefix: a Lark expression the output begins with before the JSON (gpt-oss's final-channel header)."""
    import llguidance
    from llguidance.gbnf_to_lark import gbnf_to_lark

    if lark_prefix and json_schema is None and not json_object:
        raise UsageError("a prefix goes before JSON only")
    if json_object:
        json_schema = {"type": "object"}
    if json_schema is not None:
        if json_schema is False:
            raise UsageError("the JSON Schema is false: no value matches it")
        if json_schema is True:
            json_schema = {}
        if not isinstance(json_schema, dict):
            raise UsageError("the JSON Schema must be an object")
        text = json.dumps(json_schema)
        _check_size("the JSON Schema", text)
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_LAYOUT)
        except (ValueError, RuntimeError) as exc:
            raise UsageError(f"the JSON Schema is not usable: {_first_line(exc)}") from None
        what = "the JSON Schema"
        if lark_prefix:  # the schema checked above by itself, so its errors read the same with a prefix
            _check_valid(llguidance, grammar, what)
            schema = {**json_schema, "x-guidance": {**JSON_LAYOUT, **json_schema.get("x-guidance", {})}}
            grammar = llguidance.LLMatcher.grammar_from_lark(
                f"start: {lark_prefix} %json {json.dumps(schema)}")
    elif gbnf is not None:
        _check_size("the grammar", gbnf)
        try:
            grammar = llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(gbnf))
        except Exception as exc:  # the converter raises plain Exceptions for GBNF syntax errors
            raise UsageError(f"the GBNF grammar is not valid: {_first_line(exc)}") from None
        _check_gbnf_accepts(gbnf)
        what = "the GBNF grammar"
    elif lark is not None:
        _check_size("the grammar", lark)
        grammar = llguidance.LLMatcher.grammar_from_lark(lark)
        what = "the Lark grammar"
    else:
        raise UsageError("compile_grammar needs a JSON Schema or a grammar")
    _check_valid(llguidance, grammar, what)
    return grammar


def _check_valid(llguidance: Any, grammar: str, what: str) -> None:
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise UsageError(f"{what} is not supported: {_first_line(messages[0])}")


def _check_gbnf_accepts(gbnf: str) -> None:
    """UsageError when the grammar's root derives no finite text (root ::= "a" root): llguidance takes such a
    grammar, and every answer would then run to max_tokens. A rule is productive when one of its alternatives is
    a sequence of literals, character classes, optional repetitions and productive rules (a fixed point over the
    rules of llguidance's own GBNF parser)."""
    from llguidance import gbnf_to_lark as gbnf_ast

    rules = gbnf_ast.GrammarParser().parse(gbnf)
    productive: set[str] = set()

    def derives(node) -> bool:
        if isinstance(node, (gbnf_ast.LiteralNode, gbnf_ast.RegexNode)):
            return True
        if isinstance(node, gbnf_ast.RuleRefNode):
            return node.name in productive
        if isinstance(node, gbnf_ast.SequenceNode):
            return all(derives(child) for child in node.nodes)
        if isinstance(node, gbnf_ast.AlternativeNode):
            return any(derives(child) for child in node.alternatives)
        if isinstance(node, gbnf_ast.RepetitionNode):
            return node.min_times == 0 or derives(node.node)
        return True  # a node this check does not know: assume it derives text (never a false refusal)

    changed = True
    while changed:
        changed = False
        for name, rule in rules.items():
            if name not in productive and derives(rule.alternatives):
                productive.add(name)
                changed = True
    if "root" in rules and "root" not in productive:
        stuck = sorted(set(rules) - productive)
        raise UsageError("the GBNF grammar never accepts: no finite text matches root (rules without an end: "
                         f"{', '.join(stuck[:8])})")


def _first_line(error: Any) -> str:
    """The engine's message on one line (a regex error spans several: the pattern, a caret, the reason)."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip().strip("^"))
    return (text or "(no message)")[:300]


_EXECUTOR: Any = None
_EXECUTOR_LOCK = threading.Lock()


def packed_masks(constraints: list["TokenConstraint"]) -> tuple[np.ndarray, list[str | None]]:
    """The next step's allowed tokens of several sequences at once, on llguidance's thread pool (LLExecutor: 80% of
    the CPUs, at most 32). A step's constrained rows need their masks before it launches; one by one they cost their
    sum there (~16 us a row on the demo model's 49k vocabulary, one core; a 128k vocabulary's rows cost more).
    Returns uint32 [n, words] as TokenConstraint.packed gives each row, and per constraint None or why its grammar
    failed (an error, or no token allowed)."""
    global _EXECUTOR
    import llguidance

    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = llguidance.LLExecutor()
    words = constraints[0]._bits.shape[0]
    bits = np.zeros((len(constraints), words), dtype=np.int32)
    _EXECUTOR.unsafe_compute_mask_ptr([(c._matcher, i) for i, c in enumerate(constraints)], bits.ctypes.data,
                                      words * 4, len(constraints))
    failures: list[str | None] = []
    for row, c in zip(bits, constraints):
        if c._matcher.is_error():
            failures.append(f"{GRAMMAR_FAILURE}: {_first_line(c._matcher.get_error())}")
        else:
            failures.append(None if row.any() else f"{GRAMMAR_FAILURE}: it allows no token here")
    return bits.view(np.uint32), failures


class TokenConstraint:
    """One sequence's grammar state: which tokens may come next, and advancing it by each accepted token."""

    def __init__(self, vocabulary: GrammarVocabulary, grammar: str):
        import llguidance

        self._matcher = llguidance.LLMatcher(vocabulary.ll, grammar, log_level=0)
        if self._matcher.is_error():
            raise UsageError(f"the grammar is not usable: {_first_line(self._matcher.get_error())}")
        self._bits = np.zeros((vocabulary.vocab_size + 31) // 32, dtype=np.int32)
        self.vocab_size = vocabulary.vocab_size

    def packed(self) -> np.ndarray:
        """The allowed tokens of the next step as llguidance gives them: uint32 words, token t at bit t % 32 of
        word t // 32 (the layout hipcore/ops/sample.py's kernel takes). Valid until the next call."""
        matcher = self._matcher
        matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        if matcher.is_error():
            raise RuntimeError(f"{GRAMMAR_FAILURE}: {_first_line(matcher.get_error())}")
        if not self._bits.any():
            raise RuntimeError(f"{GRAMMAR_FAILURE}: it allows no token here")
        return self._bits.view(np.uint32)

    def allowed(self) -> np.ndarray:
        """A bool per token of the vocabulary: may it come next."""
        return np.unpackbits(self.packed().view(np.uint8), bitorder="little")[:self.vocab_size].astype(bool)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """The logits with every token the grammar forbids at -inf (a copy)."""
        return np.where(self.allowed()[:logits.shape[0]], logits.astype(np.float32, copy=False), -np.inf)

    def accept(self, token: int) -> None:
        if not self._matcher.consume_token(int(token)):
            raise RuntimeError(f"{GRAMMAR_FAILURE}: it refused token {int(token)}: "
                               f"{_first_line(self._matcher.get_error())}")

    @property
    def complete(self) -> bool:
        return self._matcher.is_accepting()
