"""A Hugging Face `tokenizer.json` from a GGUF's byte-level BPE vocabulary, for load generators that cut
their prompts with the `tokenizers` library and cannot download the model's own tokenizer (llama-benchy
on a machine without network access: scripts/bench/serve_benchy.sh).

    python3 scripts/bench/gguf_tokenizer_json.py MODEL.gguf OUT.json

The vocabulary and merges are the file's (`tokenizer.ggml.tokens`, `tokenizer.ggml.merges`; the tokens
already in GPT-2's byte-to-unicode form, as llama.cpp's converter writes them); control tokens become
special added tokens. The pre-tokenizer is GPT-2's byte-level split, not the file's `tokenizer.ggml.pre`
regular expression: counts of ordinary prose come out within a few tokens of the server's, which is what a
load generator needs to size a prompt (llama-benchy then corrects the size from the server's usage counts).
Only "gpt2" vocabularies are converted; any other kind is refused with a message.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hipcore.gguf.file import read_plan  # noqa: E402

TOKEN_TYPE_CONTROL = 3


def tokenizer_json(metadata) -> dict:
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise SystemExit(f"only byte-level BPE ('gpt2') vocabularies convert; this file's is {kind!r}")
    tokens = list(metadata["tokenizer.ggml.tokens"])
    merges = list(metadata.get("tokenizer.ggml.merges", ()))
    types = list(metadata.get("tokenizer.ggml.token_type", ()))
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, t in enumerate(tokens) if i < len(types) and types[i] == TOKEN_TYPE_CONTROL]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a GGUF file with a byte-level BPE ('gpt2') vocabulary")
    parser.add_argument("out", type=Path, help="where to write tokenizer.json")
    args = parser.parse_args()
    plan = read_plan(args.model)
    args.out.write_text(json.dumps(tokenizer_json(plan.metadata), ensure_ascii=False))
    print(f"{args.out}: {len(plan.metadata['tokenizer.ggml.tokens'])} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
