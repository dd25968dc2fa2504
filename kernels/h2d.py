"""Host-to-device copies that do not make the host wait for the stream.

``tensor.to("cuda")`` from pageable memory synchronises: the host waits until the stream has
drained, so a small per-step upload (token ids, indptrs, packed masks) stops the host from running
ahead of the GPU. Staging through pinned memory (torch's caching host allocator keeps the block
until the copy that reads it has finished) and copying with ``non_blocking=True`` returns at once.
"""

from __future__ import annotations

import torch


def upload(host: torch.Tensor, device) -> torch.Tensor:
    """A CPU tensor on ``device`` (None: unchanged), without a host sync when it is a CUDA device."""
    if device is None:
        return host
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
