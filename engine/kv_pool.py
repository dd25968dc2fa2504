"""The page_size=1 KV token pool: one [S, 576] latent tensor per layer and the req_to_token map.

``req_to_token[rid]`` lists, in token order, the slots holding request ``rid``'s KV; it is the
single source of truth for which slot holds which token (relocation rewrites it). The allocator
decides only which slots are free.
"""

from __future__ import annotations

from typing import Optional

import torch

from kdtree.engine.allocator import FreeListAllocator, SlotAllocator
from kdtree.kernels.contract import QK_DIM


class KVPool:
    def __init__(self, num_layers: int, num_slots: int, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", allocator: Optional[SlotAllocator] = None):
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.allocator = allocator if allocator is not None else FreeListAllocator(num_slots)
        if self.allocator.num_slots != num_slots:
            raise ValueError(f"allocator has {self.allocator.num_slots} slots, pool has {num_slots}")
        self.num_slots = num_slots
        self.kv = [torch.zeros(num_slots, QK_DIM, dtype=dtype, device=device) for _ in range(num_layers)]
        self.req_to_token: dict[int, list[int]] = {}

    # -- requests -------------------------------------------------------------------------------
    def add_request(self, rid: int) -> None:
        if rid in self.req_to_token:
            raise ValueError(f"request {rid} is already in the pool")
        self.req_to_token[rid] = []

    def seq_len(self, rid: int) -> int:
        return len(self._slots_of(rid))

    def slots(self, rid: int) -> list[int]:
        """The request's slots in token order (a copy)."""
        return list(self._slots_of(rid))

    def append(self, rid: int, slots) -> None:
        """Record allocated slots as the request's next tokens."""
        ids = slots.tolist() if isinstance(slots, torch.Tensor) else [int(s) for s in slots]
        for s in ids:
            if not self.allocator.is_allocated(s):
                raise ValueError(f"append: slot {s} is not allocated")
        self._slots_of(rid).extend(ids)

    def release(self, rid: int) -> None:
        """Free every slot of the request and forget it."""
        slots = self.req_to_token.pop(self._check_rid(rid))
        if slots:
            self.allocator.free(slots)

    # -- slots ----------------------------------------------------------------------------------
    def alloc(self, n: int) -> torch.Tensor:
        return self.allocator.alloc(n)

    def free(self, slots) -> None:
        self.allocator.free(slots)

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    def owner_map(self) -> dict[int, int]:
        """slot -> request for every slot some request holds (ValueError if one is held twice)."""
        owner: dict[int, int] = {}
        for rid, slots in self.req_to_token.items():
            for s in slots:
                if s in owner:
                    raise ValueError(f"slot {s} is held by requests {owner[s]} and {rid}")
                owner[s] = rid
        return owner

    def relocate(self, src, dst) -> None:
        """Move live tokens' KV from slots src to free slots dst (every layer), rewrite req_to_token."""
        src = [int(s) for s in src]
        dst = [int(s) for s in dst]
        if len(src) != len(dst):
            raise ValueError(f"relocate: {len(src)} sources but {len(dst)} destinations")
        owner = self.owner_map()
        missing = [s for s in src if s not in owner]
        if missing:
            raise ValueError(f"relocate: slots {missing[:8]} hold no request's token")
        self.allocator.claim(dst)
        src_t = torch.tensor(src, dtype=torch.long, device=self.kv[0].device)
        dst_t = torch.tensor(dst, dtype=torch.long, device=self.kv[0].device)
        for layer in self.kv:
            layer[dst_t] = layer[src_t]
        moved = dict(zip(src, dst))
        for rid in {owner[s] for s in src}:
            self.req_to_token[rid] = [moved.get(s, s) for s in self.req_to_token[rid]]
        self.allocator.free(src)

    def _check_rid(self, rid: int) -> int:
        if rid not in self.req_to_token:
            raise ValueError(f"request {rid} is not in the pool")
        return rid

    def _slots_of(self, rid: int) -> list[int]:
        return self.req_to_token[self._check_rid(rid)]
