"""A random-weights model of the demo model's exact shapes and types, for speed measurements on a GPU
machine that lacks the 98 MB demo file: SmolLM2-135M-Instruct's llama layout (30 layers, hidden 576,
9/3 heads of 64, ffn 1536, vocab 49152, tied Q8_0 embeddings, Q4_1 layers) and its tokenizer.

Two steps, because the tokenizer comes from the real file:

    python3 scripts/models/random_demo_model.py --dump-tokenizer smollm2_tokenizer.json   # where it is installed
    python3 scripts/models/random_demo_model.py --tokenizer smollm2_tokenizer.json --out OUTDIR/random135m.gguf

The weights are tests/support/gguf_factory.py's random ones: the speed of every kernel is the same as on the
real model, the text it writes is not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from support.gguf_factory import Meta, tiny_llama_spec, write_gguf  # noqa: E402
from support.gguf_raw import ARRAY, BOOL, INT32, STRING, UINT32  # noqa: E402

TOKENIZER_KEYS = {  # key -> (value type, element type)
    "tokenizer.ggml.model": (STRING, None), "tokenizer.ggml.pre": (STRING, None),
    "tokenizer.ggml.tokens": (ARRAY, STRING), "tokenizer.ggml.token_type": (ARRAY, INT32),
    "tokenizer.ggml.merges": (ARRAY, STRING), "tokenizer.ggml.bos_token_id": (UINT32, None),
    "tokenizer.ggml.eos_token_id": (UINT32, None), "tokenizer.ggml.unknown_token_id": (UINT32, None),
    "tokenizer.ggml.padding_token_id": (UINT32, None), "tokenizer.ggml.add_bos_token": (BOOL, None),
    "tokenizer.ggml.add_space_prefix": (BOOL, None), "tokenizer.chat_template": (STRING, None),
}


def dump_tokenizer(out: Path) -> None:
    from hipcore.gguf.demo_model import find_demo_model
    from hipcore.gguf.file import GGUFFile

    path = find_demo_model()
    if not path:
        raise SystemExit("the demo model is not installed here")
    with GGUFFile.open(path) as f:
        md = f.plan.metadata
        keys = {k: list(v) if isinstance(v, tuple) else v for k, v in md.items() if k in TOKENIZER_KEYS}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(keys))
    print(f"{out}: {len(keys)} tokenizer keys")


def write_model(tokenizer: Path, out: Path) -> None:
    keys = json.loads(tokenizer.read_text())
    spec = tiny_llama_spec(n_layers=30, hidden=576, n_heads=9, n_kv_heads=3, ffn=1536, vocab=49152,
                           tensor_type="Q4_1", embedding_type="Q8_0", tokenizer=None, context=8192,
                           rope_theta=100000.0, seed=1)
    meta = [m for m in spec.metadata if not m.key.startswith("tokenizer.")]
    meta += [Meta(k, *TOKENIZER_KEYS[k][:1], v, TOKENIZER_KEYS[k][1]) for k, v in keys.items()]
    write_gguf(out, type(spec)(tuple(meta), spec.tensors, spec.alignment))
    print(f"{out}: {out.stat().st_size:,} bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dump-tokenizer", type=Path, help="write the installed demo model's tokenizer keys here")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer keys written by --dump-tokenizer")
    parser.add_argument("--out", type=Path, help="the GGUF file to write")
    opts = parser.parse_args()
    if opts.dump_tokenizer:
        dump_tokenizer(opts.dump_tokenizer)
    elif opts.tokenizer and opts.out:
        write_model(opts.tokenizer, opts.out)
    else:
        parser.error("give --dump-tokenizer PATH, or --tokenizer PATH and --out PATH")


if __name__ == "__main__":
    main()
