"""hipcore: the rocmforge engine library (GGUF loading, device runtime, KV cache, engine).

Importable and usable without the CLI. The packages are layers (docs/architecture.md, "Layers"): engine ->
model -> ops -> gguf / tokenizer / kvcache -> errors -> runtime, and hipcore.runtime imports nothing else
of the project.
"""

__version__ = "0.1.0"
