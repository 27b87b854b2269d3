"""Facts about this host and its model files: GGUF headers, the memory guard, the host summary."""
