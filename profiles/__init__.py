"""Memory-profiling workloads and reports: KV sweeps, model presets, the leak check."""
