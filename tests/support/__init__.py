"""Helpers shared by the tests and the scripts: tiny GGUF writers, engine drivers, kernel-emulation builds,
fake GPU drivers. Imported as `support.<module>` (tests/ is on sys.path under pytest; scripts add it)."""
