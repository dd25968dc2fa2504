"""Host-to-device uploads that do not synchronise the host with the GPU.

``torch.tensor(values, device="cuda")`` (or ``.to("cuda")`` from pageable memory) waits for the
stream to drain before it returns, so every small per-step upload (token ids, positions, slots,
indptrs, masks) makes the host wait for the previous step's GPU work and the two never overlap.
Staging through pinned memory (torch's caching host allocator, which keeps a block until the copy
that reads it has finished) and copying with ``non_blocking=True`` returns at once.
"""

from __future__ import annotations

from typing import Any, Optional

import torch


def to_device(data: Any, device, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``data`` (a list, a numpy array or a CPU tensor) as a tensor on ``device``, without a sync."""
    device = torch.device(device)
    host = data if isinstance(data, torch.Tensor) else (
        torch.from_numpy(data) if hasattr(data, "__array_interface__") else torch.tensor(data, dtype=dtype))
    if dtype is not None and host.dtype != dtype:
        host = host.to(dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
