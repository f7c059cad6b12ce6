"""Record llama.cpp's logits and greedy tokens on the tiny qwen2 and qwen3 models of
tests/support/family_models.py, as golden data for tests/test_golden_families.py.

Run it with the scratch venv that has llama-cpp-python and the gguf package (never dependencies of rocmforge):

    python3 -m venv /tmp/lcpp-venv
    CMAKE_ARGS="-DGGML_NATIVE=OFF" /tmp/lcpp-venv/bin/pip install llama-cpp-python==0.3.36 gguf
    /tmp/lcpp-venv/bin/python scripts/golden/record_llamacpp_families.py

The models are written here by the tests' own code (tests/support/gguf_factory.py, from fixed seeds), so the
test rebuilds the identical file and checks its sha256 against the one recorded. Per model and prompt:
llama.cpp's prompt token ids (its tokenizer, with special tokens parsed), the last prompt position's top-64
ids and logits, 24 greedy tokens generated one at a time with each step's top-10, and the same prompt plus
continuation evaluated again in one batch with every continuation position's top-10. The llama goldens'
script (record_llamacpp.py) explains the AMX setting reused here.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import llama_cpp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_llamacpp import record_prompt, without_amx_buffers  # noqa: E402
from support.family_models import FAMILY_MODELS, GREEDY_TOKENS, PROMPTS, write_family_model  # noqa: E402

DEFAULT_OUT = ROOT / "tests" / "golden" / "families_llamacpp.json"


def record_model(name: str, folder: Path, threads: int) -> dict:
    path = write_family_model(name, folder)
    llm = llama_cpp.Llama(str(path), n_ctx=256, n_batch=256, n_ubatch=256, logits_all=True,
                          n_threads=threads, n_threads_batch=threads, verbose=False)
    prompts = {}
    for prompt, text in PROMPTS.items():
        rec = record_prompt(llm, text, GREEDY_TOKENS)
        for key in ("prompt_top_ids", "prompt_top_logits", "greedy_text"):  # not compared; random weights
            rec.pop(key)
        prompts[prompt] = rec
    return {"spec": {k: v for k, v in FAMILY_MODELS[name].items()},
            "model_sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "prompts": prompts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    args = parser.parse_args()
    without_amx_buffers()
    with tempfile.TemporaryDirectory() as folder:
        models = {name: record_model(name, Path(folder), args.threads) for name in FAMILY_MODELS}
    golden = {
        "about": "llama.cpp on the tiny family models; written by scripts/golden/record_llamacpp_families.py",
        "llama_cpp_python_version": llama_cpp.__version__,
        "recorded_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "settings": {"n_threads": args.threads, "kv_cache": "f16", "flash_attn": False, "use_extra_bufts": False},
        "models": models,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")
    for name, model in models.items():
        for prompt, rec in model["prompts"].items():
            print(f"{name} {prompt}: {len(rec['prompt_ids'])} prompt tokens -> {rec['greedy_ids']}", file=sys.stderr)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
