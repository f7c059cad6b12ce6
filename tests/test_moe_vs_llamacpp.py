"""scripts/bench/moe_vs_llamacpp.sh and its table (scripts/bench/moe_table.py), without a GPU: the table read from
`rocmforge bench`'s own markdown (made here by rocmforge_cli.bench from a BenchReport with llama-bench's and
llama-batched-bench's records), a run cut at its deadline, and the script's account of what it could not do when
the build and the models are missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from profiles.bench import BenchReport
from profiles.bench import TestResult as Result  # not collected as a test class
from rocmforge_cli.bench import markdown, table_head, table_row

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts" / "bench"))

import moe_table  # noqa: E402

H100 = "cuda:0 NVIDIA H100 80GB HBM3 (sm_90), 79.2 GiB total, 78.0 GiB free"


def report(results: list[Result], llama_bench=(), batched=(), notes=()) -> BenchReport:
    return BenchReport(model="m.gguf", model_path="/m/m.gguf", quant="Q4_K", model_bytes=1, params=1, device=H100,
                       backend="cuda", kv_dtype="f16", graphs=True, commit="0123abcd",
                       date="2026-12-06T07:00:00+00:00", results=results, llama_bench=list(llama_bench),
                       llama_batched_bench=list(batched), notes=list(notes))


def llama_bench_record(n_prompt: int, n_gen: int, avg: float, depth: int = 0) -> dict:
    """A record as llama-bench -o json writes it (the fields bench reads)."""
    return {"n_prompt": n_prompt, "n_gen": n_gen, "n_depth": depth, "avg_ts": avg, "stddev_ts": 1.5}


def as_bench_prints_it(r: BenchReport) -> str:
    """bench's stdout in md: the header and each row as its test ends, then the foot (markdown())."""
    return markdown(r) + "\n"


def test_table_pairs_each_test_with_llama_cpps_figure_and_marks_the_targets_met(tmp_path):
    qwen = report([Result("pp512", 512, 0, 1, [5000.0, 5200.0]), Result("tg128", 0, 128, 1, [230.0, 230.0]),
                   Result("tg128 @ d4096", 0, 128, 1, [180.0])],
                  llama_bench=[llama_bench_record(512, 0, 4000.0), llama_bench_record(0, 128, 200.0),
                               llama_bench_record(0, 128, 150.0, 4096), llama_bench_record(512, 0, 3000.0, 4096)])
    oss = report([Result("b8x128", 0, 128, 8, [900.0]), Result("b32x128", 0, 128, 32, [2000.0])],
                 batched=[{"test": "b8x128", "avg_ts": 1000.0, "stddev_ts": 3.0}],
                 notes=["kernels compiled at run time"])
    (tmp_path / "Qwen3-30B-A3B.md").write_text(as_bench_prints_it(qwen))
    (tmp_path / "gpt-oss-20b.md").write_text(as_bench_prints_it(oss))
    (tmp_path / "skipped.txt").write_text("gpt-oss-20b: an earlier line\n")
    lines = moe_table.table(tmp_path, "unused", "unused").splitlines()
    card = "cuda:0 NVIDIA H100 80GB HBM3 (sm_90)"  # bench's device without its free memory
    assert [line for line in lines if line.startswith(("| Qwen", "| gpt"))] == [
        f"| Qwen3-30B-A3B | pp512 | 5,100.0 ± 141.4 | 4,000.0 ± 1.5 | **1.27** | >= 1.1 | {card} | 0123abcd |",
        f"| Qwen3-30B-A3B | tg128 | 230.0 ± 0.0 | 200.0 ± 1.5 | 1.15 | >= 1.2 | {card} | 0123abcd |",
        f"| Qwen3-30B-A3B | tg128 after 4,096 tokens | 180.0 ± 0.0 | 150.0 ± 1.5 | **1.20** | >= 1.1 | {card} | "
        "0123abcd |",
        f"| gpt-oss-20b | 8 sequences x 128 | 900.0 ± 0.0 | 1,000.0 ± 3.0 | 0.90 | >= 1.2 | {card} | 0123abcd |",
        f"| gpt-oss-20b | 32 sequences x 128 | 2,000.0 ± 0.0 | - | - | >= 1.2 | {card} | 0123abcd |",
    ]
    assert "- gpt-oss-20b: kernels compiled at run time" in lines and "- gpt-oss-20b: an earlier line" in lines
    assert not any("did not finish" in line for line in lines)


def test_a_run_cut_at_its_deadline_keeps_its_rows_and_names_the_tests_it_lost(tmp_path):
    """bench stopped after two tests: their rows (printed as each ended), no foot; DEVICE and COMMIT stand in."""
    cut = report([Result("pp512", 512, 0, 1, [5000.0]), Result("tg128", 0, 128, 1, [230.0])],
                 llama_bench=[llama_bench_record(512, 0, 4000.0), llama_bench_record(0, 128, 200.0)])
    theirs = cut.llama_cpp_figures()
    (tmp_path / "gpt-oss-20b.md").write_text("\n".join(table_head(cut) + [table_row(cut, r, theirs)
                                                                          for r in cut.results]) + "\n")
    text = moe_table.table(tmp_path, "NVIDIA H100 80GB HBM3", "abcdef0123")
    row = "| gpt-oss-20b | tg128 | 230.0 ± 0.0 | 200.0 ± 1.5 | 1.15 | >= 1.2 | NVIDIA H100 80GB HBM3 | abcdef0123 |"
    assert row in text
    assert ("- gpt-oss-20b: bench did not finish (no foot); not measured: 8 sequences x 128, 32 sequences x 128, "
            "tg128 after 4,096 tokens") in text


def test_a_variants_rows_follow_its_shape_against_the_same_llama_cpp_figures(tmp_path):
    """VARIANT's bench (rocmforge alone, <shape>@variant.md) is shown after its shape, named with the settings, its
    ratio taken against the shape's llama.cpp figure of the same test."""
    base = report([Result("b8x128", 0, 128, 8, [900.0])], batched=[{"test": "b8x128", "avg_ts": 1000.0,
                                                                    "stddev_ts": 3.0}])
    variant = report([Result("b8x128", 0, 128, 8, [1300.0]), Result("pp512", 512, 0, 1, [7000.0])])
    (tmp_path / "gpt-oss-20b.md").write_text(as_bench_prints_it(base))
    (tmp_path / "gpt-oss-20b@variant.md").write_text(as_bench_prints_it(variant))
    (tmp_path / "variant.txt").write_text("ROCMFORGE_MMA_FIRST_MIN_COLS=2880\n")
    rows = [line for line in moe_table.table(tmp_path).splitlines() if line.startswith("| gpt")]
    card = "cuda:0 NVIDIA H100 80GB HBM3 (sm_90)"
    assert rows == [
        f"| gpt-oss-20b | 8 sequences x 128 | 900.0 ± 0.0 | 1,000.0 ± 3.0 | 0.90 | >= 1.2 | {card} | 0123abcd |",
        f"| gpt-oss-20b with ROCMFORGE_MMA_FIRST_MIN_COLS=2880 | 8 sequences x 128 | 1,300.0 ± 0.0 | 1,000.0 ± 3.0 | "
        f"**1.30** | >= 1.2 | {card} | 0123abcd |",
        f"| gpt-oss-20b with ROCMFORGE_MMA_FIRST_MIN_COLS=2880 | pp512 | 7,000.0 ± 0.0 | - | - | >= 1.1 | {card} | "
        "0123abcd |",
    ]


def test_table_says_when_nothing_was_measured(tmp_path):
    (tmp_path / "gpt-oss-20b.md").write_text("")
    text = moe_table.table(tmp_path)
    assert "| (nothing measured) |" in text
    assert "gpt-oss-20b: bench did not finish (no foot); not measured: pp512" in text


def test_script_without_a_build_or_a_tokenizer_writes_a_table_of_what_it_skipped(tmp_path):
    """No tarball, no llama.cpp build and no tokenizer: nothing written or measured, exit 1, and table.md says why
    for each shape (the GPU run's failures read the same way)."""
    env = {**os.environ, "MODELS": str(tmp_path / "models"), "WORK": str(tmp_path / "work"),
           "RESULTS": str(tmp_path / "results"), "TMPDIR": str(tmp_path), "LLAMA_CPP_TARBALL": "",
           "TOKENIZER_MODEL": ""}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "bench" / "moe_vs_llamacpp.sh"), str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| (nothing measured) |" in table
    for shape in ("Qwen3-30B-A3B", "gpt-oss-20b"):
        assert f"- {shape}: not written (no tokenizer file: none given)" in table
    assert "- every shape: not measured, llama.cpp did not build (build.log)" in table
    assert not list((tmp_path / "models").iterdir())


def built_and_written_past_the_deadline(tmp_path) -> dict:
    """The script's environment with llama.cpp's tools and both model files in place (stand-ins that are never run
    or read: no shape starts) and DEADLINE=0."""
    bin_dir = tmp_path / "work" / "llama.cpp" / "build" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("llama-bench", "llama-batched-bench"):  # present, never run: no shape starts
        (bin_dir / tool).write_text("#!/bin/sh\nexit 99\n")
        (bin_dir / tool).chmod(0o755)
    models = tmp_path / "models"
    models.mkdir()
    for name in ("Qwen3-30B-A3B-Q4_K_M.gguf", "gpt-oss-20b-MXFP4_MOE.gguf"):
        (models / name).write_bytes(b"GGUF")
    return {**os.environ, "MODELS": str(models), "WORK": str(tmp_path / "work"), "RESULTS": str(tmp_path / "results"),
            "TMPDIR": str(tmp_path), "DEADLINE": "0", "LLAMA_CPP_TARBALL": "", "TOKENIZER_MODEL": ""}


def test_script_past_its_deadline_starts_no_shape_and_exits_2(tmp_path):
    """DEADLINE=0 with the build and both models in place: no bench starts (none of the three is run), each shape is
    named with the time it lacked, and the exit status says "run again" (2), not failure."""
    env = built_and_written_past_the_deadline(tmp_path)
    proc = subprocess.run(["bash", str(REPO / "scripts" / "bench" / "moe_vs_llamacpp.sh"), str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    table = (tmp_path / "out" / "table.md").read_text()
    for shape in ("Qwen3-30B-A3B", "gpt-oss-20b"):
        assert f"- {shape}: not started, 0s of DEADLINE left (a shape takes about 120s)" in table
    status = (tmp_path / "out" / "status.txt").read_text()
    assert "s bench " not in status and "(exit 2)" in status


def test_profiles_script_profiles_each_model_at_each_batch_and_depth_and_names_what_it_could_not(tmp_path):
    """scripts/bench/moe_profiles.sh on the cpu backend with a tiny gpt-oss file: a profile a (batch, depth), each
    at the depth asked; a missing model is a failure (exit 1) named in status.txt; past DEADLINE nothing starts
    (exit 2)."""
    sys.path.insert(0, str(REPO / "tests"))
    from support.gguf_factory import write_gguf
    from support.moe_models import moe_spec
    model = write_gguf(tmp_path / "tiny-oss.gguf", moe_spec("gpt-oss-mxfp4", context=256))
    script = str(REPO / "scripts" / "bench" / "moe_profiles.sh")
    env = {**os.environ, "DEVICE": "cpu", "PROFILES": "1 2@40", "PROMPT_TOKENS": "0", "TMPDIR": str(tmp_path)}
    out = tmp_path / "out"
    proc = subprocess.run(["bash", script, str(out), str(model), str(tmp_path / "absent.gguf")], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 1, proc.stderr
    assert "One decode step: batch 1, context 128" in (out / "tiny-oss-b1-d128.md").read_text()
    assert "One decode step: batch 2, context 40" in (out / "tiny-oss-b2-d40.md").read_text()
    status = (out / "status.txt").read_text()
    assert "tiny-oss-b2-d40.md rc=0" in status and "absent: no model file" in status and "(exit 1)" in status
    late = subprocess.run(["bash", script, str(tmp_path / "late"), str(model)], capture_output=True, text=True,
                          env={**env, "DEADLINE": "0"}, timeout=120)
    assert late.returncode == 2, late.stderr
    assert "not started, past DEADLINE" in (tmp_path / "late" / "status.txt").read_text()


def test_script_variant_settings_are_checked_and_wait_for_the_deadline(tmp_path):
    """VARIANT words that are not NAME=VALUE measure no variant (a failure, named); good ones past DEADLINE are left
    (exit 2), each shape named with its settings."""
    env = built_and_written_past_the_deadline(tmp_path)
    script = str(REPO / "scripts" / "bench" / "moe_vs_llamacpp.sh")
    bad = subprocess.run(["bash", script, str(tmp_path / "bad")], capture_output=True, text=True, timeout=120,
                         env={**env, "VARIANT": "ROCMFORGE_MMA_FIRST_MIN_COLS=2880 2880"})
    assert bad.returncode == 1, bad.stderr
    assert "- VARIANT: '2880' is not NAME=VALUE; no variant measured" in (tmp_path / "bad" / "table.md").read_text()
    late = subprocess.run(["bash", script, str(tmp_path / "late")], capture_output=True, text=True, timeout=120,
                          env={**env, "VARIANT": "ROCMFORGE_MMA_FIRST_MIN_COLS=2880"})
    assert late.returncode == 2, late.stderr
    table = (tmp_path / "late" / "table.md").read_text()
    for shape in ("Qwen3-30B-A3B", "gpt-oss-20b"):
        assert f"- {shape} with ROCMFORGE_MMA_FIRST_MIN_COLS=2880: not started, 0s of DEADLINE left" in table
