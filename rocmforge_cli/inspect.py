"""`rocmforge inspect`: what a GGUF model file holds, validated, without loading its weights."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Annotated, Any, Optional

import typer
from rich.table import Table
from rich.text import Text

from hipcore.gguf.demo_model import INSTALL_HINT, find_demo_model
from hipcore.errors import RocmforgeError, UsageError, printable
from hipcore.gguf.file import ModelPlan, read_plan
from hipcore.runtime.ledger import format_bytes
from profiles.breakable_text import BETWEEN_WORDS, PATH, BreakableText
from rocmforge_cli.common import handle_errors, stderr, stdout
from rocmforge_cli.options import json_option, model_option


def tokenizer_summary(plan: ModelPlan) -> dict[str, Any]:
    """Kind, pre-tokenizer, sizes, special tokens, and whether rocmforge's tokenizer supports it."""
    from hipcore.tokenizer.tokenizer import Tokenizer

    m = plan.metadata
    summary: dict[str, Any] = {
        "kind": m.get("tokenizer.ggml.model"),
        "pre": m.get("tokenizer.ggml.pre"),
        "tokens": len(m.get("tokenizer.ggml.tokens", ())),
        "merges": len(m.get("tokenizer.ggml.merges", ())),
        "bos_id": m.get("tokenizer.ggml.bos_token_id"),
        "eos_id": m.get("tokenizer.ggml.eos_token_id"),
        "chat_template_chars": len(m.get("tokenizer.chat_template", "")) or None,
    }
    try:
        Tokenizer.from_metadata(m)
        summary["supported"], summary["problem"] = True, None
    except RocmforgeError as exc:  # the file is valid; only our tokenizer cannot use it
        summary["supported"], summary["problem"] = False, str(exc)
    return summary


def inspect_json(plan: ModelPlan, seconds: float, list_tensors: bool) -> dict[str, Any]:
    result: dict[str, Any] = {
        "path": plan.path, "file_size": plan.file_size, "gguf_version": plan.version,
        "alignment": plan.alignment, "data_offset": plan.data_offset, "parse_seconds": round(seconds, 4),
        "config": dataclasses.asdict(plan.config),
        "kv_bytes_per_token_f16": plan.config.kv_bytes_per_token(2),
        "tokenizer": tokenizer_summary(plan),
        "tensors": {
            "count": len(plan.tensors), "bytes": plan.total_tensor_bytes,
            "by_type": {name: {"count": c, "bytes": b} for name, (c, b) in plan.bytes_by_type().items()},
        },
    }
    if list_tensors:
        result["tensors"]["list"] = [
            {"name": t.name, "type": t.type_name, "shape": list(t.shape), "offset": t.offset, "bytes": t.nbytes}
            for t in plan.tensors
        ]
    return result


def _fused_tensors(plan: ModelPlan) -> list[str]:
    """The layer matrices the file holds concatenated (phi3: q|k|v as attn_qkv, gate|up as ffn_up)."""
    shapes = plan.config.expected_tensor_shapes()
    fused = ["attn_qkv (q|k|v)"] if "blk.0.attn_qkv.weight" in shapes else []
    if "blk.0.ffn_up.weight" in shapes and "blk.0.ffn_gate.weight" not in shapes:
        fused.append("ffn_up (gate|up)")
    return fused


def render(plan: ModelPlan, list_tensors: bool) -> None:
    c = plan.config
    overview = Table(title=_cell(os.path.basename(plan.path)), title_justify="left", show_header=False)
    overview.add_column("field")
    overview.add_column("value", overflow="fold")
    rows = [
        ("file", f"{plan.path} ({format_bytes(plan.file_size)}, GGUF v{plan.version}, alignment {plan.alignment})"),
        ("architecture", f"{c.architecture}" + (f" - {c.name}" if c.name else "")),
        ("layers / hidden / ffn", f"{c.n_layers} / {c.hidden_size} / {c.ffn_size}"),
        *([("experts", f"{c.n_experts_used} of {c.n_experts} a token, {c.expert_ffn_size} wide; " + (
            "softmax over all, top-k, renormalized" if c.expert_gating == "softmax_topk" else "top-k, softmax over them")
            + (", biases, clamped SwiGLU" if c.expert_activation == "swiglu_oai" else ""))] if c.is_moe else []),
        ("attention heads", f"{c.n_heads} query, {c.n_kv_heads} KV (head size {c.head_dim})"),
        ("vocabulary / context", f"{c.vocab_size} tokens / {c.context_length} tokens"),
        ("RoPE", f"base {c.rope_theta:g}, {c.rope_dim} dims, {c.rope_type.upper()} pairs, scaling {c.rope_scaling}"
                 + (f" x{c.rope_scaling_factor:g} (trained at {c.rope_original_context})"
                    if c.rope_scaling != "none" else "")),
        ("RMSNorm epsilon", f"{c.rms_norm_eps:g}"),
        ("q, k, v", ", ".join(extra for extra, present in (("biases", c.qkv_bias), ("q and k normalized per head", c.qk_norm))
                              if present) or "plain products"),
        ("layer tensors", "fused as the file holds them: " + ", ".join(fused) if (fused := _fused_tensors(plan))
         else "separate"),
        ("attention window", f"{c.sliding_window} keys on {sum(map(c.is_local_layer, range(c.n_layers)))} of "
                             f"{c.n_layers} layers" if c.sliding_window else "none (every layer global)"),
        ("soft caps", f"attention {c.attn_softcap:g}, final logits {c.final_softcap:g}"
         if c.attn_softcap or c.final_softcap else "none"),
        ("output projection", "tied to token_embd.weight" if c.tie_embeddings else "output.weight"),
        ("KV cache per token", f"{format_bytes(c.kv_bytes_per_token(2))} in f16"),
    ]
    tok = tokenizer_summary(plan)
    rows.append(("tokenizer", f"{tok['kind']} (pre: {tok['pre']}), {tok['tokens']} tokens"
                 + (f", {tok['merges']} merges" if tok["merges"] else "")
                 + ("" if tok["supported"] else f" - NOT SUPPORTED: {tok['problem']}")))
    rows.append(("chat template", f"{tok['chat_template_chars']} characters" if tok["chat_template_chars"] else "none"))
    for field, value in rows:
        # the path folds after a '/', the rest between words (the model's own text is printable() either way)
        overview.add_row(field, BreakableText(printable(value), PATH if field == "file" else BETWEEN_WORDS))
    stdout.print(overview, soft_wrap=False)

    types = Table(title=f"{len(plan.tensors)} tensors, {format_bytes(plan.total_tensor_bytes)}", title_justify="left")
    for column, justify in (("type", "left"), ("tensors", "right"), ("bytes", "right"), ("share", "right")):
        types.add_column(column, justify=justify)  # type: ignore[arg-type]
    for name, (count, nbytes) in plan.bytes_by_type().items():
        share = 100.0 * nbytes / plan.total_tensor_bytes if plan.total_tensor_bytes else 0.0
        types.add_row(name, str(count), format_bytes(nbytes), f"{share:.1f}%")
    stdout.print(types, soft_wrap=False)

    if list_tensors:
        listing = Table(title="tensors in file order", title_justify="left")
        for column, justify in (("name", "left"), ("type", "left"), ("shape", "left"), ("offset", "right"),
                                ("bytes", "right")):
            listing.add_column(column, justify=justify)  # type: ignore[arg-type]
        for t in plan.tensors:
            listing.add_row(_cell(t.name), t.type_name, " x ".join(map(str, t.shape)), str(t.offset), str(t.nbytes))
        stdout.print(listing, soft_wrap=False)


def _cell(value: str) -> Text:
    """A table cell holding text from the model file (its name, tokenizer, tensor names): control
    characters escaped, and a Text, so that "[bold]" in a name is shown, not obeyed as markup."""
    return Text(printable(value))


@handle_errors
def inspect_command(
    model: Annotated[Optional[str], typer.Argument(
        show_default=False, metavar="MODEL",
        help="Path of a GGUF model file (or give it with -m/--model, as the other commands take it). Default: the demo "
             "model (SmolLM2-135M-Instruct) if installed.")] = None,
    model_flag: Annotated[Optional[str], model_option()] = None,
    as_json: Annotated[bool, json_option("Print the result as JSON instead of tables.")] = False,
    list_tensors: Annotated[bool, typer.Option("--tensors", help="Also list every tensor: name, type, shape, offset, bytes.")] = False,
) -> None:
    """Validate a GGUF model file and show its architecture, configuration, tokenizer and tensor types.

    Only the header is read (the weights are not loaded), and every count, size and offset in it is checked first.

    A damaged or truncated file gets a one-line error and exit code 3; a valid file using something rocmforge does not support (an architecture, a tensor type) gets exit code 4, naming it.

    Examples:
      rocmforge inspect model.gguf
      rocmforge inspect -m model.gguf --json | jq .config
      rocmforge inspect --tensors                   (the demo model, every tensor listed)
    """
    if model is not None and model_flag is not None and model != model_flag:
        raise UsageError(f"two models given: {model!r} and -m {model_flag!r}; give one")
    model = model or model_flag
    path = model or _demo_model()
    start = time.perf_counter()
    plan = read_plan(path)
    seconds = time.perf_counter() - start
    if as_json:
        stdout.print_json(json.dumps(inspect_json(plan, seconds, list_tensors)))
    else:
        render(plan, list_tensors)
    stderr.print(f"header read and validated in {seconds * 1000:.0f} ms", markup=False, highlight=False)


def _demo_model() -> str:
    demo = find_demo_model()
    if demo is None:
        raise UsageError(f"no MODEL given and the demo model is not installed; run `{INSTALL_HINT}` or pass a path")
    return str(demo)
