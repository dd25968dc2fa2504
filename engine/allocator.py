"""Slot allocators for the page_size=1 KV token pool.

`SlotAllocator` is the interface the pool uses; phase 4 swaps in a sorted free list and claims
specific slots when it relocates live KV (`claim`). The allocator only knows which slots are
free; which slot holds which token lives in the pool's req_to_token map.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterable

import torch


class PoolExhaustedError(RuntimeError):
    """alloc(n) asked for more slots than are free; nothing was allocated."""


class SlotAllocator(ABC):
    """Hands out slot ids in [0, num_slots)."""

    def __init__(self, num_slots: int):
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots = int(num_slots)
        self._in_use = bytearray(self.num_slots)

    @property
    @abstractmethod
    def num_free(self) -> int:
        """Slots that alloc can hand out now."""

    @abstractmethod
    def _take(self, n: int) -> list[int]:
        """Remove and return n free slot ids (n <= num_free)."""

    @abstractmethod
    def _give_back(self, slots: list[int]) -> None:
        """Return freed slot ids to the free list."""

    @abstractmethod
    def _remove_free(self, slots: list[int]) -> None:
        """Remove these specific free slot ids from the free list."""

    @property
    def num_used(self) -> int:
        return self.num_slots - self.num_free

    def is_allocated(self, slot: int) -> bool:
        return 0 <= slot < self.num_slots and bool(self._in_use[slot])

    def alloc(self, n: int) -> torch.Tensor:
        """n slot ids as int32 [n], all or nothing (PoolExhaustedError when fewer are free)."""
        if n < 0:
            raise ValueError(f"alloc: n must be >= 0, got {n}")
        if n > self.num_free:
            raise PoolExhaustedError(f"KV pool exhausted: asked for {n} slots, {self.num_free} of "
                                     f"{self.num_slots} are free")
        slots = self._take(n)
        for s in slots:
            self._in_use[s] = 1
        return torch.tensor(slots, dtype=torch.int32)

    def claim(self, slots: Iterable[int]) -> None:
        """Allocate these specific free slots (for relocation); ValueError if any is taken."""
        slots = self._checked(slots, want_allocated=False, verb="claim")
        self._remove_free(slots)
        for s in slots:
            self._in_use[s] = 1

    def free(self, slots) -> None:
        """Free allocated slots; ValueError on a double free, a slot out of range or a repeat."""
        slots = self._checked(slots, want_allocated=True, verb="free")
        for s in slots:
            self._in_use[s] = 0
        self._give_back(slots)

    def _checked(self, slots, want_allocated: bool, verb: str) -> list[int]:
        ids = slots.tolist() if isinstance(slots, torch.Tensor) else [int(s) for s in slots]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{verb}: slot ids repeat in one call: {ids}")
        for s in ids:
            if not 0 <= s < self.num_slots:
                raise ValueError(f"{verb}: slot {s} is not in this pool (0..{self.num_slots - 1})")
            if bool(self._in_use[s]) != want_allocated:
                state = "not allocated (double free?)" if want_allocated else "already allocated"
                raise ValueError(f"{verb}: slot {s} is {state}")
        return ids


class FreeListAllocator(SlotAllocator):
    """LIFO free list: freed slots are reused first (what engines do today, and what fragments)."""

    def __init__(self, num_slots: int):
        super().__init__(num_slots)
        self._free = list(range(self.num_slots - 1, -1, -1))  # pop() yields 0, 1, 2, ...

    @property
    def num_free(self) -> int:
        return len(self._free)

    def _take(self, n: int) -> list[int]:
        taken = self._free[len(self._free) - n:][::-1]
        del self._free[len(self._free) - n:]
        return taken

    def _give_back(self, slots: list[int]) -> None:
        self._free.extend(reversed(slots))

    def _remove_free(self, slots: list[int]) -> None:
        drop = set(slots)
        self._free = [s for s in self._free if s not in drop]

    def free_slots(self) -> list[int]:
        """The free list, next-to-be-allocated first."""
        return self._free[::-1]
