"""Text to token ids and back: the vocabulary from GGUF metadata, the BPE and SentencePiece encoders, and the
chat template rendered in a sandbox (docs/architecture.md, "Layers")."""
