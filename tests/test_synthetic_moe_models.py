"""scripts/models/synthetic_models.py's mixtures of experts (Qwen3-30B-A3B, gpt-oss-20b): the real shapes' tensor
types as llama.cpp's quantizer and the published files have them, and the same shapes at a small size (few layers,
experts and rows) read back by our GGUF reader and run by the cpu backend for three greedy tokens."""

from __future__ import annotations

import collections
import math
from pathlib import Path

import numpy as np
import pytest
from support.engine_testing import load_tiny, solo_greedy
from test_synthetic_models import SMALL, write_tiktoken  # also puts scripts/models/ on sys.path

import synthetic_models as sm  # noqa: E402
from llama3_tokenizer import gguf_vocab  # noqa: E402
from tensor_types import tensor_type  # noqa: E402

from hipcore.gguf.file import GGUFFile  # noqa: E402

# 8 layers: use_more_bits picks 0, 3, 6 and 7; expert rows of 256 so that Q4_K/Q6_K's super-blocks fit
REDUCED = {
    "Qwen3-30B-A3B": ("Q4_K_M", dict(SMALL, head_size=64, experts=8, experts_used=2, expert_ffn=256)),
    "gpt-oss-20b": ("MXFP4_MOE", dict(SMALL, layers=4, head_size=64, experts=4, experts_used=2, expert_ffn=64)),
}


@pytest.fixture(scope="module")
def tiktoken_file(tmp_path_factory) -> Path:
    return write_tiktoken(tmp_path_factory.mktemp("tok") / "tokenizer.model")


def write_reduced_moe(folder: Path, tiktoken_file: Path, name: str) -> tuple[Path, sm.Shape]:
    file_type, sizes = REDUCED[name]
    shape = sm.reduced(sm.SHAPES[name], **sizes)
    path = folder / f"{name}.gguf"
    sm.write_model(path, shape, file_type, gguf_vocab(tiktoken_file), name="test", seed=11, log=None)
    return path, shape


def plan_bytes(plan) -> int:
    sizes = {"F32": (4, 1), "F16": (2, 1), **sm.BLOCKS}
    return sum(math.prod(dims) // sizes[q][1] * sizes[q][0] for _, dims, q in plan)


def test_the_real_shapes_have_the_published_files_tensor_types_and_sizes():
    """Qwen3-30B-A3B Q4_K_M (Qwen's file: 579 tensors, 241 F32, 289 Q4_K, 49 Q6_K, 18.6 GB) and gpt-oss-20b
    (ggml-org's file, type 38: 459 tensors, 289 F32, 98 Q8_0, 72 MXFP4, 12.1 GB), from the plan alone."""
    qwen = sm.tensor_plan(sm.SHAPES["Qwen3-30B-A3B"], "Q4_K_M")
    assert collections.Counter(q for _, _, q in qwen) == {"F32": 241, "Q4_K": 289, "Q6_K": 49}
    assert 18.5e9 < plan_bytes(qwen) < 18.6e9
    types = {name: q for name, _, q in qwen}
    # llama.cpp's Q4_K_M: ffn_down_exps (category ffn_down, layer from the name) and attn_v Q6_K in use_more_bits'
    # layers of 48; 128 experts, so the 8-expert rules (attn_k/attn_v Q8_0) stay out; routers never quantized
    more = [0, 1, 2, 3, 4, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35, 38, 41, 42, 43, 44, 45, 46, 47]
    assert [i for i in range(48) if types[f"blk.{i}.ffn_down_exps.weight"] == "Q6_K"] == more
    assert [i for i in range(48) if types[f"blk.{i}.attn_v.weight"] == "Q6_K"] == more
    assert {types["blk.4.ffn_gate_exps.weight"], types["blk.4.ffn_up_exps.weight"], types["blk.6.ffn_down_exps.weight"],
            types["blk.5.attn_k.weight"], types["token_embd.weight"]} == {"Q4_K"}
    assert (types["blk.0.ffn_gate_inp.weight"], types["output.weight"]) == ("F32", "Q6_K")
    oss = sm.tensor_plan(sm.SHAPES["gpt-oss-20b"], "MXFP4_MOE")
    assert collections.Counter(q for _, _, q in oss) == {"F32": 289, "Q8_0": 98, "MXFP4": 72}
    assert 12.0e9 < plan_bytes(oss) < 12.2e9
    dims = {name: d for name, d, _ in oss}
    assert dims["blk.0.ffn_down_exps.weight"] == (32, 2880, 2880) and dims["blk.0.attn_q.weight"] == (4096, 2880)
    assert dims["blk.0.ffn_up_exps.bias"] == (32, 2880) and dims["blk.0.attn_sinks.weight"] == (64,)
    assert tensor_type("blk.3.ffn_gate_inp.weight", "MXFP4_MOE", 24, False) == "F32"


def test_a_type_whose_blocks_do_not_fit_the_rows_is_refused_before_writing(tmp_path, tiktoken_file, capsys):
    """gpt-oss-20b's rows are 2,880 wide, no whole number of Q4_K's 256-value blocks: one line, exit 2, no file."""
    with pytest.raises(ValueError, match="token_embd.weight would be Q4_K, whose rows hold multiples of 256"):
        sm.tensor_plan(sm.SHAPES["gpt-oss-20b"], "Q4_K_M")
    out = tmp_path / "m.gguf"
    assert sm.main(["--shape", "gpt-oss-20b", "--type", "Q4_K_M", "-o", str(out), "--tokenizer-model",
                    str(tiktoken_file), "--layers", "1"]) == 2
    err = capsys.readouterr().err
    assert "error: gpt-oss-20b: Q4_K_M: token_embd.weight would be Q4_K" in err and not out.exists()


def test_reduced_qwen3moe_reads_back_with_its_expert_keys_and_types(tmp_path, tiktoken_file):
    path, shape = write_reduced_moe(tmp_path, tiktoken_file, "Qwen3-30B-A3B")
    with GGUFFile.open(path) as gguf:
        plan = gguf.plan
        cfg = plan.config
        assert (cfg.architecture, cfg.qk_norm, cfg.head_dim, cfg.q_size) == ("qwen3moe", True, 64, 256)
        assert (cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn_size) == (8, 2, 256)
        types = {t.name: t.type_name for t in plan.tensors}
        assert [i for i in range(8) if types[f"blk.{i}.ffn_down_exps.weight"] == "Q6_K"] == [0, 3, 6, 7]
        assert types["blk.1.ffn_down_exps.weight"] == "Q4_K" and types["blk.1.ffn_gate_inp.weight"] == "F32"
        assert plan.tensor("blk.2.ffn_up_exps.weight").shape == (8, 256, 256)
        for name in ("blk.0.ffn_down_exps.weight", "blk.1.ffn_gate_exps.weight", "blk.1.ffn_gate_inp.weight"):
            w = gguf.dequantize(name)
            assert np.isfinite(w).all() and 0.3 * sm.WEIGHT_STD < w.std() < 3 * sm.WEIGHT_STD, (name, w.std())


def test_reduced_gpt_oss_reads_back_with_mxfp4_experts_biases_sinks_and_yarn(tmp_path, tiktoken_file):
    path, shape = write_reduced_moe(tmp_path, tiktoken_file, "gpt-oss-20b")
    with GGUFFile.open(path) as gguf:
        plan = gguf.plan
        cfg = plan.config
        assert (cfg.architecture, cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn_size) == ("gpt-oss", 4, 2, 64)
        assert (cfg.rope_scaling, cfg.rope_scaling_factor, cfg.rope_original_context) == ("yarn", 32.0, 4096)
        assert (cfg.sliding_window, cfg.rope_theta, cfg.file_type) == (128, 150000.0, 38)
        types = {t.name: t.type_name for t in plan.tensors}
        assert {types["blk.3.ffn_down_exps.weight"], types["blk.0.ffn_gate_exps.weight"]} == {"MXFP4"}
        assert {types["blk.0.attn_q.weight"], types["token_embd.weight"], types["output.weight"]} == {"Q8_0"}
        assert {types["blk.0.ffn_up_exps.bias"], types["blk.0.attn_sinks.weight"], types["blk.0.ffn_gate_inp.weight"],
                types["blk.0.post_attention_norm.weight"]} == {"F32"}
        assert plan.tensor("blk.0.ffn_down_exps.bias").shape == (4, 256)
        w = gguf.dequantize("blk.1.ffn_up_exps.weight")  # the exponent byte puts MXFP4's values near WEIGHT_STD
        assert w.shape == (4, 64, 256) and 0.5 * sm.WEIGHT_STD < w.std() < 2 * sm.WEIGHT_STD, w.std()


@pytest.mark.parametrize("name", sorted(REDUCED))
def test_reduced_shape_generates_three_tokens_on_the_cpu_backend(tmp_path, tiktoken_file, name):
    path, shape = write_reduced_moe(tmp_path, tiktoken_file, name)
    with load_tiny(path, max_seqs=1, max_step_tokens=16, ctx_size=64) as model:
        tokens = solo_greedy(model, [260, 259, 32, 104, 101, 108], max_tokens=3)
    assert len(tokens) == 3 and all(0 <= t < shape.vocab for t in tokens), tokens
