"""Host-to-device uploads of per-step host data that do not synchronise the host with the GPU
(`kdtree.kernels.h2d.upload` says why): every small upload of a step would otherwise make the host
wait for the previous step's GPU work, and the two would never overlap."""

from __future__ import annotations

from typing import Any, Optional

import torch

from kdtree.kernels.h2d import upload


def to_device(data: Any, device, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``data`` (a list, a numpy array or a CPU tensor) as a tensor on ``device``, without a sync."""
    host = data if isinstance(data, torch.Tensor) else (
        torch.from_numpy(data) if hasattr(data, "__array_interface__") else torch.tensor(data, dtype=dtype))
    if dtype is not None and host.dtype != dtype:
        host = host.to(dtype)
    return upload(host, device)
