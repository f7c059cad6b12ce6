"""Small, real tokenizer vocabularies for test GGUF files: GPT-2 byte-level BPE and SentencePiece-style.

Both are trained by a few dozen BPE merges on a short built-in corpus, so every merge's parts exist
in the vocabulary and a correct tokenizer can reach every piece (a random list would not be a
usable tokenizer). Deterministic: the same size always gives the same vocabulary.
"""

from __future__ import annotations

import re
from collections import Counter

CORPUS = (
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs there and back again. "
    "Hello, world! Hello there, how are you today? I am fine, thank you, and then some.\n"
    "In the beginning the model reads the text, then it writes the answer in the same order.\n"
    "Numbers like 12, 345 and 2024 appear too, as do tabs\tand new lines.\n"
    "Café, naïve, über, 東京, emoji 🙂 and other characters share the byte fallback.\n"
)

GPT2_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
LLAMA_SPECIALS = ("<unk>", "<s>", "</s>")
SPM_SPACE = "\u2581"  # '▁', SentencePiece's visible space

# llama.cpp token types
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_BYTE = 1, 2, 3, 6


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of every byte to a printable character (spaces become 'Ġ')."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def _learn_merges(words: Counter, n_merges: int, vocab: set[str]) -> list[tuple[str, str]]:
    """Classic BPE: repeatedly join the most frequent adjacent pair (ties broken by the pair itself)."""
    splits = {word: list(word) for word in words}
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges:
        pairs: Counter = Counter()
        for word, freq in words.items():
            parts = splits[word]
            for a, b in zip(parts, parts[1:]):
                pairs[(a, b)] += freq
        candidates = [p for p in pairs if p[0] + p[1] not in vocab]
        if not candidates:
            raise ValueError(f"the corpus only supports {len(merges)} merges; ask for a smaller vocabulary")
        best = max(candidates, key=lambda p: (pairs[p], p))
        merges.append(best)
        vocab.add(best[0] + best[1])
        for word, parts in splits.items():
            i = 0
            while i < len(parts) - 1:
                if (parts[i], parts[i + 1]) == best:
                    parts[i:i + 2] = [parts[i] + parts[i + 1]]
                i += 1
    return merges


def gpt2_vocab(vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token_types, merges): 3 specials, the 256 byte tokens, then merged pieces."""
    base = len(GPT2_SPECIALS) + 256
    if vocab_size < base:
        raise ValueError(f"a gpt2 vocabulary needs at least {base} tokens (3 specials + 256 bytes)")
    byte_map = bytes_to_unicode()
    words = Counter("".join(byte_map[b] for b in piece.encode("utf-8"))
                    for piece in re.findall(r" ?\w+| ?[^\w\s]+|\s+", CORPUS))
    byte_tokens = [byte_map[b] for b in range(256)]
    merges = _learn_merges(words, vocab_size - base, set(byte_tokens))
    tokens = list(GPT2_SPECIALS) + byte_tokens + [a + b for a, b in merges]
    types = [TOKEN_CONTROL] * len(GPT2_SPECIALS) + [TOKEN_NORMAL] * (len(tokens) - len(GPT2_SPECIALS))
    return tokens, types, [f"{a} {b}" for a, b in merges]


def llama_vocab(vocab_size: int) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token_types): <unk> <s> </s>, <0x00>..<0xFF>, single characters, merged pieces.

    Merged pieces score -rank (earlier merges win, as in SentencePiece BPE models); characters and
    byte tokens score below every merge.
    """
    words = Counter(SPM_SPACE + w for w in CORPUS.split())
    chars = sorted({c for w in words for c in w})
    base = len(LLAMA_SPECIALS) + 256 + len(chars)
    if vocab_size < base:
        raise ValueError(f"a llama vocabulary needs at least {base} tokens (3 specials, 256 bytes, {len(chars)} chars)")
    merges = _learn_merges(words, vocab_size - base, set(chars))
    tokens = list(LLAMA_SPECIALS) + [f"<0x{b:02X}>" for b in range(256)] + chars + [a + b for a, b in merges]
    scores = [0.0] * (len(LLAMA_SPECIALS) + 256) + [-1e4 - i for i in range(len(chars))]
    scores += [-float(rank) for rank in range(len(merges))]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL] + [TOKEN_BYTE] * 256
    types += [TOKEN_NORMAL] * (len(tokens) - len(types))
    return tokens, scores, types
