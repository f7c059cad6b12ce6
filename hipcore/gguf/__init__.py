"""The GGUF file format: the bounded header reader, the frozen tensor plan, quant block sizes, the
metadata keys and the ModelConfig read from them (docs/architecture.md, "Layers").

Everything here treats the file as untrusted input and imports nothing above hipcore.errors.
"""
