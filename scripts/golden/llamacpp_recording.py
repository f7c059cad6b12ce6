"""What every llama.cpp golden recorder in scripts/golden/ shares: loading a model in llama-cpp-python with the
ordinary CPU kernels, recording a prompt (its logits, a greedy continuation, the same again in one batch), and
writing the JSON with its provenance (the recorder, llama-cpp-python's version, the time, the settings).

Run the recorders with a venv that has llama-cpp-python 0.3.36 (built from its PyPI sdist) and the gguf package,
never dependencies of rocmforge:

    python3 -m venv VENV
    CMAKE_ARGS="-DGGML_NATIVE=OFF" VENV/bin/pip install llama-cpp-python==0.3.36 gguf
    VENV/bin/python scripts/golden/record_llamacpp_families.py

Numerics worth knowing when reading the data: llama.cpp's CPU matmuls quantize the activations (to Q8_1 for
Q4_1 weights, Q8_0 for Q8_0 ones) and keep the KV cache, Q and the attention probabilities in float16; our
cpu backend is float32 throughout.

AMX: on CPUs with AMX tiles llama.cpp 0.3.36's AMX matmul path crashes inside llama_decode (SIGSEGV in
ggml_backend_amx_mul_mat). without_amx_buffers turns off the "extra buffer types" (use_extra_bufts = False),
which selects the ordinary CPU kernels every non-AMX machine uses.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

import llama_cpp
import llama_cpp.llama_cpp as llama_lowlevel

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
sys.path.insert(0, str(ROOT / "tests"))  # the recorders read the tests' own models and prompts (support.*)

TOP_PROMPT = 4   # ids and logits at every prompt position
TOP_LAST = 64    # at the last prompt position: the test compares the top-10, the next tell a boundary swap
TOP_STEP = 10    # at every greedy step
# Fields of record_prompt that the tiny random-weight models' tests do not compare.
NOT_COMPARED_ON_RANDOM_WEIGHTS = ("prompt_top_ids", "prompt_top_logits", "greedy_text")


def without_amx_buffers() -> None:
    """Make every model load with use_extra_bufts = False (see the module docstring)."""
    original = llama_lowlevel.llama_model_default_params

    def params():
        p = original()
        p.use_extra_bufts = False
        return p

    llama_lowlevel.llama_model_default_params = params


def open_model(path: Path, n_ctx: int, threads: int, **options) -> llama_cpp.Llama:
    """The model with every position's logits kept, a batch of the whole context; AMX buffers off."""
    without_amx_buffers()
    return llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
                           n_threads=threads, n_threads_batch=threads, verbose=False, **options)


def top(logits: np.ndarray, k: int) -> tuple[list[int], list[float]]:
    ids = np.argsort(-logits, kind="stable")[:k]
    return [int(i) for i in ids], [round(float(logits[i]), 5) for i in ids]


def record_prompt(llm: llama_cpp.Llama, text: str, n_generate: int, drop: tuple[str, ...] = ()) -> dict:
    """llama.cpp's own tokenization of text (BOS added, special tokens parsed); every prompt position's top-4;
    the last position's top-64; a greedy continuation of n_generate tokens generated one at a time as llama-cli
    does, with each step's top-10; the same prompt + continuation evaluated again in ONE batch, with every
    continuation position's top-10 (the teacher-forced view the tests reproduce). drop: fields left out."""
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
    llm.reset()
    llm.eval(tokens)
    prompt_logits = np.array(llm.scores[:llm.n_tokens], dtype=np.float32)
    positions = [top(row, TOP_PROMPT) for row in prompt_logits]
    last_ids, last_logits = top(prompt_logits[-1], TOP_LAST)

    generated, step_top = [], []
    logits = prompt_logits[-1]
    for _ in range(n_generate):
        ids, values = top(logits, TOP_STEP)
        step_top.append({"ids": ids, "logits": values})
        generated.append(ids[0])
        llm.eval([ids[0]])
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)

    llm.reset()
    llm.eval(tokens + generated)
    batched = np.array(llm.scores[:llm.n_tokens], dtype=np.float32)
    forced_top = []
    for row in batched[len(tokens) - 1:len(tokens) - 1 + n_generate]:
        ids, values = top(row, TOP_STEP)
        forced_top.append({"ids": ids, "logits": values})

    record = {
        "text": text,
        "prompt_ids": [int(t) for t in tokens],
        "prompt_top_ids": [p[0] for p in positions],
        "prompt_top_logits": [p[1] for p in positions],
        "last_top_ids": last_ids,
        "last_top_logits": last_logits,
        "greedy_ids": generated,
        "greedy_text": llm.detokenize(generated).decode("utf-8", errors="replace"),
        "greedy_step_top": step_top,
        "forced_step_top": forced_top,
    }
    for key in drop:
        record.pop(key)
    return record


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def settings(threads: int, n_ctx: int | None = None, n_batch: int | None = None) -> dict:
    """The recorded settings: KV cache f16, flash attention off, AMX buffers off."""
    out: dict = {"n_threads": threads}
    if n_ctx is not None:
        out["n_ctx"] = n_ctx
    out.update({"kv_cache": "f16", "flash_attn": False, "use_extra_bufts": False})
    if n_batch is not None:
        out["n_batch"] = n_batch
    return out


def golden_file(about: str, recorder: str, model: Mapping | None = None, **body) -> dict:
    """The JSON's provenance (what, which recorder, llama-cpp-python's version, model fields where given, the
    time), then body's fields in order (settings first where the recorder has them)."""
    golden = {"about": f"{about}; written by {Path(recorder).resolve().relative_to(ROOT)}",
              "llama_cpp_python_version": llama_cpp.__version__}
    golden.update(model or {})
    golden["recorded_utc"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    golden.update(body)
    return golden


def write_golden(out: Path, golden: dict, ensure_ascii: bool = True) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(golden, indent=1, ensure_ascii=ensure_ascii) + "\n", encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)


def record_tiny_models(specs: Mapping[str, Mapping], write_model: Callable[[str, Path], Path],
                       prompts: Mapping[str, str], greedy_tokens: int, threads: int) -> dict:
    """Each tiny model of specs, written by the tests' own code from fixed seeds (so that a test rebuilds the
    identical file and checks its sha256), recorded on every prompt; the random weights' text not kept."""
    models = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, spec in specs.items():
            path = write_model(name, Path(folder))
            llm = open_model(path, 256, threads)
            recorded = {prompt: record_prompt(llm, text, greedy_tokens, drop=NOT_COMPARED_ON_RANDOM_WEIGHTS)
                        for prompt, text in prompts.items()}
            models[name] = {"spec": dict(spec), "model_sha256": sha256(path), "prompts": recorded}
            for prompt, rec in recorded.items():
                print(f"{name} {prompt}: {len(rec['prompt_ids'])} prompt tokens -> {rec['greedy_ids']}",
                      file=sys.stderr)
    return models


def record_tiny_family(about: str, recorder: str, out: Path, specs: Mapping[str, Mapping],
                       write_model: Callable[[str, Path], Path], prompts: Mapping[str, str], greedy_tokens: int,
                       threads: int) -> int:
    """The whole of a tiny family's recorder: its models recorded and written to out."""
    models = record_tiny_models(specs, write_model, prompts, greedy_tokens, threads)
    write_golden(out, golden_file(about, recorder, settings=settings(threads), models=models))
    return 0
