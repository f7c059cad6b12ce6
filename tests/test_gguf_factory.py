"""The test-file factory other tests stand on: the raw builder reproduces gguf.GGUFWriter byte for
byte, the vocabularies are usable tokenizers, and the random weights keep activations near unit size."""

from __future__ import annotations

import numpy as np
import pytest

from support.gguf_factory import Meta, raw_tiny_llama, tiny_llama_spec, write_tiny_llama
from support.gguf_raw import INT32, UINT32
from support.gguf_vocab import bytes_to_unicode, gpt2_vocab, llama_vocab
from hipcore.gguf.file import read_plan


@pytest.mark.parametrize("kwargs", [
    dict(), dict(tokenizer="llama", tied=False), dict(tokenizer=None, tensor_type="Q4_0"),
    dict(tensor_type="Q6_K", hidden=256, ffn=256, n_layers=1), dict(alignment=128, tensor_type="BF16"),
])
def test_raw_builder_writes_the_same_bytes_as_gguf_writer(tmp_path, kwargs):
    path = write_tiny_llama(tmp_path / "m.gguf", **kwargs)
    assert raw_tiny_llama(**kwargs).to_bytes() == path.read_bytes()


def test_same_seed_same_file_other_seed_other_weights(tmp_path):
    a = write_tiny_llama(tmp_path / "a.gguf", seed=1).read_bytes()
    b = write_tiny_llama(tmp_path / "b.gguf", seed=1).read_bytes()
    c = write_tiny_llama(tmp_path / "c.gguf", seed=2).read_bytes()
    assert a == b and a != c and len(a) == len(c)


def test_gpt2_vocabulary_is_a_closed_bpe():
    tokens, types, merges = gpt2_vocab(400)
    assert len(tokens) == len(types) == 400 and len(set(tokens)) == 400
    byte_chars = set(bytes_to_unicode().values())
    assert len(byte_chars) == 256 and byte_chars <= set(tokens)    # every byte is reachable
    index = {t: i for i, t in enumerate(tokens)}
    for rank, merge in enumerate(merges):
        left, right = merge.split(" ")
        assert left in index and right in index                     # both parts exist ...
        assert index[left + right] == 259 + rank                    # ... and the merge made the next token
    assert tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] and types[:3] == [3, 3, 3]
    assert gpt2_vocab(400) == (tokens, types, merges)               # deterministic


def test_llama_vocabulary_has_specials_bytes_and_scored_pieces():
    tokens, scores, types = llama_vocab(360)
    assert tokens[:3] == ["<unk>", "<s>", "</s>"] and types[:3] == [2, 3, 3]
    assert tokens[3:259] == [f"<0x{b:02X}>" for b in range(256)] and set(types[3:259]) == {6}
    pieces = tokens[259:]
    assert "\u2581" in pieces and len(set(tokens)) == 360
    merged = [i for i, s in enumerate(scores) if -1e4 < s < 0]
    assert merged and all(scores[a] > scores[b] for a, b in zip(merged, merged[1:]))  # earlier merges win
    for i in merged:  # every merged piece can be built from two shorter pieces of the vocabulary
        text = tokens[i]
        assert any(text[:k] in tokens and text[k:] in tokens for k in range(1, len(text)))


@pytest.mark.parametrize("builder,size", [(gpt2_vocab, 200), (llama_vocab, 300)])
def test_vocabulary_too_small_is_refused(builder, size):
    with pytest.raises(ValueError, match="needs at least"):
        builder(size)


def test_weights_keep_activations_near_unit_size():
    spec = tiny_llama_spec(hidden=256, ffn=512, n_heads=8, n_kv_heads=4, n_layers=2, vocab=400)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 256)).astype(np.float32)           # an RMS-normalized activation
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_up.weight", "blk.1.attn_k.weight"):
        y = x @ spec.tensor(name).values.T
        assert 0.7 < y.std() < 1.3, name
    logits = x @ spec.tensor("token_embd.weight").values.T          # tied output
    assert 0.7 < logits.std() < 1.3
    norm = spec.tensor("blk.0.attn_norm.weight").values
    assert abs(float(norm.mean()) - 1.0) < 0.05


def test_k_quants_need_rows_of_256():
    with pytest.raises(ValueError, match="multiples of 256"):
        tiny_llama_spec(tensor_type="Q4_K")


def test_extra_metadata_adds_overrides_and_removes(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf", extra_metadata={
        "general.name": "renamed", "general.flag": True, "general.ratio": 0.5, "general.tags": ["a", "b"],
        "general.counts": [1, 2, 3], "general.offset": -3, "tokenizer.chat_template": None,
        "general.explicit": Meta("general.explicit", UINT32, 7)})
    plan = read_plan(path)
    m, t = plan.metadata, plan.metadata_types
    assert m["general.name"] == "renamed" and m["general.flag"] is True and m["general.ratio"] == 0.5
    assert m["general.tags"] == ("a", "b") and t["general.tags"] == "array[string]"
    assert m["general.counts"] == (1, 2, 3) and t["general.counts"] == "array[int32]"
    assert m["general.offset"] == -3 and t["general.offset"] == "int32"
    assert "tokenizer.chat_template" not in m and m["general.explicit"] == 7


def test_quantized_spec_keeps_the_originals_and_the_bytes():
    spec = tiny_llama_spec(tensor_type="Q8_0", embedding_type="Q4_1")
    embd, q = spec.tensor("token_embd.weight"), spec.tensor("blk.0.attn_q.weight")
    assert embd.type_name == "Q4_1" and q.type_name == "Q8_0"
    assert spec.tensor("blk.0.attn_norm.weight").type_name == "F32"  # 1-D tensors stay F32
    assert q.data.dtype == np.uint8 and q.data.nbytes == 64 * 64 // 32 * 34
    assert q.values.dtype == np.float32 and q.shape == (64, 64)
    assert spec.metadata[2] == Meta("general.file_type", UINT32, 7)
    assert any(m.key == "tokenizer.ggml.token_type" and m.element_type == INT32 for m in spec.metadata)
