"""The tokenizer of a GGUF model: text to token ids and back, matching llama.cpp id for id.

Built from the `tokenizer.ggml.*` metadata (see hipcore.tokenizer.vocab). Two families:
"gpt2" byte-level BPE with a named pre-tokenizer (SmolLM2, Llama 3, Qwen2 ...) in
hipcore.tokenizer.bpe, and "llama" SentencePiece-style vocabularies in hipcore.tokenizer.spm.

Special tokens (control, user-defined and unknown tokens such as "<|im_start|>") are found in the
text first, longest first, and never split; with parse_special=False only user-defined tokens are,
and control-token text is tokenized as ordinary text (so user input cannot forge a turn marker).

Decoding works on bytes: a character may span several tokens, so `decode` joins the bytes before
turning them into text, and `StreamDecoder` holds back an incomplete UTF-8 sequence until the
token that completes it arrives.
"""

from __future__ import annotations

import codecs
import operator
import re
from typing import Mapping, Sequence

from hipcore.errors import UsageError
from hipcore.tokenizer.bpe import BpeEncoder, decode_token_text
from hipcore.tokenizer.spm import SPACE_MARK, SpmEncoder
from hipcore.tokenizer.vocab import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_LSTRIP,
    ATTR_NORMAL,
    ATTR_RSTRIP,
    ATTR_UNKNOWN,
    ATTR_USER_DEFINED,
    Vocabulary,
    read_vocabulary,
)

_SHOWN_ONLY_WHEN_SPECIAL = ATTR_CONTROL | ATTR_UNKNOWN
_UNSEEN = object()  # piece_text: not asked yet (None is an answer)
_C_SPACE = " \t\n\v\f\r"  # what C's isspace() takes, which llama.cpp strips with


class Tokenizer:
    """Encode and decode with a model's own vocabulary. Build it with `from_metadata`."""

    def __init__(self, vocab: Vocabulary):
        self._vocab = vocab
        self.kind: str = vocab.model
        self.vocab_size: int = len(vocab.tokens)
        self.bos_id: int | None = vocab.bos_id
        self.eos_id: int | None = vocab.eos_id
        self.unk_id: int | None = vocab.unk_id
        self.pad_id: int | None = vocab.pad_id
        self.eot_ids: frozenset[int] = vocab.eog_ids
        self.add_bos: bool = vocab.add_bos
        self.add_eos: bool = vocab.add_eos
        self.add_space_prefix: bool = vocab.add_space_prefix
        self.pretokenizer: str | None = vocab.pretokenizer.name if vocab.pretokenizer else None
        self.notes: tuple[str, ...] = vocab.notes
        if vocab.model == "gpt2":
            assert vocab.pretokenizer is not None
            self._bpe: BpeEncoder | None = BpeEncoder(vocab.token_to_id, vocab.merges, vocab.pretokenizer)
            self._spm: SpmEncoder | None = None
        else:
            self._bpe = None
            self._spm = SpmEncoder(vocab.token_to_id, vocab.scores, vocab.unk_id)
        self._special = [(vocab.tokens[i], i) for i in vocab.special_ids]
        self._user_defined = [(t, i) for t, i in self._special if vocab.attrs[i] & ATTR_USER_DEFINED]
        self._pieces: list[bytes | None] = [None] * self.vocab_size  # token_piece cache
        # piece_text caches (skip_special False, True): per id its piece as text, None if not whole UTF-8. Lists
        # made whole here, like _pieces, so that a new token seen while serving costs its text and nothing more.
        self._piece_texts: tuple[list, list] = ([_UNSEEN] * self.vocab_size, [_UNSEEN] * self.vocab_size)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, object]) -> "Tokenizer":
        """Build from GGUF metadata; raises InvalidModelError / UnsupportedModelError naming the key."""
        return cls(read_vocabulary(metadata))

    # --- encoding ---------------------------------------------------------------------------

    def encode(
        self,
        text: str,
        *,
        add_bos: bool | None = None,
        parse_special: bool = True,
        add_eos: bool | None = None,
    ) -> list[int]:
        """Token ids of `text`. add_bos / add_eos: None follows the model's metadata (llama.cpp's
        defaults where it is silent); True or False forces. A BOS asked for on a model without one
        is a UsageError."""
        want_bos = self.add_bos if add_bos is None else add_bos
        want_eos = self.add_eos if add_eos is None else add_eos
        text = _valid_text(text)
        out: list[int] = []
        if want_bos:
            if self.bos_id is None:
                raise UsageError("this model has no BOS token; encode with add_bos=False")
            out.append(self.bos_id)
        fragments = self._split_special(text, parse_special) if text else []
        if self._spm is not None:
            prev_special = True  # SentencePiece prefixes a space to text that starts a segment
            for fragment in fragments:
                if isinstance(fragment, int):
                    out.append(fragment)
                    prev_special = True
                    continue
                if self.add_space_prefix and prev_special:
                    fragment = " " + fragment
                self._spm.encode(fragment.replace(" ", SPACE_MARK), out)
                prev_special = False
        else:
            assert self._bpe is not None
            for fragment in fragments:
                if isinstance(fragment, int):
                    out.append(fragment)
                else:
                    self._bpe.encode(fragment, out)
        if want_eos:
            if self.eos_id is None:
                raise UsageError("this model has no EOS token; encode with add_eos=False")
            out.append(self.eos_id)
        return out

    def _split_special(self, text: str, parse_special: bool) -> list[str | int]:
        """Cut `text` at special-token occurrences, longest tokens first (as llama.cpp does); a token with
        the LSTRIP / RSTRIP attribute (vocab.py) takes the whitespace before / after it along."""
        fragments: list[str | int] = [text]
        for token_text, token_id in (self._special if parse_special else self._user_defined):
            if token_text not in text:
                continue
            attr = self._vocab.attrs[token_id]
            out: list[str | int] = []
            for fragment in fragments:
                if isinstance(fragment, int) or token_text not in fragment:
                    out.append(fragment)
                    continue
                parts = fragment.split(token_text)
                for k, part in enumerate(parts):
                    if k:
                        out.append(token_id)
                        if attr & ATTR_RSTRIP:
                            part = part.lstrip(_C_SPACE)
                    if k < len(parts) - 1 and attr & ATTR_LSTRIP:
                        part = part.rstrip(_C_SPACE)
                    if part:
                        out.append(part)
            fragments = out
        return fragments

    # --- decoding ---------------------------------------------------------------------------

    def token_text(self, id: int) -> str:
        """The vocabulary entry as stored in the file (e.g. 'Ġworld', '▁the', '<|im_end|>')."""
        return self._vocab.tokens[self._index(id)]

    def is_special(self, id: int) -> bool:
        """Control or unknown tokens: not printed when decoding with skip_special."""
        return bool(self._vocab.attrs[self._index(id)] & _SHOWN_ONLY_WHEN_SPECIAL)

    def token_piece(self, id: int, *, skip_special: bool = False) -> bytes:
        """The bytes token `id` stands for (may be part of a UTF-8 character)."""
        id = self._index(id)
        if skip_special and self._vocab.attrs[id] & _SHOWN_ONLY_WHEN_SPECIAL:
            return b""
        piece = self._pieces[id]
        if piece is None:
            piece = self._pieces[id] = self._piece(id)
        return piece

    def piece_text(self, id: int, *, skip_special: bool = False) -> str | None:
        """token_piece(id) as text when those bytes are whole UTF-8 by themselves, else None (part of a character,
        or not UTF-8). Cached per id: a stream decoder asks it once per generated token."""
        texts = self._piece_texts[bool(skip_special)]
        # (a bool would read the entry of 0 or 1, a negative int one from the end: token_piece refuses both below)
        if type(id) is int and 0 <= id < self.vocab_size:
            text = texts[id]
            if text is not _UNSEEN:
                return text
        piece = self.token_piece(id, skip_special=skip_special)  # refuses an id outside the vocabulary
        try:
            text = piece.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        texts[self._index(id)] = text
        return text

    def fill_piece_caches(self) -> None:
        """Decode every token's piece and text once, as serving does over time: the caches at their full size,
        which the vocabulary bounds. leak-check's warm-up calls it, so that a model whose tokens spread over the
        whole vocabulary (random weights do) filling them is not counted as host memory growth."""
        for skip_special in (False, True):
            for id in range(self.vocab_size):
                self.piece_text(id, skip_special=skip_special)

    def _piece(self, id: int) -> bytes:
        vocab = self._vocab
        attr = vocab.attrs[id]
        text = vocab.tokens[id]
        if attr & (_SHOWN_ONLY_WHEN_SPECIAL | ATTR_USER_DEFINED):
            return text.encode("utf-8")
        if attr & ATTR_NORMAL:
            if self.kind == "gpt2":
                return decode_token_text(text)
            return text.replace(SPACE_MARK, " ").encode("utf-8")
        if attr & ATTR_BYTE:
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                return b""
        return b""  # unused or undefined tokens print nothing (llama.cpp does the same)

    def decode_bytes(self, ids: Sequence[int], *, skip_special: bool = False) -> bytes:
        """The bytes of `ids`, as llama.cpp's detokenize gives them (leading space of a
        SentencePiece text removed; gpt2 vocabularies that ask for it get their spaces cleaned)."""
        out = bytearray()
        for k, token_id in enumerate(ids):
            piece = self.token_piece(token_id, skip_special=skip_special)
            if k == 0 and self.add_space_prefix and piece.startswith(b" "):
                piece = piece[1:]
            out += piece
        if self._vocab.clean_spaces:
            return _clean_spaces(bytes(out))
        return bytes(out)

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """Text of `ids`; bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids, skip_special=skip_special).decode("utf-8", errors="replace")

    def stream_decoder(self, skip_special: bool = True) -> "StreamDecoder":
        return StreamDecoder(self, skip_special=skip_special)

    def _index(self, id: int) -> int:
        """`id` as a Python int in range (numpy integers from a sampler are fine)."""
        try:
            index = operator.index(id) if not isinstance(id, bool) else None
        except TypeError:
            index = None
        if index is None or not 0 <= index < self.vocab_size:
            raise UsageError(f"token id {id!r} is outside the vocabulary (0..{self.vocab_size - 1})")
        return index


class StreamDecoder:
    """Turns generated ids into text as they come, emitting only complete UTF-8 characters.

    feed(id) returns the text that became complete with this token ("" while a character is still
    open); flush() returns what is left at the end (an unfinished character becomes U+FFFD)."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = True):
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._texts = tokenizer._piece_texts[bool(skip_special)]  # piece_text's cache, read here first
        self._vocab_size = tokenizer.vocab_size

    def feed(self, id: int) -> str:
        if not self._utf8.buffer:  # no character open: a piece that is whole UTF-8 by itself is its own text
            # (any other id, a bool or a numpy integer or one out of range, goes through piece_text's checks)
            text = self._texts[id] if type(id) is int and 0 <= id < self._vocab_size else _UNSEEN
            if text is _UNSEEN:
                text = self._tokenizer.piece_text(id, skip_special=self._skip_special)
            if text is not None:
                return text
        return self._utf8.decode(self._tokenizer.token_piece(id, skip_special=self._skip_special))

    def flush(self) -> str:
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text


def _valid_text(text: str) -> str:
    if not isinstance(text, str):
        raise UsageError(f"text to tokenize must be a string, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (e.g. undecodable bytes smuggled in by surrogateescape) have no UTF-8
        # form; each becomes U+FFFD rather than failing the whole prompt.
        text = _LONE_SURROGATE.sub("\ufffd", text)
    return text


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean_spaces(text: bytes) -> bytes:
    """llama.cpp's clean_up_tokenization_spaces: ' ?' ' !' ' .' ' ,' lose their space, so do
    " ' " (both spaces) and " 's", " 'm", " 're", " 've"."""
    if not text:
        return text
    # Pass 1: drop the space before ? ! . ,
    out = bytearray(text[:1])
    for i in range(1, len(text)):
        x = text[i]
        if text[i - 1] == 0x20 and x in b"?!.,":
            out.pop()
        out.append(x)
    # Pass 2: a lone apostrophe between spaces loses both spaces.
    src, out = bytearray(out), bytearray(out[:1])
    i = 1
    while i < len(src):
        x = src[i]
        if x == 0x27 and i + 1 < len(src) and src[i - 1] == 0x20 and src[i + 1] == 0x20:
            out.pop()
            out.append(x)
            src[i + 1] = 0  # the dropped space no longer counts as the next character's neighbour
            i += 2
            continue
        out.append(x)
        i += 1
    # Pass 3: contractions ('s 'm 're 've) glue to the word before.
    src, out = bytes(out), bytearray(out[:1])
    for i in range(1, len(src)):
        x = src[i]
        if src[i - 1] == 0x20 and x == 0x27 and i + 1 < len(src):
            x1 = src[i + 1]
            if x1 in b"sm":
                out.pop()
            elif i + 2 < len(src) and (x1, src[i + 2]) in ((0x72, 0x65), (0x76, 0x65)):
                out.pop()
        out.append(x)
    return bytes(out)
