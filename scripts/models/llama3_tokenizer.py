"""Llama 3's tokenizer in GGUF form, from Meta's tiktoken file (`tokenizer.model`).

Meta's own package on PyPI, llama-models (`pip install --no-deps llama-models`), ships the real file at
llama_models/llama3/tokenizer.model: 128,000 byte-level BPE tokens ("base64-token rank" per line). A GGUF
holds the same vocabulary as llama.cpp's converter writes it: each token's bytes through GPT-2's
byte-to-unicode map, the merges recovered from the ranks (as Hugging Face's TikTokenConverter does), then
the 256 special tokens (<|begin_of_text|> ... <|reserved_special_token_N|>) as control tokens, for a
vocabulary of 128,256. Uses the standard library and nothing else.
"""

from __future__ import annotations

import base64
import importlib.util
from dataclasses import dataclass
from pathlib import Path

# The special tokens in the order llama_models/llama3/tokenizer.py gives them; the rest are reserved.
NAMED_SPECIAL_TOKENS = (
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
    "<|eot_id|>", "<|python_tag|>", "<|image|>",
)
N_SPECIAL_TOKENS = 256
TOKEN_TYPE_NORMAL, TOKEN_TYPE_CONTROL = 1, 3

# Llama 3.1's chat template, shortened to the system/user/assistant turns (no tool calls).
CHAT_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class GgufVocab:
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_id: int
    eos_id: int  # <|eot_id|>: the end of an assistant turn, as the instruct models' files say
    chat_template: str


def find_llama3_tokenizer_model() -> Path | None:
    """tokenizer.model of the installed llama-models package, if any."""
    spec = importlib.util.find_spec("llama_models")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "llama3" / "tokenizer.model"
    return path if path.is_file() else None


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """'base64 rank' lines -> {token bytes: rank}; ranks must be 0..n-1 (a token's id is its rank)."""
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(path.read_text("ascii").splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError:
            raise ValueError(f"{path}:{number}: not a tiktoken 'base64 rank' line") from None
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path}: ranks are not 0..{len(ranks) - 1} without gaps")
    return ranks


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's map of the 256 byte values to printable characters (llama.cpp's BPE vocabularies use it)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, (chr(c) for c in chars)))


def _merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge list that reproduces tiktoken's ranks: each multi-byte token, split every way into two
    tokens that exist, ordered by the token's rank and then by the two parts' ranks."""
    found = []
    for token, rank in ranks.items():
        if len(token) == 1:
            continue
        pairs = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks]
        pairs.sort(key=lambda p: (ranks[p[0]], ranks[p[1]]))
        found.extend((rank, left, right) for left, right in pairs)
    found.sort(key=lambda m: m[0])
    return [(left, right) for _, left, right in found]


def gguf_vocab(path: Path) -> GgufVocab:
    """The GGUF vocabulary (tokenizer.ggml.*) of a tiktoken file plus Llama 3's 256 special tokens."""
    ranks = read_tiktoken_ranks(path)
    encode = _byte_to_unicode()
    text = lambda b: "".join(encode[x] for x in b)  # noqa: E731
    base = [b"" for _ in ranks]
    for token, rank in ranks.items():
        base[rank] = token
    specials = list(NAMED_SPECIAL_TOKENS) + [f"<|reserved_special_token_{i}|>"
                                             for i in range(2, 2 + N_SPECIAL_TOKENS - len(NAMED_SPECIAL_TOKENS))]
    tokens = [text(b) for b in base] + specials
    types = [TOKEN_TYPE_NORMAL] * len(base) + [TOKEN_TYPE_CONTROL] * len(specials)
    merges = [f"{text(a)} {text(b)}" for a, b in _merges(ranks)]
    n = len(base)
    return GgufVocab(tokens=tokens, token_types=types, merges=merges, bos_id=n,
                     eos_id=n + NAMED_SPECIAL_TOKENS.index("<|eot_id|>"), chat_template=CHAT_TEMPLATE)
