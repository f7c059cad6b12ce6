"""hipcore: the rocmforge engine library (GGUF loading, device runtime, KV cache, engine).

Importable and usable without the CLI. Imports flow one way: rocmforge_cli -> profiles -> hipcore,
and hipcore.runtime imports nothing else of the project.
"""

__version__ = "0.1.0"
