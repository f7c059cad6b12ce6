"""One module per model family, each a Family composed of the shared blocks (hipcore/model/blocks.py).

Adding a family: describe what its files hold in hipcore/gguf/architectures.py, write its layer here from
the blocks (adding a block where it computes something new), and register it below.
"""

from __future__ import annotations

from hipcore.errors import UnsupportedModelError
from hipcore.model.blocks import Family
from hipcore.model.families import gemma2, gemma3, gpt_oss, llama, phi3, qwen2, qwen2moe, qwen3, qwen3moe

FAMILIES: dict[str, Family] = {f.name: f for f in (llama.FAMILY, qwen2.FAMILY, qwen3.FAMILY, gemma2.FAMILY,
                                                  gemma3.FAMILY, phi3.FAMILY, qwen3moe.FAMILY,
                                                  gpt_oss.FAMILY, qwen2moe.FAMILY)}


def family_for(architecture: str) -> Family:
    family = FAMILIES.get(architecture)
    if family is None:
        raise UnsupportedModelError(f"architecture {architecture!r} has no forward pass (supported: "
                                    f"{', '.join(sorted(FAMILIES))})")
    return family
