"""The table of scripts/bench/moe_vs_llamacpp.sh: the markdown that `rocmforge bench --llama-bench ...` prints (one
file per shape) in, one table out: shape x test: rocmforge, llama.cpp, ratio, issue 51's target, device, commit; then
the notes of what was skipped or cut.

    python scripts/bench/moe_table.py RESULTS_DIR [DEVICE] [COMMIT] > table.md

RESULTS_DIR holds <shape>.md (bench's stdout), skipped.txt (one line per thing not done, with why) and, where the
script measured VARIANT's settings too, <shape>@variant.md (rocmforge alone) and variant.txt (the settings): those
rows read "<shape> with <settings>" against the llama.cpp figures of <shape>.md. bench prints
each row as soon as its test is measured and its foot (device, commit) at the end, so a run stopped at its deadline
keeps the rows it measured: DEVICE and COMMIT stand in for the foot it never printed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# issue 51's targets, by bench's test name
TARGETS = {"pp512": 1.1, "tg128": 1.2, "b8x128": 1.2, "b32x128": 1.2, "tg128 @ d4096": 1.1}
SHOWN = {"pp512": "pp512", "tg128": "tg128", "b8x128": "8 sequences x 128", "b32x128": "32 sequences x 128",
         "tg128 @ d4096": "tg128 after 4,096 tokens"}
EXPECTED_TESTS = tuple(TARGETS)
HEAD = ["| shape | test | rocmforge t/s | llama.cpp t/s | ratio | target | device | commit |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |"]
_FIGURE = re.compile(r"^([0-9.]+) ± ([0-9.]+)$")


def figure(cell: str) -> tuple[float, float] | None:
    """bench's "1234.56 ± 7.89" as (mean, sd); None for "-"."""
    match = _FIGURE.match(cell.strip())
    return (float(match.group(1)), float(match.group(2))) if match else None


def shown(fig: tuple[float, float] | None) -> str:
    if fig is None:
        return "-"
    digits = 1 if fig[0] < 10_000 else 0
    return f"{fig[0]:,.{digits}f} ± {fig[1]:,.{digits}f}"


def read_bench(text: str) -> tuple[list[tuple[str, tuple | None, tuple | None]], str | None, str | None, list[str]]:
    """(test, ours, llama.cpp's) per row of bench's table, its device and commit (None where the foot is missing),
    and its notes."""
    rows, device, commit, notes = [], None, None, []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 7 and figure(cells[6]):
            rows.append((cells[5], figure(cells[6]), figure(cells[7]) if len(cells) > 7 else None))
        elif line.startswith("device: "):
            device = line[len("device: "):].split(",")[0]  # the card's name, not its free memory at the time
        elif line.startswith("quant: ") and "commit: " in line:
            commit = line.split("commit: ")[1].split(";")[0].strip()
        elif line.startswith("note: "):
            notes.append(line[len("note: "):])
    return rows, device, commit, notes


VARIANT_SUFFIX = "@variant"


def table(results: Path, device: str = "?", commit: str = "?") -> str:
    lines, notes = list(HEAD), []
    variant_file = results / "variant.txt"
    variant = variant_file.read_text().strip() if variant_file.is_file() else "other settings"
    read = {path.stem: read_bench(path.read_text(errors="replace")) for path in results.glob("*.md")}
    # each shape, then its variant's rows, with the shape's llama.cpp figures
    for stem in sorted(read, key=lambda s: (s.removesuffix(VARIANT_SUFFIX), s.endswith(VARIANT_SUFFIX))):
        rows, found_device, found_commit, bench_notes = read[stem]
        shape = stem
        if stem.endswith(VARIANT_SUFFIX):
            base = stem.removesuffix(VARIANT_SUFFIX)
            shape = f"{base} with {variant}"
            theirs_by_test = {test: theirs for test, _, theirs in read.get(base, ([],))[0]}
            rows = [(test, ours, theirs or theirs_by_test.get(test)) for test, ours, theirs in rows]
        if found_commit is None:
            done = {test for test, _, _ in rows}
            missing = [SHOWN[t] for t in EXPECTED_TESTS if t not in done]
            notes.append(f"{shape}: bench did not finish (no foot); " +
                         (f"not measured: {', '.join(missing)}" if missing else "every test's row is there"))
        for test, ours, theirs in rows:
            target = TARGETS.get(test)
            ratio = ours[0] / theirs[0] if theirs and theirs[0] else None
            cell = "-" if ratio is None else (f"**{ratio:.2f}**" if target and ratio >= target else f"{ratio:.2f}")
            lines.append(f"| {shape} | {SHOWN.get(test, test)} | {shown(ours)} | {shown(theirs)} | {cell} | "
                         f"{f'>= {target}' if target else '-'} | {found_device or device} | "
                         f"{found_commit or commit} |")
        notes += [f"{shape}: {n}" for n in bench_notes]
    skipped = results / "skipped.txt"
    if skipped.is_file():
        notes += [line for line in skipped.read_text().splitlines() if line.strip()]
    if len(lines) == len(HEAD):
        lines.append("| (nothing measured) | | | | | | | |")
    foot = ["", "Bold: at or above issue 51's target. rocmforge's and llama.cpp's figures: mean ± sd of the runs, "
            "t/s."]
    return "\n".join(lines + foot + ["- " + re.sub(r"\s+", " ", n) for n in notes]) + "\n"


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 3 or not Path(argv[0]).is_dir():
        print("usage: python scripts/bench/moe_table.py RESULTS_DIR [DEVICE] [COMMIT]", file=sys.stderr)
        return 2
    sys.stdout.write(table(Path(argv[0]), *argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
