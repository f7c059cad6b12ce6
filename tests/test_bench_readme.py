"""scripts/bench/README.md names every tool in scripts/bench/ and no tool that is not there (a missing line and a
line for a removed tool, planted, are both found)."""

from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench"


def mismatches(readme: str, files: set[str]) -> tuple[set[str], set[str]]:
    """(tools the README does not name, names in the README's first column that are no file)."""
    named = set(re.findall(r"^\| `([\w.-]+\.(?:py|sh))` \|", readme, re.M))
    mentioned = set(re.findall(r"`([\w.-]+\.(?:py|sh))`", readme))
    return files - mentioned, named - files


def test_the_readme_lists_every_tool():
    files = {p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh")}
    readme = (BENCH / "README.md").read_text()
    assert mismatches(readme, files) == (set(), set())
    dropped = readme.replace("`serve_overhead.py`", "`serve overhead`")
    assert mismatches(dropped, files)[0] == {"serve_overhead.py"}
    stale = readme + "| `measure_launch.py` | per-launch cost | `python3 scripts/bench/measure_launch.py` |\n"
    assert mismatches(stale, files)[1] == {"measure_launch.py"}
