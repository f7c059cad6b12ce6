"""Structural checks of a GGUF file's tokenizer metadata, at plan time.

They mirror what llama.cpp's vocabulary loader refuses (its load fails or aborts on each of these),
so that we are never looser than llama.cpp: the exact value type of every tokenizer key it reads,
tokenizer.ggml.model present, a token list unless the model is "no_vocab", no duplicate tokens (an
assertion in llama.cpp), per-token arrays as long as the token list, merges for a gpt2 vocabulary,
byte tokens (type 6) spelled <0xXX>, special token ids inside the vocabulary, and no NUL
inside token or merge strings (llama.cpp reads them as C strings and would silently cut them).
Stricter than llama.cpp: a token's text has a length cap (Limits.max_token_chars), since a BOS or
EOS text of megabytes would be pasted into every chat prompt.
Which tokenizer kinds and pre-tokenizers are *supported* is hipcore.tokenizer.tokenizer's question.
"""

from __future__ import annotations

import re

from hipcore.gguf.header import show
from hipcore.gguf.metadata_keys import MetadataKeys

NO_VOCAB_MODELS = ("no_vocab", "none")
TOKEN_TYPE_BYTE = 6
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>\Z")
_SPECIAL_TOKEN_KEY = re.compile(r"tokenizer\.ggml\.\w+_token_id\Z")
_KEY_TYPES = {
    "tokenizer.ggml.pre": "string",
    "tokenizer.chat_template": "string",
    "tokenizer.ggml.token_type_count": "uint32",
    "tokenizer.ggml.add_space_prefix": "bool",
    "tokenizer.ggml.remove_extra_whitespaces": "bool",
    "tokenizer.ggml.add_bos_token": "bool",
    "tokenizer.ggml.add_eos_token": "bool",
    "tokenizer.ggml.add_sep_token": "bool",
}


def check_tokenizer_metadata(keys: MetadataKeys, *, max_token_chars: int = 4096) -> int | None:
    """Validate the tokenizer keys; return the number of tokens, or None for a "no_vocab" model."""
    for key, wanted in _KEY_TYPES.items():
        if key in keys:
            keys.typed(key, (wanted,), f"a {wanted}", required=True)
    model = keys.string("tokenizer.ggml.model")
    if model in NO_VOCAB_MODELS:
        _check_special_ids(keys, None)
        return None
    tokens = keys.array("tokenizer.ggml.tokens", ("string",))
    if tokens is None:
        raise keys.error("tokenizer.ggml.tokens", None, "an array of strings, one per token",
                         problem=f"the key is missing, and tokenizer.ggml.model is {show(model)}")
    if not tokens:
        raise keys.error("tokenizer.ggml.tokens", 0, "at least one token", problem="the vocabulary is empty")
    _check_strings(keys, "tokenizer.ggml.tokens", tokens)
    _check_token_lengths(keys, tokens, max_token_chars)
    _check_unique(keys, tokens)
    n = len(tokens)
    for key, element_types in (("tokenizer.ggml.scores", ("float32", "int32")),
                               ("tokenizer.ggml.token_type", ("int32",))):
        values = keys.array(key, element_types)
        if values is not None and len(values) != n:
            raise keys.error(key, len(values), f"{n} entries, one per token",
                             problem=f"has {len(values)} entries for a vocabulary of {n}")
    token_types = keys.metadata.get("tokenizer.ggml.token_type")
    if token_types:
        _check_byte_tokens(keys, tokens, token_types)
    merges = keys.array("tokenizer.ggml.merges", ("string",))
    if merges is not None:
        _check_strings(keys, "tokenizer.ggml.merges", merges)
    elif model == "gpt2" and keys.metadata.get("tokenizer.ggml.pre") != "kimi-k2":
        raise keys.error("tokenizer.ggml.merges", None, "an array of strings 'left right'",
                         problem="a gpt2 (BPE) vocabulary needs its merges and the key is missing")
    _check_special_ids(keys, n)
    return n


def _check_strings(keys: MetadataKeys, key: str, values: tuple[str, ...]) -> None:
    if "\x00" in "".join(values):
        index = next(i for i, v in enumerate(values) if "\x00" in v)
        raise keys.error(f"{key}[{index}]", values[index], "text without NUL characters",
                         problem=f"entry {index} {show(values[index])} contains a NUL character")


def _check_token_lengths(keys: MetadataKeys, tokens: tuple[str, ...], most: int) -> None:
    if max(map(len, tokens)) <= most:
        return
    index = next(i for i, t in enumerate(tokens) if len(t) > most)
    raise keys.error(f"tokenizer.ggml.tokens[{index}]", len(tokens[index]), f"at most {most} characters a token",
                     problem=f"token {index} {show(tokens[index], 20)} is {len(tokens[index]):,} characters long")


def _check_unique(keys: MetadataKeys, tokens: tuple[str, ...]) -> None:
    # llama.cpp renames empty tokens to [EMPTY_i] before indexing them, so compare the same way.
    names = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    if len(set(names)) == len(names):
        return
    first: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in first:
            raise keys.error(f"tokenizer.ggml.tokens[{i}]", name, "each token text once",
                             problem=f"token {i} {show(name)} repeats token {first[name]}")
        first[name] = i


def _check_byte_tokens(keys: MetadataKeys, tokens: tuple[str, ...], token_types: tuple) -> None:
    for i, (text, kind) in enumerate(zip(tokens, token_types)):
        if kind == TOKEN_TYPE_BYTE and not _BYTE_TOKEN.match(text):
            raise keys.error(f"tokenizer.ggml.token_type[{i}]", kind, "byte tokens (type 6) spelled <0xXX>",
                             problem=f"token {i} {show(text)} is marked as a byte token but is not spelled <0xXX>")


def _check_special_ids(keys: MetadataKeys, n_tokens: int | None) -> None:
    for key in list(keys.metadata):
        if _SPECIAL_TOKEN_KEY.match(key):
            keys.uint32(key, hi=(n_tokens - 1) if n_tokens is not None else (1 << 32) - 1)
