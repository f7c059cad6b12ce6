"""Summarize what scripts/gpu/run_model_checks.sh wrote into OUT: one markdown page, printed last.

    python3 scripts/gpu/summarize_model_checks.py OUT
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TARGETS = {"pp512": 48_000.0, "tg128": 930.0, "b64x128": 11_800.0}  # issue 6, NVIDIA H100, the demo model


def read(out: Path, name: str) -> str:
    path = out / name
    return path.read_text(errors="replace") if path.is_file() else ""


def load_json(out: Path, name: str):
    text = read(out, name)
    start = text.find("{")
    if start < 0:
        return None
    try:
        return json.loads(text[start:])
    except json.JSONDecodeError:
        return None


def main(out: Path) -> None:
    lines = ["# Model checks on the GPU", ""]
    status = dict(re.findall(r"^(\S+) rc=(\d+)", read(out, "status.txt"), flags=re.M))
    seconds = dict(re.findall(r"^(\S+) rc=\d+ seconds=(\d+)", read(out, "status.txt"), flags=re.M))
    lines += ["| step | exit | seconds | result |", "| --- | ---: | ---: | --- |"]
    for name, rc in status.items():
        result = ""
        if name.startswith("tests_"):
            tail = [l for l in read(out, f"{name}.out").splitlines() if re.search(r"\d+ (passed|failed|error)", l)]
            result = tail[-1].strip("= ") if tail else "no pytest summary"
        elif name == "generate":
            result = ("memory plan printed" if "memory plan" in read(out, "generate.log") else "NO memory plan on stderr")
            result += "; text: " + read(out, "generate.out").strip().replace("\n", " ")[:80]
        elif name == "generate_oom":
            log = read(out, "generate_oom.log")
            result = ("exit 5 with the plan" if rc == "5" and "out of memory" in log else "UNEXPECTED: " + log.strip()[-120:])
        elif name == "devices":
            result = read(out, "devices.out").strip().splitlines()[-1][:100] if read(out, "devices.out").strip() else ""
        lines.append(f"| {name} | {rc} | {seconds.get(name, '')} | {result} |")

    figures = load_json(out, "model_gpu_figures.json")
    if figures:
        lines += ["", "## Whole model: GPU against the cpu backend (golden prompts, greedy)", "",
                  "| prompt | first 32 tokens equal | same prefix | max rel. logit diff (last prompt pos.) | prefix equal to llama.cpp |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for name, f in figures.items():
            lines.append(f"| {name} | {f['agree_of_32']} | {f['same_prefix']} | {f['max_rel_logit_diff_last_prompt_pos']:.2e} | "
                         f"{f['llamacpp_greedy_prefix']} |")
    for line in read(out, "tests_model.out").splitlines():
        if line.startswith(("device sampling:", "engine, seeded", "weights:")):
            lines.append(f"- {line}")

    bench = load_json(out, "bench.out")
    if bench:
        from profiles.bench import BenchReport, TestResult
        from rocmforge_cli.bench import markdown

        report = BenchReport(**{k: v for k, v in bench.items() if k != "results"})
        report.results = [TestResult(r["test"], r["n_prompt"], r["n_gen"], r["batch"], r["tokens_per_second"])
                          for r in bench["results"]]
        lines += ["", "## rocmforge bench", "", markdown(report), "", "| test | t/s | target | |", "| --- | ---: | ---: | --- |"]
        for r in report.results:
            if r.test in TARGETS:
                target = TARGETS[r.test]
                lines.append(f"| {r.test} | {r.mean:,.0f} | {target:,.0f} | {'met' if r.mean >= target else 'MISSED'} "
                             f"({r.mean / target:.2f}x) |")
    no_graphs = load_json(out, "bench_no_graphs.out")
    if no_graphs and bench:
        eager = {r["test"]: r["mean"] for r in no_graphs["results"]}
        replay = {r["test"]: r["mean"] for r in bench["results"]}
        for test, value in eager.items():
            if test in replay:
                lines.append(f"- {test} without graphs: {value:,.0f} t/s; with graphs {replay[test]:,.0f} t/s "
                             f"({replay[test] / value:.2f}x)")
    for name in ("bench_profile_b1", "bench_profile_b64"):
        data = load_json(out, f"{name}.out")
        if data and "profile" in data:
            from profiles.decode_profile import DecodeProfile, KernelKind
            from rocmforge_cli.bench import profile_markdown

            p = dict(data["profile"])
            kernels = [KernelKind(k["name"], k["launches"], k["us_per_step"]) for k in p.pop("kernels")]
            for key in ("kernels_us", "floor_us", "host_us"):
                p.pop(key, None)
            lines += ["", profile_markdown(DecodeProfile(kernels=kernels, **p))]
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/rocmforge_model_checks"))
