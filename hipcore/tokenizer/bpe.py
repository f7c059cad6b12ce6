"""Byte-level BPE ("gpt2" vocabularies): the pre-tokenizers and the merge loop.

Encoding a piece of text: the pre-tokenizer's regular expressions cut it into words (each
expression further splits the pieces the previous ones left, as llama.cpp applies them); each
word's UTF-8 bytes are mapped to printable characters (GPT-2's byte-to-unicode table); then the
adjacent pair with the lowest merge rank is merged, leftmost first, until no pair has a rank.

The regular expressions are those llama.cpp uses for each `tokenizer.ggml.pre` name. An unknown
name is rejected rather than guessed: a wrong pre-tokenizer yields other token ids for the same
text, which silently degrades every answer, and llama.cpp rejects unknown names too.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Mapping, Sequence

import regex

from hipcore.errors import UnsupportedModelError, printable

# GPT-2's pattern. llama.cpp writes it without the final "|\s+" and handles that case in code.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS_ANY_CASE = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS_ANY_CASE
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    _CONTRACTIONS_ANY_CASE
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# gpt-oss's o200k vocabulary (tokenizer.ggml.pre "gpt-4o"): llama.cpp's rewrite of the tokenizer.json pattern
# (src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_GPT4O), which it runs: an "upper" letter is any letter but a-z, a "lower"
# one any but A-Z.
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS_ANY_CASE + "?"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS_ANY_CASE + "?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# The regex module's \s is exactly the Unicode White_Space set that llama.cpp uses.


@dataclass(frozen=True)
class PreTokenizer:
    """How one family of `tokenizer.ggml.pre` names splits text, and its encoding defaults."""

    name: str
    patterns: tuple[str, ...]
    add_bos: bool = False  # llama.cpp's default when the file does not say
    clean_spaces: bool = True  # decoding removes the space before . , ! ? and some contractions
    ignore_merges: bool = False  # a word that is itself a token is taken whole

    def split(self, text: str) -> list[str]:
        return _split(text, _compiled(self.patterns))


_DEFAULT = PreTokenizer("default", (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))
_GPT2_STYLE = PreTokenizer("gpt2", (_GPT2,))
# StarCoder-style vocabularies have one token per digit: digits are cut apart before GPT-2's split.
_DIGITS_THEN_GPT2 = PreTokenizer("smollm", (r"\p{N}", _GPT2))
_LLAMA3_STYLE = PreTokenizer("llama3", (_LLAMA3,), add_bos=True, ignore_merges=True)
_LLAMA3_REGEX_ONLY = PreTokenizer("dbrx", (_LLAMA3,))
_QWEN2_STYLE = PreTokenizer("qwen2", (_QWEN2,))
_GPT4O_STYLE = PreTokenizer("gpt-4o", (_GPT4O,), clean_spaces=False)


def _variant(base: PreTokenizer, name: str, **changes: object) -> PreTokenizer:
    fields = {"patterns": base.patterns, "add_bos": base.add_bos, "clean_spaces": base.clean_spaces,
              "ignore_merges": base.ignore_merges}
    fields.update(changes)
    return PreTokenizer(name, **fields)  # type: ignore[arg-type]


# tokenizer.ggml.pre name -> pre-tokenizer, with llama.cpp's per-name flags.
PRETOKENIZERS: Mapping[str, PreTokenizer] = {
    "default": _DEFAULT,
    **{n: _variant(_LLAMA3_STYLE, n) for n in (
        "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano")},
    **{n: _variant(_LLAMA3_REGEX_ONLY, n) for n in ("dbrx", "smaug-bpe")},
    **{n: _variant(_GPT2_STYLE, n) for n in (
        "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
        "modern-bert", "mpt", "olmo", "jais", "exaone4")},
    **{n: _variant(_GPT2_STYLE, n, clean_spaces=False) for n in ("trillion", "granite-docling")},
    **{n: _variant(_DIGITS_THEN_GPT2, n) for n in (
        "starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2")},
    **{n: _variant(_DIGITS_THEN_GPT2, n, clean_spaces=False) for n in ("smollm", "command-r")},
    **{n: _variant(_QWEN2_STYLE, n) for n in ("stablelm2", "megrez")},
    **{n: _variant(_QWEN2_STYLE, n, clean_spaces=False) for n in (
        "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open")},
    "gpt-4o": _GPT4O_STYLE,
}


def resolve_pretokenizer(name: str | None) -> PreTokenizer:
    """The pre-tokenizer for a `tokenizer.ggml.pre` value; None means llama.cpp's 'default'."""
    if name is None:
        return _DEFAULT
    found = PRETOKENIZERS.get(name)
    if found is None:
        raise UnsupportedModelError(
            f"pre-tokenizer '{printable(name, 60)}' (tokenizer.ggml.pre) is not supported; guessing would give wrong token ids. "
            f"Supported: {', '.join(sorted(PRETOKENIZERS))}"
        )
    return found


_compiled_cache: dict[tuple[str, ...], tuple[regex.Pattern, ...]] = {}


def _compiled(patterns: tuple[str, ...]) -> tuple[regex.Pattern, ...]:
    found = _compiled_cache.get(patterns)
    if found is None:
        found = tuple(regex.compile(p) for p in patterns)
        _compiled_cache[patterns] = found
    return found


def _split(text: str, patterns: Sequence[regex.Pattern]) -> list[str]:
    """Apply each pattern to every piece so far; matches and the gaps between them become pieces.

    concurrent=False: the regex module otherwise lets go of the GIL around every match of a str, and each
    match must then win it back. Where other threads are busy (a server's event loop and engine thread) a
    word-sized match waited up to the interpreter's switch interval to get it back: a 40-token prompt took
    6-9 ms to tokenize beside one busy thread, 30 us alone (tests/test_tokenizer.py)."""
    pieces = [text]
    for pattern in patterns:
        out: list[str] = []
        for piece in pieces:
            end = 0
            for match in pattern.finditer(piece, concurrent=False):
                start, stop = match.span()
                if start > end:
                    out.append(piece[end:start])
                if stop > start:
                    out.append(piece[start:stop])
                end = stop
            if end < len(piece):
                out.append(piece[end:])
        pieces = out
    return pieces


def _byte_to_char_table() -> list[str]:
    """GPT-2's table: printable bytes map to themselves, the rest to code points from 256 up."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    for b in printable:
        table[b] = chr(b)
    extra = 0
    for b in range(256):
        if not table[b]:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_CHAR: tuple[str, ...] = tuple(_byte_to_char_table())
CHAR_TO_BYTE: Mapping[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
# str.translate table taking a latin-1 view of UTF-8 bytes to the mapped characters.
_BYTES_AS_LATIN1_TO_CHARS = {b: c for b, c in enumerate(BYTE_TO_CHAR)}


def byte_encode(word: str) -> str:
    return word.encode("utf-8").decode("latin-1").translate(_BYTES_AS_LATIN1_TO_CHARS)


class BpeEncoder:
    """Merges byte-level words into token ids; keeps a bounded cache of words seen."""

    _CACHE_LIMIT = 50_000

    def __init__(self, token_to_id: Mapping[str, int], merges: Sequence[str], pretokenizer: PreTokenizer):
        self._token_to_id = token_to_id
        # Keyed by the merge line itself ("left right"): a pair's key is left + " " + right.
        # Byte-level tokens never hold a raw space, so the split is unambiguous; on duplicates the
        # first (lowest) rank wins, as in llama.cpp.
        n = len(merges)
        self._ranks: dict[str, int] = dict(zip(reversed(merges), range(n - 1, -1, -1)))
        self._pretokenizer = pretokenizer
        self._cache: dict[str, tuple[int, ...]] = {}

    def encode(self, text: str, out: list[int]) -> None:
        cache = self._cache
        for word in self._pretokenizer.split(text):
            ids = cache.get(word)
            if ids is None:
                ids = self._encode_word(byte_encode(word))
                if len(cache) >= self._CACHE_LIMIT:
                    cache.clear()
                cache[word] = ids
            out.extend(ids)

    def _encode_word(self, word: str) -> tuple[int, ...]:
        token_to_id = self._token_to_id
        if self._pretokenizer.ignore_merges and word in token_to_id:
            return (token_to_id[word],)
        ids: list[int] = []
        for piece in self._merge(word):
            found = token_to_id.get(piece)
            if found is not None:
                ids.append(found)
                continue
            # No token for the merged piece: llama.cpp falls back to its single-byte tokens and
            # drops what it cannot find.
            for b in piece.encode("utf-8"):
                if b < 0x80:
                    found = token_to_id.get(chr(b))
                    if found is not None:
                        ids.append(found)
        return tuple(ids)

    def _merge(self, word: str) -> list[str]:
        symbols = list(word)
        n = len(symbols)
        if n < 2:
            return symbols
        ranks = self._ranks
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap: list[tuple[int, int, int, str]] = []
        for i in range(n - 1):
            rank = ranks.get(symbols[i] + " " + symbols[i + 1])
            if rank is not None:
                heap.append((rank, i, i + 1, symbols[i] + symbols[i + 1]))
        heapq.heapify(heap)
        while heap:
            _, left, right, merged = heapq.heappop(heap)
            left_text, right_text = symbols[left], symbols[right]
            if not left_text or not right_text or left_text + right_text != merged:
                continue  # one side changed since this pair was queued
            symbols[left] = merged
            symbols[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prev[after] = left
            before = prev[left]
            if before >= 0:
                rank = ranks.get(symbols[before] + " " + merged)
                if rank is not None:
                    heapq.heappush(heap, (rank, before, left, symbols[before] + merged))
            if after >= 0:
                rank = ranks.get(merged + " " + symbols[after])
                if rank is not None:
                    heapq.heappush(heap, (rank, left, after, merged + symbols[after]))
        return [s for s in symbols if s]


def decode_token_text(text: str) -> bytes:
    """The bytes a byte-level token stands for (llama.cpp marks characters outside the table)."""
    out = bytearray()
    for char in text:
        b = CHAR_TO_BYTE.get(char)
        if b is not None:
            out.append(b)
        else:
            out += b"[UNK_BYTE_0x" + char.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
    return bytes(out)
