"""Model configuration, weights on the device, and the forward pass (one module per architecture)."""
