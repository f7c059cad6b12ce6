"""Record llama.cpp's token ids on the tiny Phi-3-style vocabulary of tests/support/phi3_vocab.py, under a Phi-3
name and another, as golden data for tests/test_tokenizer_phi3.py (tests/golden/tokenizer_phi3.json).

    VENV/bin/python scripts/golden/record_tokenizer_phi3.py [--real PATH]

(the scratch venv with llama-cpp-python built from its sdist and the gguf package). --real: llama.cpp's own
models/ggml-vocab-phi-3.gguf (in the llama.cpp sources); its ids on the same texts are printed beside ours,
not recorded (our project's Python computes ours: run it with that Python's hipcore on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import llama_cpp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from support.phi3_vocab import NAMES, TEXTS, write_phi3_vocab  # noqa: E402

OUT = ROOT / "tests" / "golden" / "tokenizer_phi3.json"


def ids(path: Path) -> list[list[int]]:
    llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    return [llm.tokenize(text.encode("utf-8"), add_bos=True, special=True) for text in TEXTS]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", type=Path, help="llama.cpp's models/ggml-vocab-phi-3.gguf, to print its ids")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        recorded = {key: ids(write_phi3_vocab(Path(folder) / f"{key}.gguf", name)) for key, name in NAMES.items()}
    golden = {"about": "llama.cpp's ids on tests/support/phi3_vocab.py; scripts/golden/record_tokenizer_phi3.py",
              "llama_cpp_python_version": llama_cpp.__version__, "texts": list(TEXTS), "ids": recorded}
    OUT.write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}", file=sys.stderr)
    if args.real:
        print(json.dumps({"real_phi3_vocab_ids": ids(args.real)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
