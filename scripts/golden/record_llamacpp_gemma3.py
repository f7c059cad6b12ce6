"""Record llama.cpp's logits and greedy tokens on the tiny gemma3 models of tests/support/gemma3_models.py,
as golden data for tests/test_golden_gemma3.py (the sibling of record_llamacpp_families.py, whose recording
it reuses: the same fields, the same settings).

    /tmp/lcpp-venv/bin/python scripts/golden/record_llamacpp_gemma3.py

(the scratch venv with llama-cpp-python built from its sdist and the gguf package; see
record_llamacpp_families.py). The models are written by the tests' own code from fixed seeds, so the test
rebuilds the identical file and checks its sha256 against the one recorded.
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
from support.gemma3_models import GEMMA3_MODELS, GREEDY_TOKENS, PROMPTS, write_gemma3_model  # noqa: E402

DEFAULT_OUT = ROOT / "tests" / "golden" / "gemma3_llamacpp.json"


def record_model(name: str, folder: Path, threads: int) -> dict:
    path = write_gemma3_model(name, folder)
    llm = llama_cpp.Llama(str(path), n_ctx=256, n_batch=256, n_ubatch=256, logits_all=True,
                          n_threads=threads, n_threads_batch=threads, verbose=False)
    prompts = {}
    for prompt, text in PROMPTS.items():
        rec = record_prompt(llm, text, GREEDY_TOKENS)
        for key in ("prompt_top_ids", "prompt_top_logits", "greedy_text"):  # not compared; random weights
            rec.pop(key)
        prompts[prompt] = rec
    return {"spec": {k: v for k, v in GEMMA3_MODELS[name].items()},
            "model_sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "prompts": prompts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    args = parser.parse_args()
    without_amx_buffers()
    with tempfile.TemporaryDirectory() as folder:
        models = {name: record_model(name, Path(folder), args.threads) for name in GEMMA3_MODELS}
    golden = {
        "about": "llama.cpp on the tiny gemma3 models; written by scripts/golden/record_llamacpp_gemma3.py",
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
