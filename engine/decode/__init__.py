"""The decode loop: attention backends and their metadata, drafters and token trees, speculative steps, chunked prefill and CUDA-graph capture."""
