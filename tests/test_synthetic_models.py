"""scripts/models/synthetic_models.py: random-weight GGUFs of real shapes, read back by our GGUF reader, run by the
cpu backend (finite logits), with llama.cpp's Q4_K_M type mix and a tiktoken-derived BPE vocabulary."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts" / "models"
sys.path.insert(0, str(SCRIPTS))

import synthetic_models as sm  # noqa: E402
from llama3_tokenizer import N_SPECIAL_TOKENS, gguf_vocab  # noqa: E402
from tensor_types import FILE_TYPES, tensor_type, use_more_bits  # noqa: E402

from hipcore.engine.loader import LoadOptions, load_model  # noqa: E402
from hipcore.gguf.file import GGUFFile  # noqa: E402
from hipcore.tokenizer.tokenizer import Tokenizer  # noqa: E402
from support.model_steps import step_batch  # noqa: E402

# A tiktoken file of the 256 bytes and four merged tokens; with the 256 special tokens: 516 entries.
MERGED = [b"he", b"ll", b"llo", b"hello"]
# 8 layers: use_more_bits picks 0 (first eighth), 7 (last eighth), 3 and 6 ((i - 1) % 3 == 2).
SMALL = dict(hidden=256, layers=8, heads=4, kv_heads=2, ffn=512, vocab=256 + len(MERGED) + N_SPECIAL_TOKENS)


def write_tiktoken(path: Path) -> Path:
    """The tiktoken file of the 256 bytes and MERGED at `path`."""
    tokens = [bytes([b]) for b in range(256)] + MERGED
    path.write_text("".join(f"{base64.b64encode(t).decode()} {rank}\n" for rank, t in enumerate(tokens)))
    return path


@pytest.fixture(scope="module")
def tiktoken_file(tmp_path_factory) -> Path:
    return write_tiktoken(tmp_path_factory.mktemp("tok") / "tokenizer.model")


def write_small(tmp_path: Path, tiktoken_file: Path, file_type: str, base: str) -> Path:
    shape = sm.reduced(sm.SHAPES[base], **SMALL)
    path = tmp_path / f"{base}-{file_type}.gguf"
    sm.write_model(path, shape, file_type, gguf_vocab(tiktoken_file), name="test", seed=3, log=None)
    return path


def write_reduced(tmp_path: Path, tiktoken_file: Path, base: str, seed: int, **sizes) -> Path:
    """A Q4_K_M file of `base` at SMALL's sizes (changed by `sizes`), named after the shape."""
    path = tmp_path / f"{base}.gguf"
    sm.write_model(path, sm.reduced(sm.SHAPES[base], **{**SMALL, **sizes}), "Q4_K_M", gguf_vocab(tiktoken_file),
                   name="test", seed=seed, log=None)
    return path


def first_step_logits(path: Path) -> np.ndarray:
    """The logits of one six-token prompt step of the model at `path` on the cpu backend."""
    loaded = load_model(str(path), LoadOptions(device="cpu", max_seqs=1, max_step_tokens=16, ctx_size=64,
                                               kv_dtype="f32"))
    try:
        return loaded.runner.execute(step_batch(loaded.cache, [(1, [260, 259, 32, 104, 101, 108], 0)]))
    finally:
        loaded.close()


def test_llama_cpp_q4_k_m_rule_on_the_real_8b_layer_count():
    """llama.cpp's Q4_K_M gives Llama-3.1-8B (32 layers) Q6_K attn_v/ffn_down in these 16 layers."""
    assert [i for i in range(32) if use_more_bits(i, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert tensor_type("blk.5.ffn_down.weight", "Q4_K_M", 32, False) == "Q4_K"
    assert tensor_type("blk.6.attn_v.weight", "Q4_K_M", 32, False) == "Q6_K"
    assert tensor_type("blk.6.attn_q.weight", "Q4_K_M", 32, False) == "Q4_K"
    assert tensor_type("token_embd.weight", "Q4_K_M", 32, False) == "Q4_K"
    assert tensor_type("token_embd.weight", "Q4_K_M", 16, True) == "Q6_K"  # tied: quantized as the output
    assert tensor_type("output.weight", "Q4_0", 32, False) == "Q6_K"
    assert tensor_type("output.weight", "Q8_0", 32, False) == "Q8_0"
    assert tensor_type("token_embd.weight", "F16", 16, True) == "F16"
    assert tensor_type("output.weight", "BF16", 32, False) == "BF16"


def test_vocab_from_tiktoken_ranks(tiktoken_file):
    vocab = gguf_vocab(tiktoken_file)
    assert len(vocab.tokens) == SMALL["vocab"] and vocab.bos_id == 260 and vocab.tokens[vocab.bos_id] == "<|begin_of_text|>"
    assert vocab.tokens[vocab.eos_id] == "<|eot_id|>" and vocab.token_types[vocab.eos_id] == 3
    assert vocab.tokens[ord("h")] == "h" and vocab.tokens[ord(" ")] == "Ġ"  # GPT-2's byte map
    # every way to split each merged token into two known tokens, ordered by the token's rank
    assert vocab.merges == ["h e", "l l", "ll o", "he llo"]  # "lo" and "hell" are no tokens


@pytest.mark.parametrize("file_type,base", [("Q4_K_M", "Llama-3.1-8B"), ("Q4_K_M", "Llama-3.2-1B"),
                                            ("Q8_0", "Llama-3.2-1B"), ("Q4_0", "Llama-3.1-8B"), ("F16", "Llama-3.2-3B"),
                                            ("Q5_0", "Llama-3.2-1B"), ("Q5_1", "Llama-3.1-8B"),
                                            ("BF16", "Llama-3.1-8B")])
def test_small_model_reads_back_and_runs_finite(tmp_path, tiktoken_file, file_type, base):
    path = write_small(tmp_path, tiktoken_file, file_type, base)
    shape = sm.reduced(sm.SHAPES[base], **SMALL)
    with GGUFFile.open(path) as gguf:
        plan = gguf.plan
        cfg = plan.config
        assert (cfg.hidden_size, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_size, cfg.vocab_size) == \
               (256, 8, 4, 2, 512, SMALL["vocab"])
        assert cfg.rope_theta == 500000.0 and cfg.tie_embeddings == shape.tied and cfg.context_length == 131072
        assert cfg.file_type == FILE_TYPES[file_type]
        types = {t.name: t.type_name for t in plan.tensors}
        for name, dims in sm.tensor_shapes(shape):
            assert plan.tensor(name).shape == dims
            expected = "F32" if len(dims) == 1 else tensor_type(name, file_type, 8, shape.tied)
            assert types[name] == expected, name
        if file_type == "Q4_K_M":
            assert [i for i in range(8) if types[f"blk.{i}.ffn_down.weight"] == "Q6_K"] == [0, 3, 6, 7]
            assert [i for i in range(8) if types[f"blk.{i}.attn_v.weight"] == "Q6_K"] == [0, 3, 6, 7]
        # small finite weights: the scale fields keep every decoded weight near WEIGHT_STD
        for name in ("blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.1.ffn_down.weight"):
            w = gguf.dequantize(name)
            assert np.isfinite(w).all() and 0.3 * sm.WEIGHT_STD < w.std() < 3 * sm.WEIGHT_STD, (name, w.std())
        tok = Tokenizer.from_metadata(gguf.metadata)
        assert 259 in tok.encode("hello")  # the merged token "hello" (rank 259)
    logits = first_step_logits(path)
    assert logits.shape == (1, SMALL["vocab"]) and np.isfinite(logits).all()
    assert 0.01 < logits.std() < 100, logits.std()


def test_small_qwen2_model_carries_biases_and_a_padded_vocabulary_and_runs_finite(tmp_path, tiktoken_file):
    """The Qwen2.5-7B shape at a small size: the qwen2 architecture, q/k/v biases, no rope_freqs, RoPE theta
    1e6, and embedding rows past the tokenizer written as unused tokens (as Qwen2.5's files pad theirs)."""
    vocab_rows = SMALL["vocab"] + 28
    path = write_reduced(tmp_path, tiktoken_file, "Qwen2.5-7B", 3, vocab=vocab_rows)
    with GGUFFile.open(path) as gguf:
        plan = gguf.plan
        cfg = plan.config
        assert (cfg.architecture, cfg.qkv_bias, cfg.rope_type, cfg.rope_theta) == ("qwen2", True, "neox", 1e6)
        assert cfg.rms_norm_eps == pytest.approx(1e-6)  # a float32 in the file
        assert (cfg.vocab_size, cfg.context_length, cfg.tie_embeddings) == (vocab_rows, 32768, False)
        names = {t.name for t in plan.tensors}
        assert "rope_freqs.weight" not in names and {"blk.7.attn_q.bias", "blk.7.attn_k.bias", "blk.7.attn_v.bias"} <= names
        assert plan.tensor("blk.0.attn_k.bias").shape == (2 * 64,)
        tokens, types = gguf.metadata["tokenizer.ggml.tokens"], gguf.metadata["tokenizer.ggml.token_type"]
        assert len(tokens) == vocab_rows and list(types[-28:]) == [sm.TOKEN_TYPE_UNUSED] * 28
        assert Tokenizer.from_metadata(gguf.metadata).encode("hello")[-1] == 259  # after the BOS
    logits = first_step_logits(path)
    assert logits.shape == (1, vocab_rows) and np.isfinite(logits).all() and 0.01 < logits.std() < 100


def test_small_phi3_model_holds_the_fused_tensors_with_llama_cpps_types_and_runs_finite(tmp_path, tiktoken_file):
    """The Phi-3-mini shape at a small size: the phi3 architecture, q|k|v and gate|up each one tensor (attn_qkv of
    q + 2 kv rows, ffn_up of 2 ffn rows; no attn_q/k/v or ffn_gate), attn_qkv in Q5_K as llama.cpp's Q4_K_M mix puts
    it, and a forward pass on the cpu backend with finite logits."""
    path = write_reduced(tmp_path, tiktoken_file, "Phi-3-mini", 4, kv_heads=4)
    with GGUFFile.open(path) as gguf:
        plan = gguf.plan
        cfg = plan.config
        assert (cfg.architecture, cfg.rope_type, cfg.rope_theta, cfg.context_length) == ("phi3", "neox", 1e4, 4096)
        names = {t.name for t in plan.tensors}
        assert {"blk.0.attn_qkv.weight", "blk.0.ffn_up.weight"} <= names
        assert not {"blk.0.attn_q.weight", "blk.0.ffn_gate.weight", "rope_freqs.weight"} & names
        assert plan.tensor("blk.3.attn_qkv.weight").shape == (256 + 2 * 4 * 64, 256)
        assert plan.tensor("blk.3.ffn_up.weight").shape == (2 * 512, 256)
        assert plan.tensor("blk.3.attn_qkv.weight").type_name == "Q5_K"
        assert plan.tensor("blk.3.ffn_down.weight").type_name == "Q6_K"  # use_more_bits(3, 8)
        assert plan.tensor("blk.4.ffn_down.weight").type_name == "Q4_K"
    logits = first_step_logits(path)
    assert logits.shape == (1, SMALL["vocab"]) and np.isfinite(logits).all() and 0.01 < logits.std() < 100


def test_no_synthetic_name_asks_llama_cpp_for_phi3s_tokens():
    """llama.cpp's vocabulary loader looks up Phi-3's own special tokens when general.name holds "phi-3" or "phi3"
    (lower-cased), which Llama 3's tokenizer lacks: no shape's file may be named so."""
    for shape in sm.SHAPES:
        for file_type in FILE_TYPES:
            name = sm.model_name(shape, file_type).lower()
            assert "phi-3" not in name and "phi3" not in name, name
            assert shape.replace("-", " ").lower().split()[0] in name


def test_a_tokenizer_larger_than_the_shape_is_refused():
    vocab = sm.GgufVocab(tokens=["a", "b", "c"], token_types=[1, 1, 1], merges=[], bos_id=0, eos_id=1, chat_template="")
    assert sm.padded(vocab, 3) is vocab and len(sm.padded(vocab, 5).tokens) == 5
    with pytest.raises(ValueError, match="has 3 tokens; the shape has 2"):
        sm.padded(vocab, 2)


def test_same_seed_same_file(tmp_path, tiktoken_file):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = write_small(tmp_path / "a", tiktoken_file, "Q4_0", "Llama-3.2-1B")
    b = write_small(tmp_path / "b", tiktoken_file, "Q4_0", "Llama-3.2-1B")
    assert a.read_bytes() == b.read_bytes()


def test_random_blocks_refuse_rows_that_are_not_whole_blocks():
    with pytest.raises(ValueError, match="multiple of 256"):
        sm.random_blocks(np.random.default_rng(0), "Q4_K", 2, 300)


def test_command_refuses_a_wrong_tokenizer_file_in_one_line(tmp_path, tiktoken_file, capsys):
    out = tmp_path / "m.gguf"
    assert sm.main(["--shape", "Llama-3.2-1B", "--type", "Q4_0", "-o", str(out), "--tokenizer-model", str(tiktoken_file)]) == 2
    assert "gives 516 tokens with the special ones; Llama-3.2-1B has 128256" in capsys.readouterr().err
    bad = tmp_path / "bad.model"
    bad.write_text("not base64 at all\n")
    assert sm.main(["--shape", "Llama-3.2-1B", "--type", "Q4_0", "-o", str(out), "--tokenizer-model", str(bad)]) == 2
    assert "not a tiktoken tokenizer file" in capsys.readouterr().err and not out.exists()


def test_small_qwen3_model_carries_head_norms_and_wide_heads_and_runs_finite(tmp_path, tiktoken_file):
    """The Qwen3-4B shape at a small size: the qwen3 architecture, an RMSNorm weight of head_dim for q's and for k's
    heads, heads wider than hidden / heads (4 x 128 on 256: q is 512 wide, o reads 512), tied embeddings, RoPE
    theta 1e6, NEOX RoPE, and a forward pass on the cpu backend with finite logits."""
    vocab_rows = SMALL["vocab"] + 12
    path = write_reduced(tmp_path, tiktoken_file, "Qwen3-4B", 5, vocab=vocab_rows)
    with GGUFFile.open(path) as gguf:
        plan = gguf.plan
        cfg = plan.config
        assert (cfg.architecture, cfg.qk_norm, cfg.rope_type, cfg.rope_theta) == ("qwen3", True, "neox", 1e6)
        assert (cfg.head_dim, cfg.q_size, cfg.tie_embeddings, cfg.vocab_size) == (128, 512, True, vocab_rows)
        assert plan.tensor("blk.0.attn_q.weight").shape == (512, 256)
        assert plan.tensor("blk.0.attn_output.weight").shape == (256, 512)
        assert plan.tensor("blk.0.attn_q_norm.weight").shape == (128,) == plan.tensor("blk.7.attn_k_norm.weight").shape
        assert "output.weight" not in {t.name for t in plan.tensors}
    logits = first_step_logits(path)
    assert logits.shape == (1, vocab_rows) and np.isfinite(logits).all() and 0.01 < logits.std() < 100


def test_small_gemma3_model_carries_post_norms_and_a_window_and_runs_finite(tmp_path, tiktoken_file):
    """The Gemma-3-4B shape at a small size: the gemma3 architecture, per-head norms on heads of 256, the norms after
    attention and after the feed-forward, a sliding window, tied embeddings, and finite logits on the cpu backend."""
    vocab_rows = SMALL["vocab"] + 20
    path = write_reduced(tmp_path, tiktoken_file, "Gemma-3-4B", 7, vocab=vocab_rows)
    with GGUFFile.open(path) as gguf:
        plan = gguf.plan
        cfg = plan.config
        assert (cfg.architecture, cfg.qk_norm, cfg.post_norms, cfg.activation) == ("gemma3", True, True, "gelu")
        assert (cfg.head_dim, cfg.q_size, cfg.sliding_window, cfg.tie_embeddings) == (256, 1024, 1024, True)
        names = {t.name for t in plan.tensors}
        assert {"blk.7.post_attention_norm.weight", "blk.7.post_ffw_norm.weight", "blk.0.attn_q_norm.weight"} <= names
    logits = first_step_logits(path)
    assert logits.shape == (1, vocab_rows) and np.isfinite(logits).all() and 0.01 < logits.std() < 100


def test_small_gemma2_model_carries_its_soft_caps_and_a_window_and_runs_finite(tmp_path, tiktoken_file):
    """The Gemma-2-9B shape at a small size: the gemma2 architecture, heads of 256 without per-head norms, the norms
    after attention and after the feed-forward, both soft caps, a sliding window, tied embeddings, and finite logits
    (each at most the final cap) on the cpu backend."""
    vocab_rows = SMALL["vocab"] + 20
    path = write_reduced(tmp_path, tiktoken_file, "Gemma-2-9B", 9, vocab=vocab_rows)
    with GGUFFile.open(path) as gguf:
        cfg = gguf.plan.config
        assert (cfg.architecture, cfg.qk_norm, cfg.post_norms, cfg.activation) == ("gemma2", False, True, "gelu")
        assert (cfg.head_dim, cfg.sliding_window, cfg.tie_embeddings) == (256, 4096, True)
        assert (cfg.attn_softcap, cfg.final_softcap) == (50.0, 30.0)
    logits = first_step_logits(path)
    assert logits.shape == (1, vocab_rows) and np.isfinite(logits).all() and 0.01 < logits.std() < 100
    assert np.abs(logits).max() <= 30.0

