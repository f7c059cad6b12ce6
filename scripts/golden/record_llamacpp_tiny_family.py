"""Record llama.cpp's logits and greedy tokens on the tiny models of one more family (phi3, gemma2), as
golden data for tests/test_golden_<family>.py; the sibling of record_llamacpp_gemma3.py, with the same
fields and settings, the family's models and prompts read from tests/support/<family>_models.py.

    /tmp/lcpp-venv/bin/python scripts/golden/record_llamacpp_tiny_family.py phi3

(the scratch venv with llama-cpp-python built from its sdist and the gguf package; see
record_llamacpp_families.py). The models are written by the tests' own code from fixed seeds, so the test
rebuilds the identical file and checks its sha256 against the one recorded.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib
import json
import sys
import tempfile
from pathlib import Path

import llama_cpp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_llamacpp import record_prompt, without_amx_buffers  # noqa: E402

FAMILIES = ("phi3", "gemma2")


def record_model(models, name: str, folder: Path, threads: int) -> dict:
    spec = getattr(models, f"{models.FAMILY.upper()}_MODELS")[name]
    path = models.write_model(name, folder)
    llm = llama_cpp.Llama(str(path), n_ctx=256, n_batch=256, n_ubatch=256, logits_all=True,
                          n_threads=threads, n_threads_batch=threads, verbose=False)
    prompts = {}
    for prompt, text in models.PROMPTS.items():
        rec = record_prompt(llm, text, models.GREEDY_TOKENS)
        for key in ("prompt_top_ids", "prompt_top_logits", "greedy_text"):  # not compared; random weights
            rec.pop(key)
        prompts[prompt] = rec
    return {"spec": dict(spec), "model_sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "prompts": prompts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("family", choices=FAMILIES)
    parser.add_argument("--out", type=Path, help="where to write the JSON (tests/golden/<family>_llamacpp.json)")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    args = parser.parse_args()
    models = importlib.import_module(f"support.{args.family}_models")
    out = args.out or ROOT / "tests" / "golden" / f"{args.family}_llamacpp.json"
    without_amx_buffers()
    names = getattr(models, f"{args.family.upper()}_MODELS")
    with tempfile.TemporaryDirectory() as folder:
        recorded = {name: record_model(models, name, Path(folder), args.threads) for name in names}
    golden = {
        "about": f"llama.cpp on the tiny {args.family} models; written by scripts/golden/record_llamacpp_tiny_family.py",
        "llama_cpp_python_version": llama_cpp.__version__,
        "recorded_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "settings": {"n_threads": args.threads, "kv_cache": "f16", "flash_attn": False, "use_extra_bufts": False},
        "models": recorded,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")
    for name, model in recorded.items():
        for prompt, rec in model["prompts"].items():
            print(f"{name} {prompt}: {len(rec['prompt_ids'])} prompt tokens -> {rec['greedy_ids']}", file=sys.stderr)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
