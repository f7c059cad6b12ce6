"""Model weights on the device: each tensor uploaded once, from the validated plan.

On a GPU, quantized weights stay in their GGUF block format and the kernels dequantize them as
they read. A matrix type with no kernel yet is converted once to F16 at load (said, not silent).
The cpu backend dequantizes everything to float32 once (numpy matmuls are its fast path), but a mixture of experts'
3-D expert tensors, which stay in their file format there too: the expert ops' host kernels decode the selected
experts and quantize their input as the GPU kernels do (a 30B MoE's experts would take 120 GB as float32).

A failure half-way (out of memory, a read error) frees every buffer uploaded so far before the
error propagates: nothing is left half-uploaded (docs/architecture.md, "Out of memory", rule 2).

Matrices that read the same input are uploaded back to back into one buffer when they share a
format: q, k and v of a layer, and gate and up. The decode path then runs each group as one fused
matrix-vector product (one launch, one pass over the input); each matrix stays addressable on its
own (Weight.offset) for the ops that read them one at a time. The bytes are the same either way.
Phi-3's files hold q|k|v and gate|up already concatenated in that layout (FILE_FUSED): each is uploaded
as it is and its members become views of its rows.

BF16 matrices are narrowed to f16 on the matrix cores (kernels/matmul_mma_formats.h BF16): exact where |w| <=
65,504, an overflow beyond it. On a device with matrix cores, a BF16 matrix holding any larger value (or an inf or
NaN) is stored as F32 instead, which no path narrows (said in ModelWeights.converted; the memory plan counted it at
its file size, so the load takes twice that for it). LLM weights are far inside f16's range: in practice every BF16
matrix stays BF16. A dense MXFP4 matrix likewise: its largest weight is 12 * 2^(e - 128) for a block's scale byte e, so
one of e > MXFP4_F16_MAX_SCALE is stored as F32 (the 3-D expert tensors keep MXFP4: their products stay in int8).

qwen2's, phi3's and gemma2's NEOX RoPE rotates pairs (i, i + rope_dim / 2) of each head; the fused attention-input
kernels rotate adjacent pairs (2i, 2i + 1) (NORM). For the architectures in NEOX_AS_NORM, the rows of attn_q and attn_k (and
of qwen2's biases; phi3's q and k parts of its attn_qkv) are uploaded in neox_pair_order within each head, so that
NEOX pair i lies at rows 2i, 2i + 1 and rotates with the same frequency in NORM mode: q and k come out in that order, consistently, and attention's q . k
sums the same products in another order (v and the attention output are untouched). ModelWeights.rope_pairs_adjacent
says so, and the runner then computes RoPE in NORM mode (hipcore/model/forward.py). It is the reordering llama.cpp's
converter applies to Llama's q and k (the other way round), done at load.

Llama 3.1/3.2 files carry rope_freqs.weight, the per-pair divisors of the "llama3" RoPE scaling: it
is uploaded as float32 (rope_dim / 2 values) and every kernel that applies RoPE reads it. Its values
are checked first (finite and positive: a zero or negative divisor would turn every angle into
inf or nonsense), before anything is allocated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from hipcore.gguf.architectures import ARCHITECTURES
from hipcore.gguf.errors import GGUFError
from hipcore.model import yarn
from hipcore.model.layer_weights import LayerWeights
from hipcore.model.weight_handle import Weight
from hipcore.model.neox_rows import neox_pair_order, paired_fused_qkv, paired_rows
from hipcore.ops import matmul_mma, moe_experts
from hipcore.runtime.device import Buffer, Device

# Matrix formats with GPU product kernels (lower-case = the kernels' variant suffix; MXFP4's few-token products take
# qmatvec, its others matmul / matmul_mma: hipcore/ops/kernel_choice.py single_product_op).
GPU_MATRIX_TYPES = frozenset({"f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k",
                              "mxfp4"})
# Embedding-table formats with a GPU lookup kernel (hipcore/ops/embedding.py).
GPU_TABLE_TYPES = frozenset({"f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k"})

LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
# A mixture of experts' layer matrices in place of ffn_gate, ffn_up and ffn_down: the router, 2-D, and the experts,
# 3-D [experts, rows, cols], each uploaded as one buffer in its file format on a GPU (the expert ops read expert e
# at e * rows * row_bytes), float32 on the cpu backend.
MOE_TENSORS = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp",
               "ffn_down_shexp")  # the last three: qwen2moe's shared expert, 2-D, read by the expert ops as one expert
# Per-layer vectors some families add (hipcore/gguf/architectures.py): LayerWeights field -> tensor name part. The
# expert biases are 2-D (a row per expert) and stored as float32 like the vectors.
FAMILY_VECTORS = {"attn_q_bias": "attn_q.bias", "attn_k_bias": "attn_k.bias", "attn_v_bias": "attn_v.bias",
                  "attn_q_norm": "attn_q_norm.weight", "attn_k_norm": "attn_k_norm.weight",
                  "attn_post_norm": "post_attention_norm.weight", "ffn_post_norm": "post_ffw_norm.weight",
                  "attn_output_bias": "attn_output.bias", "attn_sinks": "attn_sinks.weight",
                  "ffn_gate_inp_bias": "ffn_gate_inp.bias", "ffn_gate_exps_bias": "ffn_gate_exps.bias",
                  "ffn_up_exps_bias": "ffn_up_exps.bias", "ffn_down_exps_bias": "ffn_down_exps.bias",
                  "ffn_gate_inp_shexp": "ffn_gate_inp_shexp.weight"}
# Layer matrices uploaded into one buffer when their formats agree: (group name, members).
FUSED_GROUPS = (("attn_qkv", ("attn_q", "attn_k", "attn_v")), ("ffn_gate_up", ("ffn_gate", "ffn_up")))
# Matrices a family's files hold already concatenated (phi3): file tensor -> (its members, in row order).
# Each is uploaded as one buffer (it is the group above, as the fused kernels read it) and every member
# becomes a view of its rows.
FILE_FUSED = {"attn_qkv": ("attn_q", "attn_k", "attn_v"), "ffn_up": ("ffn_gate", "ffn_up")}
ROPE_FREQS = "rope_freqs.weight"  # optional: RoPE frequency divisors (Llama 3.1/3.2 "llama3" scaling)
# Architectures whose NEOX RoPE runs in NORM mode on reordered q and k rows (see the module's docstring): qwen2 and
# phi3, whose q, k and v then take the fused attention-input kernels (qwen2's biases and all). qwen3 and gemma
# normalize each head of q and k first, which no fused kernel does.
NEOX_AS_NORM = frozenset({"qwen2", "phi3", "gemma2", "qwen2moe"})
_PAIRED_ROWS = ("attn_q.weight", "attn_k.weight", "attn_q.bias", "attn_k.bias")
_PAIRED_FUSED = "attn_qkv.weight"  # phi3's q|k|v: its q and k row ranges reordered, v's left

ProgressFn = Callable[[int, int, str], None]  # (bytes done, bytes total, tensor name)


@dataclass
class ModelWeights:
    token_embd: Weight
    output_norm: Weight
    output: Weight  # the same Weight as token_embd when the model ties them
    layers: list[LayerWeights]
    buffers: list[Buffer] = field(default_factory=list)
    converted: list[str] = field(default_factory=list)  # tensors converted at load: "name (TYPE -> TYPE: why)"
    rope_freqs: Weight | None = None  # float32 [rope_dim / 2] RoPE frequency divisors, when the file has them
    rope_pairs_adjacent: bool = False  # q and k rows in neox_pair_order: RoPE runs in NORM mode (NEOX_AS_NORM)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)

    def free(self) -> None:
        """Give every weight buffer back; idempotent."""
        for buf in self.buffers:
            if not buf.freed:
                buf.free()
        self.buffers.clear()


def storage_format(device: Device, type_name: str, *, is_table: bool, is_vector: bool, is_experts: bool = False) -> str:
    """The format a tensor of GGUF type `type_name` is stored in on `device` (is_experts: a 3-D expert tensor, which
    keeps every format the expert products read, MXFP4 among them)."""
    t = type_name.lower()
    if is_experts and moe_experts.supports(t):  # on the cpu backend too: its host kernel decodes the selected experts
        return t
    if device.backend == "cpu" or is_vector:
        return "f32"
    supported = GPU_TABLE_TYPES & GPU_MATRIX_TYPES if is_table else GPU_MATRIX_TYPES
    return t if t in supported else "f16"


# The largest bfloat16 magnitude f16 holds (0x477F: 65,280; the next, 65,536, is past f16's 65,504), as its low 15 bits.
BF16_F16_MAX_BITS = 0x477F
_RANGE_CHUNK = 1 << 24  # elements a pass of bf16_fits_f16 takes (32 MiB of uint16 temporaries)


# The largest MXFP4 scale byte whose weights f16 holds: 12 * 2^(140 - 128) = 49,152; at 141, 98,304 is past 65,504.
MXFP4_F16_MAX_SCALE = 140
MXFP4_BLOCK_BYTES = 17


def mxfp4_fits_f16(raw: np.ndarray) -> bool:
    """Whether every weight of an MXFP4 tensor's bytes has a magnitude f16 holds (each block's scale byte, its first,
    at most MXFP4_F16_MAX_SCALE)."""
    scales = np.asarray(raw).reshape(-1, MXFP4_BLOCK_BYTES)[:, 0]
    return int(scales.max(initial=0)) <= MXFP4_F16_MAX_SCALE


def bf16_fits_f16(raw: np.ndarray) -> bool:
    """Whether every value of a BF16 tensor's bytes has a magnitude f16 holds (no inf or NaN either)."""
    bits = np.asarray(raw).view(np.uint16).reshape(-1)
    return all(int((bits[i:i + _RANGE_CHUNK] & 0x7FFF).max(initial=0)) <= BF16_F16_MAX_BITS
               for i in range(0, bits.size, _RANGE_CHUNK))


def _stored_bytes(fmt: str, info) -> int:
    if fmt == info.type_name.lower():
        return info.nbytes
    return info.n_elements * (4 if fmt == "f32" else 2)


def _layer_parts(config) -> list[str]:
    """The per-layer matrices and norms as the file names them (LAYER_TENSORS, or a family's fused ones)."""
    expected = config.expected_tensor_shapes()
    return [t for t in ("attn_norm", "attn_qkv", "attn_q", "attn_k", "attn_v", "attn_output", _ffn_norm(config),
                        "ffn_gate", "ffn_up", "ffn_down", *MOE_TENSORS) if f"blk.0.{t}.weight" in expected]


def _ffn_norm(config) -> str:
    """The pre-feed-forward norm's tensor (gpt-oss's files call it post_attention_norm)."""
    return ARCHITECTURES[config.architecture].ffn_norm_name


def _file_fused(config) -> dict[str, tuple[str, ...]]:
    """FILE_FUSED's entries this config's files hold: the tensor is there and its other members are not
    (ffn_up holds gate and up when there is no ffn_gate)."""
    parts = set(_layer_parts(config))
    return {t: members for t, members in FILE_FUSED.items() if t in parts and not (set(members) - {t}) & parts}


def _tensor_roles(config) -> list[tuple[str, bool, bool]]:
    """(name, is_table, is_vector) of every tensor the forward pass reads."""
    roles = [("token_embd.weight", True, False), ("output_norm.weight", False, True)]
    if not config.tie_embeddings:
        roles.append(("output.weight", False, False))
    for i in range(config.n_layers):
        for t in _layer_parts(config):
            roles.append((f"blk.{i}.{t}.weight", False, t.endswith("norm")))
        for part in _family_vectors(config).values():
            roles.append((f"blk.{i}.{part}", False, True))
    return roles


def _has_rope_freqs(plan) -> bool:
    return any(info.name == ROPE_FREQS for info in plan.tensors)


def _family_vectors(config) -> dict[str, str]:
    """The FAMILY_VECTORS this config's layers carry (its expected tensors say which)."""
    expected, ffn_norm = config.expected_tensor_shapes(), f"{_ffn_norm(config)}.weight"
    return {field: part for field, part in FAMILY_VECTORS.items() if f"blk.0.{part}" in expected and part != ffn_norm}


def planned_weight_bytes(device: Device, plan) -> int:
    """Exactly what upload_weights will allocate for this model on this device (for the memory plan)."""
    matrices = sum(
        _stored_bytes(storage_format(device, plan.tensor(name).type_name, is_table=table, is_vector=vec,
                                     is_experts=name.endswith("_exps.weight")), plan.tensor(name))
        for name, table, vec in _tensor_roles(plan.config)
    )
    divisors = _has_rope_freqs(plan) or plan.config.rope_scaling == "yarn"
    return matrices + (plan.config.rope_dim // 2 * 4 if divisors else 0)


def weight_growth(device: Device, plan) -> tuple[int, int, str]:
    """(bytes in the file, bytes converted to another format on load, that format) of the tensors upload_weights
    stores: the cpu backend keeps every quantized matrix as f32 (numpy has no quantized product), a GPU stores
    a type its kernels do not read as f16."""
    in_file = converted = 0
    formats: set[str] = set()
    for name, table, vec in _tensor_roles(plan.config):
        info = plan.tensor(name)
        fmt = storage_format(device, info.type_name, is_table=table, is_vector=vec, is_experts=name.endswith("_exps.weight"))
        in_file += info.nbytes
        if fmt != info.type_name.lower():
            converted += info.nbytes
            formats.add(fmt)
    return in_file, converted, "/".join(sorted(formats))


def rope_factors(gguf) -> np.ndarray | None:
    """float32 [rope_dim / 2]: the file's RoPE frequency divisors, checked finite and positive; None without them."""
    if not _has_rope_freqs(gguf.plan):
        return None
    info = gguf.plan.tensor(ROPE_FREQS)
    factors = gguf.dequantize(ROPE_FREQS).astype(np.float32).reshape(-1)
    bad = np.flatnonzero(~(np.isfinite(factors) & (factors > 0)))
    if bad.size:
        i = int(bad[0])
        raise GGUFError(f"tensor {ROPE_FREQS!r}", info.offset + i * 4 if info.type_name == "F32" else info.offset,
                        float(factors[i]), "finite positive factors",
                        problem=f"RoPE frequency factor {i} is {float(factors[i])!r}; a divisor must be finite and positive")
    return factors


def pairs_neox_rows(config) -> bool:
    """True when upload_weights reorders this model's q and k rows (NEOX_AS_NORM)."""
    return config.rope_type == "neox" and config.architecture in NEOX_AS_NORM


def _upload_groups(config) -> list[tuple[str | None, list[tuple[str, bool, bool]]]]:
    """The roles of _tensor_roles in upload order, grouped: (group name or None, member roles)."""
    grouped = {f"blk.{i}.{m}.weight": (f"blk.{i}.{g}", members)
               for i in range(config.n_layers) for g, members in FUSED_GROUPS for m in members}
    out: list[tuple[str | None, list[tuple[str, bool, bool]]]] = []
    open_groups: dict[str, list[tuple[str, bool, bool]]] = {}
    for role in _tensor_roles(config):
        group = grouped.get(role[0])
        if group is None:
            out.append((None, [role]))
        elif group[0] in open_groups:
            open_groups[group[0]].append(role)
        else:
            open_groups[group[0]] = [role]
            out.append((group[0], open_groups[group[0]]))
    return out


def upload_weights(device: Device, gguf, progress: ProgressFn | None = None) -> ModelWeights:
    """Upload every tensor of `gguf` (an open hipcore.gguf.file.GGUFFile) the forward pass needs."""
    plan, config = gguf.plan, gguf.config
    factors = rope_factors(gguf)  # checked before anything is allocated
    if config.rope_scaling == "yarn":  # YaRN's frequencies as the divisors every RoPE launch reads (yarn.py)
        factors = yarn.divisors(config, factors)
    total = planned_weight_bytes(device, plan)
    done = 0
    uploaded: dict[str, Weight] = {}
    groups: dict[str, Weight] = {}
    buffers: list[Buffer] = []
    converted: list[str] = []
    rope_freqs: Weight | None = None

    formats: dict[str, str] = {}

    def stored_format(name: str, table: bool, vec: bool) -> str:
        """storage_format's, except a BF16 or dense MXFP4 matrix beyond f16's range: F32 (the module's docstring)."""
        if name not in formats:
            experts = name.endswith("_exps.weight")
            fmt = storage_format(device, plan.tensor(name).type_name, is_table=table, is_vector=vec, is_experts=experts)
            fits = {"bf16": bf16_fits_f16, "mxfp4": mxfp4_fits_f16}.get(fmt)
            narrowed = fits is not None and not experts and matmul_mma.has_matrix_cores(device.arch)  # (nowhere else)
            formats[name] = "f32" if narrowed and not fits(gguf.raw(name)) else fmt
        return formats[name]

    def experts_fit_f16(name: str, fmt: str) -> bool:
        """A 3-D expert tensor of BF16 or MXFP4 on a matrix-core device: whether its values fit f16 (the prompt's
        expert products round them to f16; the per-pair products, which read them as they are, take it otherwise)."""
        fits = {"bf16": bf16_fits_f16, "mxfp4": mxfp4_fits_f16}.get(fmt)
        if fits is None or not name.endswith("_exps.weight") or not matmul_mma.has_matrix_cores(device.arch):
            return True
        return fits(gguf.raw(name))

    paired = pairs_neox_rows(config)

    def host_data(name: str, fmt: str, vec: bool) -> np.ndarray:
        data = file_data(name, fmt, vec)
        if paired and name.endswith(_PAIRED_ROWS):  # blk.N.attn_q.weight ...: rows first, as the file has them
            heads = config.n_heads if ".attn_q." in name else config.n_kv_heads
            data = paired_rows(data, heads, config.head_dim, config.rope_dim)
        elif paired and name.endswith(_PAIRED_FUSED):
            data = paired_fused_qkv(data, config)
        return data

    def file_data(name: str, fmt: str, vec: bool) -> np.ndarray:
        info = plan.tensor(name)
        if fmt == info.type_name.lower():
            return gguf.raw(name)
        values = gguf.dequantize(name)
        if device.backend != "cpu" and not vec:
            wide = info.type_name in ("BF16", "MXFP4")
            why = "values beyond f16's range" if wide else "no kernel reads this type yet"
            converted.append(f"{name} ({info.type_name} -> {fmt.upper()}: {why})")
        return values.astype(np.float32 if fmt == "f32" else np.float16)

    try:
        if factors is not None:
            buf = device.allocate(factors.nbytes, tag="weights", label=ROPE_FREQS)
            buffers.append(buf)
            buf.upload(factors)
            rope_freqs = Weight(buf, "f32", factors.shape)
            done += factors.nbytes
            if progress is not None:
                progress(done, total, ROPE_FREQS)
        for group, roles in _upload_groups(config):
            fmts = [stored_format(n, t, v) for n, t, v in roles]
            # One buffer for the group when the formats agree; otherwise each tensor on its own.
            units = [roles] if group is not None and len(set(fmts)) == 1 else [[r] for r in roles]
            for unit in units:
                fmt = stored_format(*unit[0])
                sizes = [_stored_bytes(fmt, plan.tensor(n)) for n, _, _ in unit]
                label = unit[0][0] if len(unit) == 1 else f"{group}.weight"
                buf = device.allocate(sum(sizes), tag="weights", label=label)
                buffers.append(buf)
                offset = 0
                for (name, _table, vec), size in zip(unit, sizes):
                    data = host_data(name, fmt, vec)
                    buf.upload(data, offset=offset)
                    uploaded[name] = Weight(buf, fmt, tuple(plan.tensor(name).shape), offset,
                                            fits_f16=experts_fit_f16(name, fmt))
                    offset += size
                    done += size
                    if progress is not None:
                        progress(done, total, name)
                if len(unit) > 1:
                    rows = sum(plan.tensor(n).shape[0] for n, _, _ in unit)
                    groups[group] = Weight(buf, fmt, (rows, plan.tensor(unit[0][0]).shape[-1]))
    except BaseException:
        for buf in buffers:
            if not buf.freed:
                buf.free()
        raise
    vectors = _family_vectors(config)
    file_fused = _file_fused(config)
    for i in range(config.n_layers):
        for tensor, members in file_fused.items():
            whole = uploaded[f"blk.{i}.{tensor}.weight"]
            groups[f"blk.{i}.{_GROUP_OF[members[0]]}"] = whole
            sizes = _member_rows(config, members)
            uploaded.update({f"blk.{i}.{m}.weight": view for m, view in
                             zip(members, _row_views(whole, sizes, plan.tensor(f"blk.{i}.{tensor}.weight")))})
    layers = [
        LayerWeights(*(uploaded.get(f"blk.{i}.{_ffn_norm(config) if t == 'ffn_norm' else t}.weight")
                       for t in LAYER_TENSORS),
                     **{t: uploaded.get(f"blk.{i}.{t}.weight") for t in MOE_TENSORS},
                     **{g: groups.get(f"blk.{i}.{g}") for g, _ in FUSED_GROUPS},
                     **{field: uploaded[f"blk.{i}.{part}"] for field, part in vectors.items()})
        for i in range(config.n_layers)
    ]
    embd = uploaded["token_embd.weight"]
    output = embd if config.tie_embeddings else uploaded["output.weight"]
    return ModelWeights(embd, uploaded["output_norm.weight"], output, layers, buffers, converted, rope_freqs,
                        rope_pairs_adjacent=paired)


_GROUP_OF = {m: g for g, members in FUSED_GROUPS for m in members}


def _member_rows(config, members: tuple[str, ...]) -> list[int]:
    rows = {"attn_q": config.q_size, "attn_k": config.kv_size, "attn_v": config.kv_size,
            "ffn_gate": config.ffn_size, "ffn_up": config.ffn_size}
    return [rows[m] for m in members]


def _row_views(whole: Weight, rows: list[int], info) -> list[Weight]:
    """Weights over consecutive row ranges of `whole` (a matrix of whole rows: a row is whole blocks in
    every GGUF format, so a range starts at a byte offset)."""
    row_bytes = _stored_bytes(whole.fmt, info) // whole.rows
    views, start = [], 0
    for n in rows:
        views.append(Weight(whole.buffer, whole.fmt, (n, whole.cols), whole.offset + start * row_bytes))
        start += n
    assert start == whole.rows, (rows, whole.shape)
    return views
