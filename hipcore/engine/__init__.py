"""Requests, the scheduler, the sampler and the Engine (submit, step, stream, cancel, one release path for
every ending), and the loader that puts a model, its KV cache and an engine together
(docs/architecture.md, "The path of a request")."""
