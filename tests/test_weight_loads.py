"""The decode products read their weights through kernels/weight_loads.h: on NVIDIA with an L2 evict-first
policy, so that a step's weight stream does not push the KV cache, x and the kernels' code out of L2 (measured
on an NVIDIA H200: the 8B-shape decode step 2,536 -> 2,330 us, docs/history/2026-11-28-l2-evict-first.md). These
checks keep a format from quietly going back to plain loads, and keep the two measured traps out: loads that skip
L1 (Q6_K's products ran at half speed) and a policy on AMD, where nothing was measured."""

from __future__ import annotations

import re

import pytest

from hipcore.runtime.kernels import kernels_dir
from support.kernel_source_text import braced_block

FORMAT_FILES = ("qmatvec_formats.h", "fused_matvec_formats.h")
THROUGH = re.compile(r"\bload_weights(16|4|2)\(|\bload_words<")
PLAIN_ON_PURPOSE = {"F32Format"}  # fused_matvec_formats.h: F32 weights (rare in decode) keep float4 loads


def load_bodies(text: str) -> dict[str, str]:
    """{format struct: the body of its `Raw load(...)`}, by brace counting."""
    bodies = {}
    for struct in re.finditer(r"^struct (\w+Format) \{", text, re.M):
        start = text.find("Raw load(", struct.end())
        next_struct = text.find("\nstruct ", struct.end())
        if start < 0 or (0 <= next_struct < start):
            continue
        bodies[struct.group(1)] = braced_block(text, text.index("{", start))
    return bodies


@pytest.mark.parametrize("name", FORMAT_FILES)
def test_every_format_reads_its_weights_through_weight_loads(name):
    text = (kernels_dir() / name).read_text()
    assert '#include "weight_loads.h"' in text
    bodies = load_bodies(text)
    assert len(bodies) >= 5, f"{name}: the formats' load functions were not found ({sorted(bodies)})"
    plain = [fmt for fmt, body in bodies.items() if not THROUGH.search(body) and fmt not in PLAIN_ON_PURPOSE]
    assert not plain, f"{name}: {', '.join(plain)} read their weights with plain loads"


def test_the_parser_sees_a_plain_load():
    # the check above must be able to fail: a format whose load dereferences the row is reported
    text = ("struct XFormat {\n  struct Raw { uint4 q; };\n"
            "  static __device__ __forceinline__ Raw load(const unsigned char* row, int item) {\n"
            "    return {*reinterpret_cast<const uint4*>(row + 16 * item)};\n  }\n};\n")
    bodies = load_bodies(text)
    assert list(bodies) == ["XFormat"] and not THROUGH.search(bodies["XFormat"])
    assert THROUGH.search(bodies["XFormat"].replace("*reinterpret_cast<const uint4*>(", "load_weights16(("))


def test_weight_loads_evict_first_on_nvidia_and_keep_l1():
    text = (kernels_dir() / "weight_loads.h").read_text()
    nvidia, _, other = text.partition("#else")
    assert "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800" in nvidia
    assert "createpolicy.fractional.L2::evict_first" in nvidia
    loads = re.findall(r'"ld\.global[^"]*"', nvidia)
    assert len(loads) == 3 and all("L2::cache_hint" in ld for ld in loads)
    assert not any("no_allocate" in ld for ld in loads)  # Q6_K's 4-byte words need L1
    assert "asm" not in other  # AMD and the host pass: plain loads
