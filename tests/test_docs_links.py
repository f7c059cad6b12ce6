"""Every relative link in README.md and docs/ (docs/history/ included) points at a file that exists, and every
#anchor at a heading of its page: the docs move detail into dated notes, and a link left behind would break quietly."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as '-'."""
    found = set()
    for line in page.read_text().splitlines():
        heading = re.match(r"#+\s+(.*)", line)
        if heading:
            found.add(re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-"))
    return found


def broken_links(pages: list[Path], root: Path = ROOT) -> list[str]:
    broken = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            linked = (page.parent / path) if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(root)}: {target} (no such file)")
            elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
                broken.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return broken


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "history").glob("*.md"))]


def test_every_relative_link_resolves():
    assert broken_links(pages()) == []


def test_a_broken_link_and_a_broken_anchor_are_found(tmp_path):
    (tmp_path / "there.md").write_text("# A heading\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#a-heading) [gone](missing.md) [bad](there.md#no-heading) [web](https://x.org/y)\n")
    assert broken_links([page], tmp_path) == ["page.md: missing.md (no such file)",
                                              "page.md: there.md#no-heading (no such heading)"]
