"""The OpenAI-compatible HTTP layer over the engine (`rocmforge serve`); see docs/architecture.md, "Serving"."""
