"""A tiny Phi-3-style vocabulary for tests/test_tokenizer_phi3.py (recorded by scripts/golden/record_tokenizer_phi3.py).

llama.cpp gives the special tokens of a model whose general.name contains "phi-3" or "phi3" the RSTRIP attribute
(the whitespace after them is swallowed), "</s>" too, and takes it from "<unk>", "<s>" and "<|endoftext|>".
This vocabulary has what that needs, laid out as Phi-3's own (llama.cpp's models/ggml-vocab-phi-3.gguf):
the SentencePiece vocabulary of tests/support/gguf_vocab.py with "</s>" user-defined, then Phi-3's added
control tokens, EOS <|endoftext|>. Written as a vocab-only phi3 GGUF (no tensors) for llama.cpp; the metadata
is what our tokenizer reads.
"""

from __future__ import annotations

from pathlib import Path

from support.gguf_factory import Meta, tiny_llama_spec, write_gguf
from support.gguf_raw import ARRAY, FLOAT32, INT32, STRING, UINT32
from support.gguf_vocab import llama_vocab

ADDED = ("<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>")
TOKEN_CONTROL, TOKEN_USER_DEFINED = 3, 4
NAMES = {"phi3": "Phi3", "other": "Tiny Test"}  # the second: the same vocabulary without llama.cpp's Phi-3 rule


def phi3_vocab_spec(name: str = "Phi3"):
    tokens, scores, types = llama_vocab(384)
    types = list(types)
    types[tokens.index("</s>")] = TOKEN_USER_DEFINED
    tokens = list(tokens) + list(ADDED)
    scores = list(scores) + [0.0] * len(ADDED)
    types += [TOKEN_CONTROL] * len(ADDED)
    spec = tiny_llama_spec(architecture="phi3", tokenizer="llama", extra_metadata={
        "general.name": name,
        "phi3.vocab_size": None,
        "tokenizer.ggml.tokens": Meta("tokenizer.ggml.tokens", ARRAY, tuple(tokens), STRING),
        "tokenizer.ggml.scores": Meta("tokenizer.ggml.scores", ARRAY, tuple(scores), FLOAT32),
        "tokenizer.ggml.token_type": Meta("tokenizer.ggml.token_type", ARRAY, tuple(types), INT32),
        "tokenizer.ggml.eos_token_id": Meta("tokenizer.ggml.eos_token_id", UINT32, tokens.index("<|endoftext|>")),
    })
    return type(spec)(spec.metadata, ())


def phi3_vocab_metadata(name: str = "Phi3") -> dict:
    return {m.key: m.value for m in phi3_vocab_spec(name).metadata}


def write_phi3_vocab(path: Path, name: str = "Phi3") -> Path:
    return write_gguf(path, phi3_vocab_spec(name))


# Chat turns as Phi-3's template writes them, and text around the tokens the rule touches.
TEXTS = (
    "<|user|>\nHello there, how are you today?<|end|>\n<|assistant|>\n",
    "<|system|>\nYou are helpful.<|end|>\n<|user|>\n  spaced  <|end|>\n<|assistant|>",
    "plain </s> text <s> and <unk> then <|endoftext|> more",
    "tabs\tand\nnewlines<|end|>\t\n\r the end",
    "<|user|><|assistant|>   <|end|>",
)
