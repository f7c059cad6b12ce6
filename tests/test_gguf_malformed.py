"""Every class of malformed GGUF file named in issue 2, each written to disk by the test and read back.

Each must fail with GGUFError: one line naming the field, exit 3 (invalid) or 4 (valid but
unsupported), in well under a second, without allocating more than the small file justifies.
"""

from __future__ import annotations

import time
import tracemalloc
from typing import Callable

import pytest

from support.gguf_raw import (
    ARRAY, BOOL, FLOAT32, FLOAT64, INT32, STRING, UINT32, UINT64, RawGGUF, RawKV, RawTensor, gguf_string, u32, u64,
)
from support.gguf_factory import raw_tiny_llama
from hipcore.gguf.file import GGUFError, read_plan, read_plan_from_bytes

INVALID, UNSUPPORTED = 3, 4
MiB = 1 << 20


def small(**kwargs) -> RawGGUF:
    """A valid 1-layer llama with a gpt2 vocabulary, ~45 KB."""
    args = dict(n_layers=1, hidden=32, n_heads=2, n_kv_heads=1, ffn=32, vocab=300, tokenizer="gpt2")
    args.update(kwargs)
    return raw_tiny_llama(**args)


def header(n_tensors: int, n_kv: int, version: int = 3) -> bytes:
    return b"GGUF" + u32(version) + u64(n_tensors) + u64(n_kv)


def edit(fn: Callable[[RawGGUF], object], **kwargs) -> Callable[[], bytes]:
    """A case built from the small valid file with one change applied."""
    def build() -> bytes:
        g = small(**kwargs)
        result = fn(g)
        return result if isinstance(result, bytes) else g.to_bytes()
    return build


def kv(key, value_type, value=None, element_type=None, raw=None):
    return RawKV(key, value_type, value, element_type, raw)


def tensor_index(g: RawGGUF, name: str) -> int:
    return next(i for i, t in enumerate(g.tensors) if t.name == name)


def set_dims(name: str, dims, *, ggml_type: int | None = None) -> Callable[[RawGGUF], None]:
    def change(g: RawGGUF) -> None:
        t = g.tensor(name)
        t.dims, t.data = tuple(dims), None
        if ggml_type is not None:
            t.ggml_type = ggml_type
    return change


def set_offset(name: str, offset_fn: Callable[[RawGGUF, int], int]) -> Callable[[RawGGUF], None]:
    """Give every tensor its valid offset explicitly, then change the one of `name`."""
    def change(g: RawGGUF) -> None:
        running = 0
        for t in g.tensors:
            t.offset = running
            running += -(-t.nbytes() // 32) * 32
        t = g.tensor(name)
        t.offset = offset_fn(g, t.offset)
    return change


def retype(key: str, value_type: int, value, element_type=None) -> Callable[[RawGGUF], None]:
    return lambda g: g.set_kv(key, value_type, value, element_type)


def drop_kv(key: str) -> Callable[[RawGGUF], None]:
    return lambda g: g.remove_kv(key)


def valid_bytes() -> bytes:
    return small().to_bytes()


def _swap_offsets(g: RawGGUF) -> None:
    set_offset("token_embd.weight", lambda g, o: o)(g)
    a, b = g.tensors[1], g.tensors[2]
    a.offset, b.offset = b.offset, a.offset


def _extra_tensor(g: RawGGUF) -> None:
    g.tensors.append(RawTensor("blk.0.attn_q.bias", (32,), 0))


def _layer_past_block_count(g: RawGGUF) -> None:
    g.tensors.append(RawTensor("blk.1.attn_norm.weight", (32,), 0))


def _duplicate_tensor(g: RawGGUF) -> None:
    g.tensors[2].name = g.tensors[1].name


def architecture(name: str) -> Callable[[RawGGUF], None]:
    """The file as a converter for architecture `name` writes it: the name and every key's prefix."""
    def change(g: RawGGUF) -> None:
        g.kvs = [RawKV(name + k.key[len("llama"):], k.value_type, k.value, k.element_type)
                 if k.key.startswith("llama.") else k for k in g.kvs]
        g.set_kv("general.architecture", STRING, name)
    return change


# (case id, builder of the file bytes, exit code, a fragment the message must contain)
CASES: list[tuple[str, Callable[[], bytes], int, str]] = [
    # header
    ("empty file", lambda: b"", INVALID, "empty"),
    ("truncated magic", lambda: b"GG", INVALID, "file truncated"),
    ("truncated header", lambda: valid_bytes()[:14], INVALID, "file truncated"),
    ("truncated in metadata", lambda: valid_bytes()[:300], INVALID, "truncated"),
    ("truncated in tensor infos", lambda: valid_bytes()[:small().to_bytes().index(b"token_embd.weight") + 20],
     INVALID, "file truncated"),
    ("bad magic", lambda: b"GGML" + valid_bytes()[4:], INVALID, "not a GGUF"),
    ("zero magic", lambda: bytes(4) + valid_bytes()[4:], INVALID, "magic"),
    ("version 0", lambda: header(0, 0, version=0), INVALID, "version"),
    ("version 1", lambda: header(0, 0, version=1), UNSUPPORTED, "version 1 is obsolete"),
    ("future version", lambda: header(0, 0, version=4), UNSUPPORTED, "newer"),
    ("byte-swapped version", lambda: header(0, 0, version=0x03000000), UNSUPPORTED, "byte-swapped"),
    ("absurd version", lambda: header(0, 0, version=0xDEADBEEF), INVALID, "version"),
    # counts
    ("tensor count 2^63", lambda: header(2**63, 0), INVALID, "tensor_count"),
    ("tensor count past the file", edit(lambda g: setattr(g, "tensor_count", 10**6)), INVALID, "tensor_count"),
    ("kv count 2^64-1", lambda: header(0, 2**64 - 1), INVALID, "metadata_kv_count"),
    ("kv count past the file", lambda: header(0, 100) + bytes(200), INVALID, "metadata_kv_count"),
    ("kv count one too many", edit(lambda g: setattr(g, "kv_count", len(g.kvs) + 1)), INVALID, ""),
    # keys
    ("key length huge", lambda: header(0, 1) + u64(2**64 - 1) + b"x" * 32, INVALID, "metadata key length"),
    ("key length past the end", lambda: header(0, 1) + u64(1000) + b"general.name" + bytes(10), INVALID,
     "file truncated"),
    ("empty key", edit(lambda g: g.kvs.insert(1, kv("", UINT32, 1))), INVALID, "non-empty"),
    ("duplicate key", edit(lambda g: g.kvs.append(kv("llama.block_count", UINT32, 1))), INVALID, "twice"),
    ("non-ASCII key", edit(lambda g: g.kvs.append(kv("général.name", STRING, "x"))), INVALID, "ASCII"),
    ("key with control characters", edit(lambda g: g.kvs.append(kv(b"general.\nname", STRING, "x"))), INVALID,
     "metadata key"),
    ("upper-case key", edit(lambda g: g.kvs.append(kv("General.Name", STRING, "x"))), INVALID, "lower_snake_case"),
    # architecture names: llama.cpp's own names are unsupported, damaged ones invalid
    ("architecture command-r", edit(architecture("command-r")), UNSUPPORTED, "'command-r' is not supported"),
    ("architecture hunyuan-moe", edit(architecture("hunyuan-moe")), UNSUPPORTED,
     "mixture-of-experts architecture 'hunyuan-moe' is not supported"),
    ("architecture with an escape sequence", edit(retype("general.architecture", STRING, "llama\x1b[2J")), INVALID,
     "'llama\\x1b[2J' is not an architecture name"),
    ("architecture with a newline", edit(retype("general.architecture", STRING, "lla\nma")), INVALID,
     "'lla\\nma' is not an architecture name"),
    ("non-ASCII architecture", edit(retype("general.architecture", STRING, "llamä")), INVALID, "architecture name"),
    ("architecture of 65 characters", edit(retype("general.architecture", STRING, "l" * 65)), INVALID,
     "architecture name"),
    # sizes past what the KV cache holds are unsupported; past the reader's caps, invalid
    ("1,100 layers", edit(retype("llama.block_count", UINT32, 1100)), UNSUPPORTED, "1100 layers is not supported"),
    ("5,000 layers", edit(retype("llama.block_count", UINT32, 5000)), INVALID, "block_count"),
    ("2,048 KV heads", edit(lambda g: (retype("llama.attention.head_count", UINT32, 2048)(g),
                                       retype("llama.attention.head_count_kv", UINT32, 2048)(g))), UNSUPPORTED,
     "2048 KV heads is not supported"),
    # values
    ("unknown value type", edit(lambda g: g.kvs.append(kv("general.x", 13, raw=u32(0)))), INVALID, "value type"),
    ("value type 2^32-1", edit(lambda g: g.kvs.append(kv("general.x", 2**32 - 1, raw=u32(0)))), INVALID,
     "value type"),
    ("string length huge", edit(lambda g: g.kvs.append(kv("general.x", STRING, raw=u64(2**63) + b"abc"))),
     INVALID, "length"),
    ("string length past the end", lambda: header(0, 1) + gguf_string("general.name") + u32(STRING)
     + u64(5000) + b"abc", INVALID, "file truncated"),
    ("string not UTF-8", edit(lambda g: g.set_kv("general.name", STRING, b"caf\xe9")), INVALID, "UTF-8"),
    ("bool 2", edit(lambda g: g.kvs.append(kv("general.flag", BOOL, 2))), INVALID, "0 or 1"),
    ("bool 0xFF in an array", edit(lambda g: g.kvs.append(kv("general.flags", ARRAY, [1, 0, 255], BOOL))),
     INVALID, "0 or 1"),
    # arrays
    ("array length 2^63", edit(lambda g: g.kvs.append(kv("general.a", ARRAY, raw=u32(0) + u64(2**63)))),
     INVALID, "array length"),
    ("array of 64 Mi f64 in 100 bytes", lambda: header(0, 1) + gguf_string("general.a") + u32(ARRAY)
     + u32(FLOAT64) + u64(64 * MiB) + bytes(16), INVALID, "only"),
    ("string array past the end", lambda: header(0, 1) + gguf_string("general.a") + u32(ARRAY) + u32(STRING)
     + u64(3) + gguf_string("a") + gguf_string("b") + gguf_string("c", length=100), INVALID, "file truncated"),
    ("string array element length huge", lambda: header(0, 1) + gguf_string("general.a") + u32(ARRAY)
     + u32(STRING) + u64(1) + u64(2**62) + b"abc", INVALID, "length"),
    ("nested array", edit(lambda g: g.kvs.append(kv("general.a", ARRAY, raw=u32(ARRAY) + u64(1) + u32(UINT32)
                                                   + u64(1) + u32(7)))), INVALID, "nested"),
    ("unknown array element type", edit(lambda g: g.kvs.append(kv("general.a", ARRAY, raw=u32(99) + u64(0)))),
     INVALID, "element type"),
    # alignment
    ("alignment 0", edit(lambda g: g.kvs.append(kv("general.alignment", UINT32, 0))), INVALID, "general.alignment"),
    ("alignment not a power of two", edit(lambda g: g.kvs.append(kv("general.alignment", UINT32, 48))), INVALID,
     "power of two"),
    ("alignment wrong type", edit(lambda g: g.kvs.append(kv("general.alignment", UINT64, 32))), INVALID,
     "type uint64"),
    ("alignment huge", edit(lambda g: g.kvs.append(kv("general.alignment", UINT32, 2**31))), INVALID,
     "general.alignment"),
    # tensor infos
    ("tensor name empty", edit(lambda g: setattr(g.tensors[0], "name", "")), INVALID, "empty"),
    ("tensor name 64 bytes", edit(lambda g: setattr(g.tensors[0], "name", "t" * 64)), INVALID, "name length"),
    ("tensor name length 2^64-1", lambda: header(1, 0) + u64(2**64 - 1) + bytes(64), INVALID, "name length"),
    ("tensor name not UTF-8", edit(lambda g: setattr(g.tensors[0], "name", b"tok\xff\xfe")), INVALID, "UTF-8"),
    ("tensor name duplicated", edit(_duplicate_tensor), INVALID, "also the name"),
    ("5 dimensions", edit(set_dims("output_norm.weight", (32, 1, 1, 1, 1))), INVALID, "n_dims"),
    ("0 dimensions", edit(set_dims("output_norm.weight", ())), INVALID, "n_dims"),
    ("negative dimension", edit(set_dims("output_norm.weight", (2**64 - 1,))), INVALID, "negative"),
    ("zero dimension", edit(set_dims("blk.0.attn_q.weight", (32, 0))), INVALID, "dimension 1"),
    ("element count past 2^63", edit(set_dims("blk.0.attn_q.weight", (2**32, 2**32))), INVALID, "2^63"),
    ("element count [2^62, 4]", edit(set_dims("blk.0.attn_q.weight", (2**62, 4))), INVALID, "2^63"),
    ("byte size past 2^63", edit(set_dims("blk.0.attn_q.weight", (2**31, 2**31))), INVALID, "2^63"),
    ("unknown tensor type", edit(lambda g: setattr(g.tensors[1], "ggml_type", 200)), INVALID, "not a ggml"),
    ("removed type Q4_2", edit(lambda g: setattr(g.tensors[1], "ggml_type", 4)), UNSUPPORTED, "Q4_2"),
    ("removed type Q4_0_4_4", edit(lambda g: setattr(g.tensors[1], "ggml_type", 31)), UNSUPPORTED, "removed"),
    ("unsupported type IQ4_NL", edit(set_dims("blk.0.attn_q.weight", (32, 32), ggml_type=20)), UNSUPPORTED, "IQ4_NL"),
    ("unsupported type IQ2_XXS", edit(set_dims("token_embd.weight", (256, 300), ggml_type=16), hidden=256,
                                      n_heads=4, n_kv_heads=2, vocab=300), UNSUPPORTED, "IQ2_XXS"),
    ("row not a multiple of the block", edit(set_dims("blk.0.attn_q.weight", (33, 32), ggml_type=8)), INVALID,
     "block"),
    # offsets and data
    ("offset misaligned", edit(set_offset("blk.0.attn_q.weight", lambda g, o: o + 4)), INVALID, "alignment"),
    ("offset overlapping", edit(set_offset("blk.0.attn_q.weight", lambda g, o: o - 32)), INVALID, "overlaps"),
    ("offsets out of order", edit(_swap_offsets), INVALID, "out of order"),
    ("offset past the end", edit(set_offset("output_norm.weight", lambda g, o: o + 2**40)), INVALID, "gap"),
    ("offset wrapping near 2^64", edit(set_offset("output_norm.weight", lambda g, o: 2**64 - 32)), INVALID,
     "offset"),
    ("data truncated", edit(lambda g: setattr(g, "truncate", 1000)), INVALID,
     "the download is probably incomplete"),
    ("data section missing", lambda: valid_bytes()[:small().to_bytes().index(b"output_norm.weight") + 200],
     INVALID, "file truncated"),
    # metadata -> config
    ("architecture missing", edit(drop_kv("general.architecture")), INVALID, "missing"),
    ("architecture not a string", edit(retype("general.architecture", UINT32, 1)), INVALID, "type uint32"),
    ("architecture unsupported", edit(retype("general.architecture", STRING, "mamba")), UNSUPPORTED, "mamba"),
    ("mixture of experts", edit(lambda g: g.kvs.append(kv("llama.expert_count", UINT32, 8))), UNSUPPORTED,
     "experts"),
    ("block_count missing", edit(drop_kv("llama.block_count")), INVALID, "llama.block_count"),
    ("block_count wrong type", edit(retype("llama.block_count", UINT64, 1)), INVALID, "type uint64"),
    ("embedding_length missing", edit(drop_kv("llama.embedding_length")), INVALID, "llama.embedding_length"),
    ("rms epsilon missing", edit(drop_kv("llama.attention.layer_norm_rms_epsilon")), INVALID, "missing"),
    ("rms epsilon float64", edit(retype("llama.attention.layer_norm_rms_epsilon", FLOAT64, 1e-5)), INVALID,
     "type float64"),
    ("rms epsilon NaN", edit(retype("llama.attention.layer_norm_rms_epsilon", FLOAT32, float("nan"))), INVALID,
     "finite"),
    ("rope theta negative", edit(retype("llama.rope.freq_base", FLOAT32, -1.0)), INVALID, "freq_base"),
    ("block_count 10^9", edit(retype("llama.block_count", UINT32, 10**9)), INVALID, "4096"),
    ("block_count larger than the tensors", edit(retype("llama.block_count", UINT32, 2)), INVALID, "missing"),
    ("block_count smaller than the tensors", edit(_layer_past_block_count), INVALID, "belongs to layer 1"),
    ("context 2^31", edit(retype("llama.context_length", UINT32, 2**31)), INVALID, "llama.context_length"),
    ("head_count not divisible by head_count_kv", edit(lambda g: (g.set_kv("llama.attention.head_count", UINT32, 4),
                                                                 g.set_kv("llama.attention.head_count_kv", UINT32, 3))),
     INVALID, "not divisible"),
    ("head_count_kv 0", edit(retype("llama.attention.head_count_kv", UINT32, 0)), INVALID, "head_count_kv"),
    ("per-layer head counts differ", edit(retype("llama.attention.head_count", ARRAY, [2, 1], UINT32),
                                          n_layers=2), UNSUPPORTED, "per-layer"),
    ("partial rotary dimension", edit(retype("llama.rope.dimension_count", UINT32, 8)), INVALID,
     "llama.rope.dimension_count"),
    ("byte token misspelled in a gpt2 vocabulary", edit(lambda g: g.set_kv(
        "tokenizer.ggml.token_type", ARRAY, [*g.kv("tokenizer.ggml.token_type").value[:-1], 6], INT32)), INVALID,
     "<0xXX>"),
    ("rope scaling yarn", edit(lambda g: g.kvs.append(kv("llama.rope.scaling.type", STRING, "yarn"))), UNSUPPORTED,
     "yarn"),
    ("tensor shape disagrees with config", edit(set_dims("blk.0.attn_k.weight", (32, 32))), INVALID, "disagrees"),
    ("embedding rows disagree with the vocabulary", edit(set_dims("token_embd.weight", (32, 299))), INVALID,
     "disagrees"),
    ("required tensor missing", edit(lambda g: g.tensors.pop(tensor_index(g, "blk.0.ffn_up.weight"))), INVALID,
     "ffn_up"),
    ("tensor unknown to the architecture", edit(_extra_tensor), UNSUPPORTED, "not part of the llama"),
    # vocabulary
    ("vocab_size disagrees with tokens", edit(retype("llama.vocab_size", UINT32, 301)), INVALID,
     "tokenizer.ggml.tokens"),
    ("token_type shorter than tokens", edit(retype("tokenizer.ggml.token_type", ARRAY, [1] * 299, INT32)), INVALID,
     "token_type"),
    ("scores longer than tokens", edit(retype("tokenizer.ggml.scores", ARRAY, [0.0] * 400, FLOAT32),
                                       tokenizer="llama", vocab=320), INVALID, "scores"),
    ("scores of the wrong type", edit(retype("tokenizer.ggml.scores", ARRAY, [0] * 320, UINT32),
                                      tokenizer="llama", vocab=320), INVALID, "scores"),
    ("tokens not strings", edit(retype("tokenizer.ggml.tokens", ARRAY, list(range(300)), INT32)), INVALID,
     "tokenizer.ggml.tokens"),
    ("merges not strings", edit(retype("tokenizer.ggml.merges", ARRAY, [1, 2], UINT32)), INVALID, "merges"),
    ("tokenizer model missing", edit(drop_kv("tokenizer.ggml.model")), INVALID, "tokenizer.ggml.model"),
    ("tokens missing", edit(drop_kv("tokenizer.ggml.tokens")), INVALID, "tokenizer.ggml.tokens"),
    ("duplicate tokens", edit(lambda g: g.set_kv("tokenizer.ggml.tokens", ARRAY,
                                       [*g.kv("tokenizer.ggml.tokens").value[:-1], "Ġt"], STRING)), INVALID, "repeats"),
    ("NUL inside a token", edit(lambda g: g.set_kv("tokenizer.ggml.tokens", ARRAY,
                                                   [*g.kv("tokenizer.ggml.tokens").value[:-1], "a\x00b"], STRING)),
     INVALID, "NUL"),
    ("byte token not spelled <0xXX>", edit(lambda g: g.set_kv("tokenizer.ggml.token_type", ARRAY,
                                                              [*g.kv("tokenizer.ggml.token_type").value[:-1], 6], INT32),
                                           tokenizer="llama", vocab=320), INVALID, "<0xXX>"),
    ("gpt2 vocabulary without merges", edit(drop_kv("tokenizer.ggml.merges")), INVALID, "merges"),
    ("token text of 5,001 characters", edit(lambda g: g.set_kv("tokenizer.ggml.tokens", ARRAY,
                                                             [*g.kv("tokenizer.ggml.tokens").value[:-1], "<s>" * 1667],
                                                             STRING)), INVALID, "5,001 characters long"),
    ("token_type as uint32", edit(retype("tokenizer.ggml.token_type", ARRAY, [1] * 300, UINT32)), INVALID,
     "type array[uint32]"),
    ("add_space_prefix as int8", edit(retype("tokenizer.ggml.add_space_prefix", 1, 1)), INVALID, "type int8"),
    ("chat template not a string", edit(retype("tokenizer.chat_template", UINT32, 7)), INVALID, "chat_template"),
    ("eos id past the vocabulary", edit(retype("tokenizer.ggml.eos_token_id", UINT32, 300)), INVALID,
     "eos_token_id"),
    ("bos id of the wrong type", edit(retype("tokenizer.ggml.bos_token_id", INT32, 1)), INVALID, "type int32"),
]


def _read(path) -> GGUFError:
    with pytest.raises(GGUFError) as info:
        read_plan(path)
    return info.value


@pytest.mark.parametrize("case_id,build,exit_code,fragment", CASES, ids=[c[0] for c in CASES])
def test_malformed_file_is_rejected_in_one_line(tmp_path, case_id, build, exit_code, fragment):
    data = build()
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        error = _read(path)
    finally:
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    message = str(error)
    assert error.exit_code == exit_code, message
    assert error.unsupported == (exit_code == UNSUPPORTED)
    assert "\n" not in message and message.isprintable(), message
    assert fragment in message, message
    assert error.field and error.field in message
    if error.offset is not None:
        assert f"at byte {error.offset}" in message and 0 <= error.offset <= len(data)
    assert "allowed:" in message and str(path) in message
    assert elapsed < 1.0, f"{case_id}: {elapsed:.2f} s"
    # what was allocated stays proportionate to the file (the metadata we built), never to its claims
    assert peak < 4 * len(data) + 2 * MiB, f"{case_id}: peak {peak} bytes for a {len(data)}-byte file"


def test_the_base_file_of_the_cases_is_valid(tmp_path):
    for kwargs in ({}, {"tokenizer": "llama", "vocab": 320}, {"n_layers": 2}):
        path = tmp_path / "ok.gguf"
        path.write_bytes(small(**kwargs).to_bytes())
        plan = read_plan(path)
        assert plan.config.n_layers == kwargs.get("n_layers", 1)


def test_truncation_message_gives_the_sizes(tmp_path):
    data = small().to_bytes()
    last = read_plan_from_bytes(data).tensors[-1]
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:-1000])
    message = str(_read(path))
    assert f"file truncated: need {last.offset + last.nbytes} bytes, have {len(data) - 1000}" in message
    assert "the download is probably incomplete" in message


def test_error_carries_field_offset_value_and_allowed(tmp_path):
    path = tmp_path / "align.gguf"
    g = small()
    g.kvs.append(kv("general.alignment", UINT32, 48))
    path.write_bytes(g.to_bytes())
    error = _read(path)
    assert error.field == "general.alignment" and error.value == 48
    assert "power of two" in error.allowed
    position = [off for label, off, _ in g.fields if label == "'general.alignment' value type"][0]
    assert error.offset == position


def test_unsupported_type_is_reported_only_after_structure_checks(tmp_path):
    """A corrupt file with an unsupported tensor type is reported as corrupt (exit 3), not as unsupported."""
    g = small()
    set_dims("blk.0.attn_q.weight", (32, 32), ggml_type=20)(g)  # IQ4_NL: unsupported
    g.truncate = 500
    path = tmp_path / "both.gguf"
    path.write_bytes(g.to_bytes())
    assert _read(path).exit_code == INVALID


def test_error_survives_pickling():
    import pickle

    error = GGUFError("llama.block_count", 280, 10**9, "a uint32 from 1 to 4096", unsupported=True, source="m.gguf")
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.exit_code == 4 and copy.offset == 280
