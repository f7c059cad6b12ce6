"""Tokenizer behaviour beyond the llama.cpp goldens: round trips, streaming decode, special
tokens, BOS/EOS handling, bad metadata, and speed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hipcore.errors import InvalidModelError, UnsupportedModelError, UsageError
from hipcore.gguf.file import read_plan
from hipcore.tokenizer.tokenizer import _UNSEEN, Tokenizer

GOLDEN = Path(__file__).parent / "golden"

# Text a user could type: planes 0-3 without lone surrogates (which have no UTF-8). SmolLM2's
# vocabulary has no token for a few bytes (C0 controls 04 06 13 14 16 1D and the lead bytes
# F1/F2 of the unassigned planes 4-11): llama.cpp drops them and so do we (see the goldens), so
# those characters cannot round-trip.
_UNREPRESENTABLE = "\x04\x06\x13\x14\x16\x1d"
any_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), max_codepoint=0x3FFFF, blacklist_characters=_UNREPRESENTABLE),
    max_size=60,
)


@pytest.fixture(scope="module")
def demo_metadata(demo_model_path: Path) -> dict:
    return dict(read_plan(demo_model_path).metadata)


@pytest.fixture(scope="module")
def smollm(demo_metadata) -> Tokenizer:
    return Tokenizer.from_metadata(demo_metadata)


@pytest.fixture(scope="module")
def spm_metadata() -> dict:
    data = json.loads((GOLDEN / "tokenizer_spm_vocab.json").read_text(encoding="utf-8"))["metadata"]
    return {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}


@pytest.fixture(scope="module")
def spm(spm_metadata) -> Tokenizer:
    return Tokenizer.from_metadata(spm_metadata)


# --- round trips and streaming -------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(any_text)
def test_byte_level_bpe_round_trips_any_text(smollm, text):
    ids = smollm.encode(text, add_bos=False, parse_special=False)
    assert smollm.decode(ids) == text


@settings(max_examples=150, deadline=None)
@given(any_text)
def test_sentencepiece_round_trips_any_text(spm, text):
    # The space prefix added on encode is removed again on decode (as llama.cpp does).
    ids = spm.encode(text, add_bos=False, parse_special=False)
    assert spm.decode(ids) == text


@settings(max_examples=100, deadline=None)
@given(any_text)
def test_stream_decoder_emits_only_whole_characters_and_adds_up_to_decode(smollm, text):
    ids = smollm.encode(text, add_bos=False, parse_special=False)
    stream = smollm.stream_decoder()
    parts = [stream.feed(i) for i in ids]
    parts.append(stream.flush())
    assert "".join(parts) == text
    assert all("\ufffd" not in part for part in parts) or "\ufffd" in text


def test_stream_decoder_holds_back_a_character_split_across_tokens(smollm):
    text = "🙂👨‍👩‍👧 中文"
    ids = smollm.encode(text, add_bos=False)
    pieces = [smollm.token_piece(i) for i in ids]
    assert any(not _is_whole_utf8(p) for p in pieces), "this text should split characters across tokens"
    stream = smollm.stream_decoder()
    emitted = [stream.feed(i) for i in ids]
    assert "" in emitted  # something was held back until its character was complete
    assert "".join(emitted) + stream.flush() == text


def test_stream_decoder_flush_replaces_an_unfinished_character(smollm):
    ids = smollm.encode("🙂", add_bos=False)
    assert len(ids) > 1
    stream = smollm.stream_decoder()
    assert stream.feed(ids[0]) == ""
    assert stream.flush() == "\ufffd"
    assert stream.feed(ids[0]) == ""  # usable again after a flush
    assert stream.feed(ids[1]) == "🙂"


def test_stream_decoder_skips_special_tokens_unless_asked(smollm):
    ids = smollm.encode("<|im_start|>assistant\nHi<|im_end|>", add_bos=False)
    quiet, loud = smollm.stream_decoder(), smollm.stream_decoder(skip_special=False)
    assert "".join(quiet.feed(i) for i in ids) == "assistant\nHi"
    assert "".join(loud.feed(i) for i in ids) == "<|im_start|>assistant\nHi<|im_end|>"


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.one_of(st.integers(0, 49151), st.integers(0, 300)), max_size=40), skip=st.booleans())
def test_stream_decoder_fast_path_equals_the_incremental_decoder_of_the_pieces(smollm, ids, skip):
    """feed() takes a whole-UTF-8 piece's cached text when no character is open (Tokenizer.piece_text): the
    same text as decoding the pieces incrementally, for any ids (byte tokens 0..300 split characters)."""
    import codecs

    reference = codecs.getincrementaldecoder("utf-8")(errors="replace")
    stream = smollm.stream_decoder(skip_special=skip)
    for i in ids:
        assert stream.feed(i) == reference.decode(smollm.token_piece(i, skip_special=skip))
    assert stream.flush() == reference.decode(b"", final=True)


def test_fill_piece_caches_holds_what_piece_text_would_give(demo_metadata):
    """Every id's text, both ways, decoded once (leak-check's warm-up: the caches at the vocabulary's bound); the
    same answers as a tokenizer that decodes them on demand."""
    filled, lazy = Tokenizer.from_metadata(demo_metadata), Tokenizer.from_metadata(demo_metadata)
    filled.fill_piece_caches()
    for skip_special in (False, True):
        cache = filled._piece_texts[skip_special]
        assert len(cache) == filled.vocab_size and not any(text is _UNSEEN for text in cache)
        assert all(cache[i] == lazy.piece_text(i, skip_special=skip_special) for i in range(0, filled.vocab_size, 97))
    assert cache[1] == "" and filled._piece_texts[False][1] == "<|im_start|>"


def test_piece_text_is_the_piece_when_whole_utf8_and_refuses_what_token_piece_refuses(smollm):
    for i in (0, 1, 2, 200, 1000, 49151):
        piece = smollm.token_piece(i)
        assert smollm.piece_text(i) == (piece.decode("utf-8") if _is_whole_utf8(piece) else None)
        assert smollm.piece_text(i) == smollm.piece_text(i)  # cached
    assert smollm.piece_text(1, skip_special=True) == ""  # <|im_start|>: special, skipped
    for bad in (True, -1, 49152, 1.0):
        with pytest.raises(UsageError):
            smollm.piece_text(bad)
        with pytest.raises(UsageError):
            smollm.stream_decoder().feed(bad)


def _is_whole_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# --- special tokens, BOS and EOS ---------------------------------------------------------------


def test_special_tokens_are_single_ids_only_when_parsed(smollm):
    im_start = smollm.encode("<|im_start|>", add_bos=False)
    assert im_start == [1] and smollm.token_text(1) == "<|im_start|>"
    as_text = smollm.encode("<|im_start|>", add_bos=False, parse_special=False)
    assert 1 not in as_text and len(as_text) > 1
    assert smollm.decode(as_text) == "<|im_start|>"


def test_smollm2_ids_and_end_of_generation_set(smollm):
    assert (smollm.bos_id, smollm.eos_id, smollm.add_bos) == (1, 2, False)
    assert {0, 2} <= smollm.eot_ids  # <|endoftext|> and <|im_end|>
    assert smollm.encode("Hi")[0] != smollm.bos_id
    assert smollm.encode("Hi", add_bos=True)[0] == smollm.bos_id


def test_sentencepiece_defaults_follow_llama_cpp(spm, spm_metadata):
    # The vocabulary names no add_bos_token / add_space_prefix: llama.cpp adds BOS and a space.
    assert "tokenizer.ggml.add_bos_token" not in spm_metadata
    assert spm.add_bos and spm.add_space_prefix
    ids = spm.encode("Hello")
    assert ids[0] == spm.bos_id == 1
    assert spm.token_text(ids[1]).startswith("\u2581")
    assert spm.encode("Hello", add_bos=False) == ids[1:]
    with_eos = Tokenizer.from_metadata({**spm_metadata, "tokenizer.ggml.add_eos_token": True})
    assert with_eos.encode("Hello")[-1] == with_eos.eos_id == 2


def test_sentencepiece_byte_fallback_for_unknown_characters(spm):
    ids = spm.encode("\u0f00", add_bos=False, parse_special=False)  # a Tibetan syllable
    assert [spm.token_text(i) for i in ids][-3:] == ["<0xE0>", "<0xBC>", "<0x80>"]
    assert spm.decode(ids) == "\u0f00"


def test_empty_text(smollm, spm):
    assert smollm.encode("") == []
    assert spm.encode("") == [spm.bos_id]
    assert spm.encode("", add_bos=False) == []
    assert smollm.decode([]) == ""


def test_decode_rejects_ids_outside_the_vocabulary(smollm):
    with pytest.raises(UsageError, match="outside the vocabulary"):
        smollm.decode([5, smollm.vocab_size])
    for bad in (-1, True, 2.0, "7"):
        with pytest.raises(UsageError):
            smollm.token_text(bad)


def test_numpy_integer_ids_are_accepted(smollm):
    import numpy as np

    ids = smollm.encode("Hello world", add_bos=False)
    assert smollm.decode(np.array(ids, dtype=np.int64)) == "Hello world"
    stream = smollm.stream_decoder()
    assert "".join(stream.feed(np.int32(i)) for i in ids) == "Hello world"


def test_text_with_lone_surrogates_is_tokenized_with_replacement_characters(smollm):
    assert smollm.decode(smollm.encode("a\udcffb", add_bos=False)) == "a\ufffdb"


# --- bad metadata -------------------------------------------------------------------------------


def _broken(base: dict, **changes: object) -> dict:
    out = dict(base)
    for key, value in changes.items():
        full = "tokenizer.ggml." + key
        if value is None:
            out.pop(full, None)
        else:
            out[full] = value
    return out


def test_bad_vocabulary_metadata_is_named(demo_metadata, spm_metadata):
    cases = [
        (_broken(demo_metadata, model=None), InvalidModelError, "tokenizer.ggml.model"),
        (_broken(demo_metadata, model="bert"), UnsupportedModelError, "'bert'"),
        (_broken(demo_metadata, pre="deepseek-llm"), UnsupportedModelError, "'deepseek-llm'"),
        (_broken(demo_metadata, merges=None), InvalidModelError, "tokenizer.ggml.merges"),
        (_broken(demo_metadata, tokens=None), InvalidModelError, "tokenizer.ggml.tokens"),
        (_broken(demo_metadata, tokens=()), InvalidModelError, "empty"),
        (_broken(demo_metadata, tokens="abc"), InvalidModelError, "must be an array"),
        (_broken(demo_metadata, tokens=("a", 5)), InvalidModelError, "item 1"),
        (_broken(demo_metadata, tokens=("a", "b", "a")), InvalidModelError, "twice"),
        (_broken(demo_metadata, token_type=(1, 1)), InvalidModelError, "tokenizer.ggml.token_type"),
        (_broken(spm_metadata, scores=(0.0,)), InvalidModelError, "tokenizer.ggml.scores"),
        (_broken(demo_metadata, add_bos_token="yes"), InvalidModelError, "add_bos_token"),
        (_broken(demo_metadata, bos_token_id=1.5), InvalidModelError, "bos_token_id"),
        (_broken(_broken(demo_metadata, bos_token_id=None), add_bos_token=True, tokens=tuple("abcdefghij")),
         InvalidModelError, "the model has none"),
    ]
    for metadata, error, needle in cases:
        with pytest.raises(error) as caught:
            Tokenizer.from_metadata(metadata)
        message = str(caught.value)
        assert needle in message and "\n" not in message, message


def test_missing_pretokenizer_falls_back_to_default_and_says_so(demo_metadata):
    tok = Tokenizer.from_metadata(_broken(demo_metadata, pre=None))
    assert tok.pretokenizer == "default"
    assert any("pre-tokenizer" in note for note in tok.notes)


def test_special_ids_outside_the_vocabulary_are_ignored_with_a_note(demo_metadata):
    tok = Tokenizer.from_metadata(_broken(demo_metadata, padding_token_id=10**6))
    assert tok.pad_id is None
    assert any("padding_token_id" in note for note in tok.notes)


# --- speed ---------------------------------------------------------------------------------------


def test_building_and_encoding_are_fast(demo_metadata):
    start = time.perf_counter()
    tok = Tokenizer.from_metadata(demo_metadata)
    build_s = time.perf_counter() - start
    prose = (GOLDEN / "tokenizer_spm_vocab.json").read_text(encoding="utf-8")[:40_000]
    start = time.perf_counter()
    ids = tok.encode(prose)
    encode_s = time.perf_counter() - start
    ids_2000 = ids[:2000]
    assert len(ids_2000) == 2000
    text_2000 = tok.decode(ids_2000)
    start = time.perf_counter()
    Tokenizer.from_metadata(demo_metadata).encode(text_2000)  # a fresh tokenizer: no word cache
    encode_2000_s = time.perf_counter() - start
    assert build_s < 1.0, f"building took {build_s:.2f} s"
    assert encode_2000_s < 1.0 + build_s, f"2,000 tokens took {encode_2000_s:.2f} s"
    assert encode_s < 5.0, f"{len(ids)} tokens took {encode_s:.2f} s"


def test_encoding_keeps_its_speed_beside_a_busy_thread(smollm):
    """The pre-tokenizer's regex matching must not give up the GIL at every match: in a server the event loop
    and the engine thread keep it busy, and each match then waited up to the switch interval to win it back
    (measured: a 40-token chat prompt took 30 us alone and 6-9 ms beside one busy thread). A fault planted by
    letting finditer release the GIL again makes this fail by two orders of magnitude."""
    import sys
    import threading

    text = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nthe quick brown fox<|im_end|>\n<|im_start|>assistant\n")
    smollm.encode(text)
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            sum(range(100))

    old = sys.getswitchinterval()
    sys.setswitchinterval(0.005)  # CPython's default, stated: the wait each lost match would pay
    worker = threading.Thread(target=busy)
    worker.start()
    try:
        t0 = time.perf_counter()
        for _ in range(20):
            smollm.encode(text)
        per_encode = (time.perf_counter() - t0) / 20
    finally:
        stop.set()
        worker.join()
        sys.setswitchinterval(old)
    # alone it takes well under 1 ms; one lost GIL hand-off per match costs >= several ms per encode
    assert per_encode < 0.0015, f"{per_encode * 1e3:.2f} ms per encode beside a busy thread"
