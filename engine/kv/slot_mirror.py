"""Device copies of the pool's per-request slot lists, kept in step by uploading only what is new.

The pool's ``req_to_token[rid]`` (a host list) is the single source of truth. Every step needs a
request's whole slot list on the device as the prefix of its attention metadata; uploading 128k
host ints per request per step (and again per draft depth) costs more than the attention does.
`SlotMirror.prefix(rid)` returns an int32 device view of the list, uploading only the slots
appended since the last call. When the list changed otherwise (a relocation rewrote it, a request
id was reused), the whole list is uploaded again: the mirror compares its own host copy with the
pool's list on every call (a C-speed list comparison, no device sync), so it is never stale.
"""

from __future__ import annotations

import torch

from kdtree.engine.decode.h2d import to_device
from kdtree.engine.kv.kv_pool import KVPool


class SlotMirror:
    def __init__(self, pool: KVPool, device: torch.device | str):
        self.pool, self.device = pool, torch.device(device)
        self._buffers: dict[int, torch.Tensor] = {}  # rid -> int32 device buffer (capacity >= len)
        self._mirrored: dict[int, list[int]] = {}  # rid -> the host list the buffer's head holds
        self.uploaded = 0  # slots copied to the device so far (tests and reports read it)

    def prefix(self, rid: int) -> torch.Tensor:
        """int32 [n] on the device: request `rid`'s slots in token order (a view; do not write)."""
        host = self.pool.req_to_token.get(rid)
        if host is None:
            raise ValueError(f"request {rid} is not in the pool")
        n = len(host)
        seen = self._mirrored.get(rid)
        if seen is None or len(seen) > n or host[: len(seen)] != seen:
            seen = self._mirrored[rid] = []
        start = len(seen)
        if n > start:
            buf = self._buffer(rid, n, keep=start)
            buf[start:n] = to_device(host[start:n], self.device, torch.int32)
            seen.extend(host[start:n])
            self.uploaded += n - start
        return self._buffer(rid, n, keep=n)[:n]

    def forget(self, rid: int) -> None:
        """Drop a finished request's buffer."""
        self._buffers.pop(rid, None)
        self._mirrored.pop(rid, None)

    def _buffer(self, rid: int, need: int, keep: int) -> torch.Tensor:
        buf = self._buffers.get(rid)
        if buf is None or buf.numel() < need:
            grown = torch.empty(max(need, 2 * (buf.numel() if buf is not None else 0), 64),
                                dtype=torch.int32, device=self.device)
            if buf is not None and keep:
                grown[:keep] = buf[:keep]
            buf = self._buffers[rid] = grown
        return buf
