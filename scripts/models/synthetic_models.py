"""Random-weight GGUFs of real model shapes, for speed comparisons anyone can reproduce.

    python scripts/models/synthetic_models.py --shape Llama-3.1-8B --type Q4_K_M -o llama-3.1-8b-q4_k_m.gguf

Shapes are the published ones (hidden size, layers, heads, KV heads, FFN size, vocabulary 128,256, RoPE
theta 500,000, the Llama 3.1-style RoPE factors as the real files carry them in rope_freqs.weight, tied
embeddings for 1B and 3B; Qwen2.5-7B: the qwen2 architecture with q/k/v biases, RoPE theta 1,000,000, no
RoPE scaling, a vocabulary of 152,064 whose rows past Llama 3's tokenizer are unused tokens, as the real
file pads its own; Qwen3-8B and Qwen3-4B: the qwen3 architecture, an RMSNorm weight per head for q and for k, heads
of 128 (Qwen3-4B's q is 4,096 wide on a 2,560-wide model), RoPE theta 1,000,000, a vocabulary of 151,936 padded the
same way, Qwen3-4B's embeddings tied; Gemma-3-4B: the gemma3 architecture (Qwen3's per-head norms, a norm after
attention and after the feed-forward, GeGLU, a window of 1,024 on five layers of six), heads of 256, a vocabulary
of 262,144 padded the same way, tied embeddings, no RoPE scaling (the real file's linear factor 8 on its global
layers is left out); Gemma-2-9B and Gemma-2-2B: the gemma2 architecture (Gemma 3's layer without the per-head
norms, RoPE theta 10,000, a window of 4,096 on every other layer, attention scores capped at 50 and the logits at
30), heads of 256, a vocabulary of 256,000 padded the same way, tied embeddings; Phi-3-mini: the phi3 architecture, q|k|v and gate|up each one tensor as Phi-3's files hold
them, 32 KV heads of 96, RoPE theta 10,000, a 4,096 context, and Llama 3's vocabulary, not Phi-3's 32,064, since
the tokenizer is Llama 3's: its head is four times Phi-3's); the mixtures of experts (moe_layers.py): Qwen3-30B-A3B
(qwen3moe: Qwen3's attention, 32 heads of 128 and 4 KV heads on 2,048, 48 layers, 128 experts of 768 rows, 8 used,
a vocabulary of 151,936, RoPE theta 1,000,000; write it as Q4_K_M) and gpt-oss-20b (gpt-oss: 64 heads of 64 and 8 KV
heads on 2,880, 24 layers, 32 experts of 2,880 rows, 4 used, biases, sinks, a window of 128 on the even layers, YaRN
factor 32 over 4,096, a vocabulary of 201,088; write it as MXFP4_MOE, the published ggml-org file's types: MXFP4
experts, Q8_0 attention, embeddings and head, F32 routers). Types: F16, BF16, Q8_0, Q5_1, Q5_0, Q4_0, Q4_K_M and
MXFP4_MOE with llama.cpp's mix of tensor types (tensor_types.py). The tokenizer is Llama 3's own
(llama3_tokenizer.py), so llama.cpp loads the files as it loads the real ones. Quantized blocks are random bytes
with their scale fields overwritten by small finite values, so a forward pass stays finite and the file is written
at disk speed. Needs numpy and gguf only; the same seed gives the same file.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama3_tokenizer import GgufVocab, find_llama3_tokenizer_model, gguf_vocab  # noqa: E402
from moe_layers import add_moe_keys, moe_layer_tensors, mxfp4_blocks, random_bytes  # noqa: E402
from tensor_types import FILE_TYPES, tensor_type  # noqa: E402


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    tied: bool
    rope_factor: float  # Llama 3.1-style scaling: factor, low/high frequency factors 1 and 4, 8,192 original
    context: int = 131072
    vocab: int = 128256
    rope_theta: float = 500000.0
    arch: str = "llama"
    qkv_bias: bool = False  # qwen2: a bias on each of the q, k and v products
    rms_eps: float = 1e-5
    fused: bool = False  # phi3: attn_qkv (q, k, v rows) and ffn_up (gate rows, then up rows), no attn_q/k/v, ffn_gate
    qk_norm: bool = False  # qwen3: attn_q_norm and attn_k_norm, an RMSNorm weight of head_dim for every head
    head_size: int = 0  # 0: hidden // heads (Qwen3-4B's heads are wider: 32 x 128 on 2,560)
    post_norms: bool = False  # gemma3: post_attention_norm and post_ffw_norm
    sliding_window: int = 0  # gemma3, gemma2: attention.sliding_window (its local layers' window)
    attn_softcap: float = 0.0  # gemma2: attn_logit_softcapping (attention scores capped at c tanh(s / c))
    final_softcap: float = 0.0  # gemma2: final_logit_softcapping (the logits capped the same way)
    experts: int = 0  # qwen3moe, gpt-oss: experts per layer (0: a dense feed-forward of ffn rows)
    experts_used: int = 0  # experts each token is routed to
    expert_ffn: int = 0  # rows of each expert's gate and up
    oss: bool = False  # gpt-oss: q/k/v/o, router and expert biases, attn_sinks, post_attention_norm
    yarn_factor: float = 0.0  # gpt-oss: YaRN RoPE scaling's factor and original context
    yarn_original_context: int = 0

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim


GEMMA2_9B = Shape(hidden=3584, layers=42, heads=16, kv_heads=8, ffn=14336, tied=True, rope_factor=0.0, context=8192,
                  vocab=256000, rope_theta=10000.0, arch="gemma2", rms_eps=1e-6, head_size=256, post_norms=True,
                  sliding_window=4096, attn_softcap=50.0, final_softcap=30.0)
SHAPES = {
    "Llama-3.2-1B": Shape(hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, tied=True, rope_factor=32.0),
    "Llama-3.2-3B": Shape(hidden=3072, layers=28, heads=24, kv_heads=8, ffn=8192, tied=True, rope_factor=32.0),
    "Llama-3.1-8B": Shape(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, tied=False, rope_factor=8.0),
    "Qwen2.5-7B": Shape(hidden=3584, layers=28, heads=28, kv_heads=4, ffn=18944, tied=False, rope_factor=0.0,
                        context=32768, vocab=152064, rope_theta=1000000.0, arch="qwen2", qkv_bias=True, rms_eps=1e-6),
    "Qwen3-8B": Shape(hidden=4096, layers=36, heads=32, kv_heads=8, ffn=12288, tied=False, rope_factor=0.0,
                      context=40960, vocab=151936, rope_theta=1000000.0, arch="qwen3", rms_eps=1e-6, qk_norm=True),
    "Qwen3-4B": Shape(hidden=2560, layers=36, heads=32, kv_heads=8, ffn=9728, tied=True, rope_factor=0.0,
                      context=40960, vocab=151936, rope_theta=1000000.0, arch="qwen3", rms_eps=1e-6, qk_norm=True,
                      head_size=128),
    "Gemma-3-4B": Shape(hidden=2560, layers=34, heads=8, kv_heads=4, ffn=10240, tied=True, rope_factor=0.0,
                        vocab=262144, rope_theta=1000000.0, arch="gemma3", rms_eps=1e-6, qk_norm=True, head_size=256,
                        post_norms=True, sliding_window=1024),
    "Gemma-2-9B": GEMMA2_9B,
    "Gemma-2-2B": replace(GEMMA2_9B, hidden=2304, layers=26, heads=8, kv_heads=4, ffn=9216),
    "Phi-3-mini": Shape(hidden=3072, layers=32, heads=32, kv_heads=32, ffn=8192, tied=False, rope_factor=0.0,
                        context=4096, rope_theta=10000.0, arch="phi3", fused=True),
    # feed_forward_length as the published files carry it (llama.cpp's qwen3moe and gpt-oss read the experts' own)
    "Qwen3-30B-A3B": Shape(hidden=2048, layers=48, heads=32, kv_heads=4, ffn=6144, tied=False, rope_factor=0.0,
                           context=40960, vocab=151936, rope_theta=1000000.0, arch="qwen3moe", rms_eps=1e-6,
                           qk_norm=True, head_size=128, experts=128, experts_used=8, expert_ffn=768),
    "gpt-oss-20b": Shape(hidden=2880, layers=24, heads=64, kv_heads=8, ffn=2880, tied=False, rope_factor=0.0,
                         vocab=201088, rope_theta=150000.0, arch="gpt-oss", head_size=64, sliding_window=128,
                         experts=32, experts_used=4, expert_ffn=2880, oss=True, yarn_factor=32.0,
                         yarn_original_context=4096),
}
TOKEN_TYPE_UNUSED = 5  # llama.cpp's LLAMA_TOKEN_TYPE_UNUSED: the padding rows of a vocabulary

# Bytes and elements of one block, and where its f16 scale(s) sit.
BLOCKS = {"BF16": (2, 1), "Q4_0": (18, 32), "Q5_0": (22, 32), "Q5_1": (24, 32), "Q8_0": (34, 32), "Q4_K": (144, 256),
          "Q5_K": (176, 256), "Q6_K": (210, 256), "MXFP4": (17, 32)}
WEIGHT_STD = 0.02  # the size of a trained model's weights; activations stay O(1) through the layers


def rope_factors(shape: Shape) -> np.ndarray:
    """Per-frequency divisors of Llama 3.1's RoPE scaling (what llama.cpp's converter writes to rope_freqs)."""
    low, high, original = 1.0, 4.0, 8192
    freqs = 1.0 / shape.rope_theta ** (np.arange(0, shape.head_dim, 2, dtype=np.float64) / shape.head_dim)
    wavelen = 2 * math.pi / freqs
    smooth = (original / wavelen - low) / (high - low)
    factors = np.where(wavelen < original / high, 1.0,
                       np.where(wavelen > original / low, shape.rope_factor, 1.0 / ((1 - smooth) / shape.rope_factor + smooth)))
    return factors.astype(np.float32)


def _f16_bytes(value: float) -> np.ndarray:
    return np.array([value], np.float16).view(np.uint8)


def random_blocks(rng: np.random.Generator, qtype: str, rows: int, cols: int, *, fast: bool = False) -> np.ndarray:
    """(rows, cols // block_elems * block_bytes) uint8 of random blocks whose decoded weights have a
    standard deviation near WEIGHT_STD (scale fields set, quants random). fast: the bytes from the generator's raw
    words (the expert tensors, most of a mixture of experts' bytes; the dense shapes' files stay as they were)."""
    size, elems = BLOCKS[qtype]
    if cols % elems:
        raise ValueError(f"{qtype} rows must be a multiple of {elems} values, got {cols}")
    n = rows * cols // elems
    if fast:
        blocks = random_bytes(rng, n * size).reshape(n, size)
    else:
        blocks = np.frombuffer(rng.bytes(n * size), np.uint8).reshape(n, size).copy()
    if qtype == "MXFP4":
        mxfp4_blocks(blocks)
    elif qtype == "Q4_0":  # w = d * (q - 8), q in 0..15: sd(q) = 4.6
        blocks[:, 0:2] = _f16_bytes(WEIGHT_STD / 4.6)
    elif qtype == "Q5_0":  # w = d * (q - 16), q in 0..31: sd(q) = 9.2
        blocks[:, 0:2] = _f16_bytes(WEIGHT_STD / 9.2)
    elif qtype == "Q5_1":  # w = d * q + m, q in 0..31 (mean 15.5, sd 9.2): m = -15.5 d centres the mean
        blocks[:, 0:2] = _f16_bytes(WEIGHT_STD / 9.2)
        blocks[:, 2:4] = _f16_bytes(-15.5 * WEIGHT_STD / 9.2)
    elif qtype == "Q8_0":  # w = d * q, q int8: sd = 74
        blocks[:, 0:2] = _f16_bytes(WEIGHT_STD / 74)
    elif qtype == "Q4_K":  # w = d * sc * q - dmin * m; sc, m 6-bit (mean 31.5), q 0..15 (mean 7.5)
        d = WEIGHT_STD / 200  # sd over blocks ~ 7.5 * d * sd(sc - m) ~ 193 d; dmin = 7.5 d centres the mean
        blocks[:, 0:2] = _f16_bytes(d)
        blocks[:, 2:4] = _f16_bytes(7.5 * d)
    elif qtype == "Q5_K":  # Q4_K's form with q 0..31 (mean 15.5, sd 9.2): ~500 d over blocks; dmin = 15.5 d
        d = WEIGHT_STD / 500
        blocks[:, 0:2] = _f16_bytes(d)
        blocks[:, 2:4] = _f16_bytes(15.5 * d)
    elif qtype == "Q6_K":  # w = d * sc * (q - 32), q 0..63 (sd 18.5); scales int8, kept in -16..15 (sd 9.2)
        blocks[:, 192:208] = ((blocks[:, 192:208] & 0x1F).astype(np.int16) - 16).astype(np.int8).view(np.uint8)
        blocks[:, 208:210] = _f16_bytes(WEIGHT_STD / (9.2 * 18.5))
    return blocks.reshape(rows, -1)


def tensor_shapes(shape: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """(name, (rows, cols)) in the order llama.cpp's converter writes them; 1-D for norms, biases and
    rope_freqs."""
    h, kv, q = shape.hidden, shape.kv_heads * shape.head_dim, shape.q_size
    out = [("rope_freqs.weight", (shape.head_dim // 2,))] if shape.rope_factor else []
    out.append(("token_embd.weight", (shape.vocab, h)))
    for i in range(shape.layers):
        if shape.experts:
            out += moe_layer_tensors(shape, i)
            continue
        if shape.fused:  # as llama.cpp's converter writes Phi-3's layers
            out += [(f"blk.{i}.attn_norm.weight", (h,)), (f"blk.{i}.attn_qkv.weight", (q + 2 * kv, h)),
                    (f"blk.{i}.attn_output.weight", (h, q)), (f"blk.{i}.ffn_norm.weight", (h,)),
                    (f"blk.{i}.ffn_up.weight", (2 * shape.ffn, h)), (f"blk.{i}.ffn_down.weight", (h, shape.ffn))]
            continue
        out += [(f"blk.{i}.attn_norm.weight", (h,)), (f"blk.{i}.ffn_down.weight", (h, shape.ffn)),
                (f"blk.{i}.ffn_gate.weight", (shape.ffn, h)), (f"blk.{i}.ffn_up.weight", (shape.ffn, h)),
                (f"blk.{i}.ffn_norm.weight", (h,)), (f"blk.{i}.attn_k.weight", (kv, h)),
                (f"blk.{i}.attn_output.weight", (h, q)), (f"blk.{i}.attn_q.weight", (q, h)),
                (f"blk.{i}.attn_v.weight", (kv, h))]
        if shape.qkv_bias:
            out += [(f"blk.{i}.attn_q.bias", (q,)), (f"blk.{i}.attn_k.bias", (kv,)), (f"blk.{i}.attn_v.bias", (kv,))]
        if shape.qk_norm:
            out += [(f"blk.{i}.attn_k_norm.weight", (shape.head_dim,)), (f"blk.{i}.attn_q_norm.weight", (shape.head_dim,))]
        if shape.post_norms:
            out += [(f"blk.{i}.post_attention_norm.weight", (h,)), (f"blk.{i}.post_ffw_norm.weight", (h,))]
    out.append(("output_norm.weight", (h,)))
    if not shape.tied:
        out.append(("output.weight", (shape.vocab, h)))
    return out


def tensor_data(rng: np.random.Generator, name: str, dims: tuple[int, ...], qtype: str, shape: Shape) -> np.ndarray:
    if name == "rope_freqs.weight":
        return rope_factors(shape)
    if name.endswith(".bias"):  # small, as trained biases are next to O(1) activations (experts': [experts, rows])
        return (0.1 * rng.standard_normal(dims, np.float32)).astype(np.float32)
    if len(dims) == 1:  # norms: ones with a little noise, as trained norms sit near 1 (gpt-oss's sink logits too)
        return (1.0 + 0.05 * rng.standard_normal(dims[0], np.float32)).astype(np.float32)
    if len(dims) == 3:  # experts: [experts, rows, cols], made as one matrix of experts * rows rows
        experts, rows, cols = dims
        return tensor_data(rng, name, (experts * rows, cols), qtype, shape).reshape(experts, rows, -1)
    rows, cols = dims
    fast = shape.experts > 0  # the mixtures of experts' files are new: every tensor from the fast path
    if qtype == "F32":  # routers (ffn_gate_inp): logits of a few tenths over O(1) inputs, so routing varies
        return (WEIGHT_STD * rng.standard_normal((rows, cols), np.float32)).astype(np.float32)
    if qtype == "F16":
        return (WEIGHT_STD * rng.standard_normal((rows, cols), np.float32)).astype(np.float16)
    if qtype == "BF16":  # the top halves of float32 values, rounded to nearest even
        bits = (WEIGHT_STD * rng.standard_normal((rows, cols), np.float32)).view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).view(np.uint8)
    return random_blocks(rng, qtype, rows, cols, fast=fast)


def write_model(path: Path, shape: Shape, file_type: str, vocab: GgufVocab, *, name: str, seed: int = 0,
                log=print) -> None:
    import gguf  # the writer only where a file is written (the tests import the rest without it)

    vocab = padded(vocab, shape.vocab)
    plan = tensor_plan(shape, file_type)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), shape.arch)
    w.add_name(name)
    w.add_file_type(FILE_TYPES[file_type])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_vocab_size(shape.vocab)
    if shape.sliding_window:
        w.add_sliding_window(shape.sliding_window)
    if shape.experts:
        add_moe_keys(w, shape)
    for which, cap in (("attn", shape.attn_softcap), ("final", shape.final_softcap)):
        if cap:
            w.add_float32(f"{shape.arch}.{which}_logit_softcapping", cap)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.token_types)
    w.add_token_merges(vocab.merges)
    w.add_bos_token_id(vocab.bos_id)
    w.add_eos_token_id(vocab.eos_id)
    w.add_add_bos_token(True)
    w.add_chat_template(vocab.chat_template)

    for tname, dims, qtype in plan:
        if qtype in ("F32", "F16"):
            dtype = np.dtype(np.float32 if qtype == "F32" else np.float16)
            w.add_tensor_info(tname, dims, dtype, dtype.itemsize * math.prod(dims))
        else:
            size, elems = BLOCKS[qtype]
            raw = (*dims[:-1], dims[-1] // elems * size)
            w.add_tensor_info(tname, raw, np.dtype(np.uint8), math.prod(raw),
                              raw_dtype=gguf.GGMLQuantizationType[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    start = time.perf_counter()
    for i, (tname, dims, qtype) in enumerate(plan):
        w.write_tensor_data(tensor_data(rng, tname, dims, qtype, shape))
        if log and (i + 1) % 50 == 0:
            log(f"  {i + 1}/{len(plan)} tensors, {time.perf_counter() - start:.1f} s")
    w.close()


def tensor_plan(shape: Shape, file_type: str) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, dims, type) of every tensor: norms, biases and sinks F32, the matrices as tensor_types.py says; a
    ValueError (before anything is written) where a row is no whole number of the type's blocks."""
    plan = []
    for tname, dims in tensor_shapes(shape):
        flat = len(dims) == 1 or tname.endswith(".bias")
        qtype = "F32" if flat else tensor_type(tname, file_type, shape.layers, shape.tied)
        if qtype in BLOCKS and dims[-1] % BLOCKS[qtype][1]:
            raise ValueError(f"{file_type}: {tname} would be {qtype}, whose rows hold multiples of {BLOCKS[qtype][1]} "
                             f"values; its rows hold {dims[-1]}")
        plan.append((tname, dims, qtype))
    return plan


def padded(vocab: GgufVocab, size: int) -> GgufVocab:
    """The vocabulary grown to `size` rows with unused tokens (a model's embedding rows past its tokenizer,
    as Qwen2.5's files carry them); an error when the tokenizer has more tokens than the shape."""
    if len(vocab.tokens) > size:
        raise ValueError(f"the tokenizer has {len(vocab.tokens)} tokens; the shape has {size}")
    extra = size - len(vocab.tokens)
    if not extra:
        return vocab
    return replace(vocab, tokens=vocab.tokens + [f"<|unused_{i}|>" for i in range(extra)],
                   token_types=vocab.token_types + [TOKEN_TYPE_UNUSED] * extra)


def reduced(shape: Shape, *, hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, vocab: int,
            **moe) -> Shape:
    """The same family at a small size (the tests' model); moe: experts, experts_used, expert_ffn, head_size."""
    return replace(shape, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, ffn=ffn, vocab=vocab, **moe)


def model_name(shape_name: str, file_type: str) -> str:
    """general.name of a synthetic file. llama.cpp sets token attributes by the model's name: one holding "phi-3" or
    "phi3" must have Phi-3's </s>, <unk>, <s> and <|endoftext|> tokens, which Llama 3's tokenizer has not (it then
    fails to load the file: "error loading model vocabulary: unordered_map::at"), so the name says "Phi 3"."""
    return f"{shape_name.replace('Phi-3', 'Phi 3')} {file_type} (random weights)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--type", required=True, choices=sorted(FILE_TYPES), dest="file_type")
    ap.add_argument("-o", "--output", required=True, type=Path)
    ap.add_argument("--tokenizer-model", type=Path, default=None,
                    help="Llama 3's tiktoken file; default: the one of the installed llama-models package")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the shape has (a quick file)")
    args = ap.parse_args(argv)
    source = args.tokenizer_model or find_llama3_tokenizer_model()
    if source is None or not Path(source).is_file():
        print("error: no Llama 3 tokenizer: `pip install --no-deps llama-models` or pass --tokenizer-model PATH",
              file=sys.stderr)
        return 2
    shape = SHAPES[args.shape]
    if args.layers is not None:
        if not 1 <= args.layers <= shape.layers:
            print(f"error: --layers takes 1..{shape.layers}, got {args.layers}", file=sys.stderr)
            return 2
        shape = replace(shape, layers=args.layers)
    start = time.perf_counter()
    try:
        vocab = gguf_vocab(Path(source))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        print(f"error: {source}: not a tiktoken tokenizer file ({exc})", file=sys.stderr)
        return 2
    print(f"tokenizer: {len(vocab.tokens)} tokens, {len(vocab.merges)} merges ({time.perf_counter() - start:.1f} s)")
    if len(vocab.tokens) > shape.vocab or (shape.arch == "llama" and len(vocab.tokens) != shape.vocab):
        print(f"error: {source} gives {len(vocab.tokens)} tokens with the special ones; {args.shape} has "
              f"{shape.vocab} (is it Llama 3's tokenizer.model?)", file=sys.stderr)
        return 2
    try:
        write_model(args.output, shape, args.file_type, vocab, name=model_name(args.shape, args.file_type),
                    seed=args.seed)
    except ValueError as exc:  # a type whose blocks do not fit the shape's rows: nothing written
        print(f"error: {args.shape}: {exc}", file=sys.stderr)
        return 2
    size = args.output.stat().st_size
    print(f"wrote {args.output}: {size / 2**30:.2f} GiB in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
