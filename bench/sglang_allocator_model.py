"""SGLang 0.5.23's page_size=1 token allocator, reimplemented from its documented behaviour: the baseline.

SGLang's ``TokenToKVPoolAllocator`` (sglang/srt/mem_cache/allocator/token.py) keeps the free slot
ids in one int64 device tensor ``free_pages``. ``alloc(n)`` hands out ``free_pages[:n]`` (a
slice: no copy) and keeps the rest; ``free(idx)`` appends the freed ids at the tail with
``torch.cat`` (a copy of the whole free list), unsorted. Only under prefill-decode
disaggregation (``need_sort``) do frees wait in ``release_pages`` and get merged and sorted
(``torch.sort``) when an alloc runs short. ``free_group_begin/end`` batch a step's frees into
one ``cat``. SGLang reserves slot 0 for padded tokens; this model hands it out like any slot, so
both allocators manage the same ids.

`SGLangTokenAllocatorModel` is the raw scheme (no checks, like SGLang's) for cost measurements;
`UnsortedFreeListAllocator` is the same order of hand-out behind the engine's checked
`SlotAllocator` interface, for the contiguity workloads.
"""

from __future__ import annotations

from typing import Optional

import torch

from kdtree.engine.kv.allocator import SlotAllocator


class SGLangTokenAllocatorModel:
    """free_pages as a device tensor: alloc slices the head, free concatenates at the tail."""

    def __init__(self, num_slots: int, device: str | torch.device = "cpu", need_sort: bool = False):
        self.num_slots = int(num_slots)
        self.device = torch.device(device)
        self.need_sort = need_sort
        self.free_pages = torch.arange(self.num_slots, dtype=torch.int64, device=self.device)
        self.release_pages = torch.empty(0, dtype=torch.int64, device=self.device)
        self.free_group: Optional[list[torch.Tensor]] = None

    def available_size(self) -> int:
        return len(self.free_pages) + len(self.release_pages)

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        if self.need_sort and need_size > len(self.free_pages):
            self.merge_and_sort_free()
        if need_size > len(self.free_pages):
            return None
        select = self.free_pages[:need_size]
        self.free_pages = self.free_pages[need_size:]
        return select

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(free_index.clone())
        elif self.need_sort:
            self.release_pages = torch.cat((self.release_pages, free_index))
        else:
            self.free_pages = torch.cat((self.free_pages, free_index))

    def free_group_begin(self) -> None:
        assert self.free_group is None, "free groups cannot be nested"
        self.free_group = []

    def free_group_end(self) -> None:
        pending, self.free_group = self.free_group, None
        if pending:
            self.free(torch.cat(pending))

    def merge_and_sort_free(self) -> None:
        if len(self.release_pages) > 0:
            self.free_pages = torch.sort(torch.cat((self.free_pages, self.release_pages))).values
            self.release_pages = torch.empty(0, dtype=torch.int64, device=self.device)


class UnsortedFreeListAllocator(SlotAllocator):
    """SGLang's hand-out order (head first; frees appended at the tail unsorted) as a SlotAllocator.

    need_sort=True models SGLang under PD disaggregation: frees wait unsorted and are merged and
    sorted into the free list when an alloc finds too few ready slots.
    """

    def __init__(self, num_slots: int, need_sort: bool = False):
        super().__init__(num_slots)
        self.need_sort = need_sort
        self._free: list[int] = list(range(self.num_slots))
        self._head = 0  # _free[_head:] is the free list, next-to-be-allocated first
        self._released: list[int] = []
        self.trace: Optional[list] = None  # set to a list to record ("a", n) / ("f", slots) calls

    @property
    def num_free(self) -> int:
        return len(self._free) - self._head + len(self._released)

    def _take(self, n: int) -> list[int]:
        if self.trace is not None:
            self.trace.append(("a", n))
        if self.need_sort and n > len(self._free) - self._head:
            self._free = sorted(self._free[self._head:] + self._released)
            self._head, self._released = 0, []
        taken = self._free[self._head:self._head + n]
        self._head += n
        if self._head > (1 << 16) and self._head * 2 > len(self._free):
            del self._free[:self._head]
            self._head = 0
        return taken

    def _give_back(self, slots: list[int]) -> None:
        if self.trace is not None:
            self.trace.append(("f", list(slots)))
        (self._released if self.need_sort else self._free).extend(slots)

    def _remove_free(self, slots: list[int]) -> None:
        drop = set(slots)
        self._free = [s for s in self._free[self._head:] if s not in drop]
        self._released = [s for s in self._released if s not in drop]
        self._head = 0

    def free_slots(self) -> list[int]:
        """The free list, next-to-be-allocated first (released slots of need_sort last)."""
        return self._free[self._head:] + self._released
