"""Slot allocators for the page_size=1 KV token pool.

`SlotAllocator` is the interface the pool uses. `FreeListAllocator` is a LIFO free list (what
fragments); `SortedRunAllocator` is phase 4's Tier 0: free slots kept as sorted runs, a new
allocation served from the lowest run that fits, and a request's allocation grown in place after
its last slot where that slot is free (`alloc_after`). Relocation claims specific slots (`claim`).
The allocator only knows which slots are free; which slot holds which token lives in the pool's
req_to_token map. SGLang's page_size=1 scheme, the baseline, is `kdtree.bench.sglang_allocator_model`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterable, Optional, Sequence

import torch

from kdtree.engine.kv.free_runs import FreeRuns, runs_of_sorted


class PoolExhaustedError(RuntimeError):
    """alloc(n) asked for more slots than are free; nothing was allocated."""


class SlotAllocator(ABC):
    """Hands out slot ids in [0, num_slots)."""

    def __init__(self, num_slots: int, track_in_use: bool = True):
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots = int(num_slots)
        # which slots are allocated, for the base class's checks (a subclass that keeps its own
        # map passes False and overrides is_allocated, count_allocated, highest_allocated, alloc,
        # claim and free)
        self._in_use = bytearray(self.num_slots) if track_in_use else None

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

    def count_allocated(self, start: int, stop: int) -> int:
        """Allocated slots in [start, stop)."""
        return self._in_use.count(1, max(0, start), min(stop, self.num_slots))

    def highest_allocated(self) -> int:
        """The highest allocated slot id, -1 when none is."""
        return self._in_use.rfind(1)

    def _check_count(self, n: int, verb: str) -> None:
        """ValueError for a negative n, PoolExhaustedError when fewer than n slots are free."""
        if n < 0:
            raise ValueError(f"{verb}: n must be >= 0, got {n}")
        if n > self.num_free:
            raise PoolExhaustedError(f"KV pool exhausted: asked for {n} slots, {self.num_free} of "
                                     f"{self.num_slots} are free")

    def alloc(self, n: int) -> torch.Tensor:
        """n slot ids as int32 [n], all or nothing (PoolExhaustedError when fewer are free)."""
        self._check_count(n, "alloc")
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


class PySlotRuns:
    """Tier 0's allocator core in Python: free runs (`FreeRuns`) and the allocated map.

    The reference for the native core (`kdtree.engine.kv.native`, engine/kv/csrc/slot_runs.cpp), which
    has the same methods and gives the same answers; tests hold the two to that. Callers check
    counts first (`SortedRunAllocator`); errors are ValueError and change nothing.
    """

    def __init__(self, num_slots: int, allocated_map: Optional[bytes] = None):
        self.num_slots = int(num_slots)
        self._runs = FreeRuns(self.num_slots)
        self._in_use = bytearray(self.num_slots)
        if allocated_map is not None:  # rebuilt from the allocated map alone (a pickled allocator)
            if len(allocated_map) != self.num_slots:
                raise ValueError(f"the allocated map has {len(allocated_map)} bytes for {self.num_slots} slots")
            self._in_use[:] = bytes(1 if b else 0 for b in allocated_map)
            for start, length in runs_of_sorted([s for s in range(self.num_slots) if self._in_use[s]]):
                self._runs.remove_range(start, length)

    def allocated_map(self) -> bytes:
        """One byte per slot, 1 = allocated (what rebuilds a core)."""
        return bytes(self._in_use)

    # -- queries (FreeRuns' and the allocated map's) ---------------------------------------------
    @property
    def num_free(self) -> int:
        return self._runs.num_free

    def __len__(self) -> int:
        return len(self._runs)

    def is_allocated(self, slot: int) -> bool:
        return 0 <= slot < self.num_slots and bool(self._in_use[slot])

    def contains(self, slot: int) -> bool:
        return self._runs.contains(slot)

    def count_allocated(self, start: int, stop: int) -> int:
        return self._in_use.count(1, max(0, start), min(stop, self.num_slots))

    def highest_allocated(self) -> int:
        return self._in_use.rfind(1)

    def run_at(self, start: int) -> int:
        return self._runs.run_at(start)

    def runs(self) -> list[tuple[int, int]]:
        return list(self._runs.runs())

    def largest_run(self) -> tuple[int, int]:
        return self._runs.largest_run()

    def largest(self) -> int:
        return self._runs.largest()

    def first_fit(self, n: int) -> Optional[int]:
        return self._runs.first_fit(n)

    # -- updates ----------------------------------------------------------------------------------
    def take_head(self, start: int, n: int) -> int:
        got = self._runs.take_head(start, n) if n > 0 else 0
        self._in_use[start:start + got] = b"\x01" * got
        return got

    def alloc(self, n: int) -> list[int]:
        out: list[int] = []
        self._fill(out, n)
        return out

    def alloc_after_batch(self, lasts: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
        outs: list[list[int]] = []
        short = []
        for b, (last, n) in enumerate(zip(lasts, sizes)):  # every request grows in place first ...
            got = self.take_head(last + 1, n) if last >= 0 and n else 0
            outs.append(list(range(last + 1, last + 1 + got)))
            if got < n:
                short.append((b, n - got))
        for b, n in short:  # ... so that no request's fill takes the slots another one grows into
            self._fill(outs[b], n)
        return outs

    def free(self, slots: list[int]) -> None:
        ordered = sorted(slots)
        if not ordered:
            return
        if ordered[0] < 0 or ordered[-1] >= self.num_slots:
            bad = ordered[0] if ordered[0] < 0 else ordered[-1]
            raise ValueError(f"free: slot {bad} is not in this pool (0..{self.num_slots - 1})")
        runs = runs_of_sorted(ordered)
        in_use = self._in_use
        prev_end = -1
        for start, length in runs:
            if start < prev_end:
                raise ValueError(f"free: slot ids repeat in one call: slot {start}")
            prev_end = start + length
            if in_use.find(0, start, prev_end) != -1:
                raise ValueError(f"free: slot {in_use.find(0, start, prev_end)} is not allocated (double free?)")
        for start, length in runs:
            in_use[start:start + length] = bytes(length)
        self._runs.add_runs(runs)

    def claim(self, slots: list[int]) -> None:
        ordered = sorted(slots)
        for i, s in enumerate(ordered):
            if i and s == ordered[i - 1]:
                raise ValueError(f"claim: slot ids repeat in one call: slot {s}")
            if not 0 <= s < self.num_slots:
                raise ValueError(f"claim: slot {s} is not in this pool (0..{self.num_slots - 1})")
            if self._in_use[s]:
                raise ValueError(f"claim: slot {s} is already allocated")
        for start, length in runs_of_sorted(ordered):
            self._runs.remove_range(start, length)
            self._in_use[start:start + length] = b"\x01" * length

    def _fill(self, out: list[int], n: int) -> None:
        while n:
            start = self._runs.first_fit(n)
            length = n
            if start is None:  # no run is long enough: the largest one, whole
                start, length = self._runs.largest_run()
            self.take_head(start, length)
            out.extend(range(start, start + length))
            n -= length


def make_slot_runs(num_slots: int, native: Optional[bool] = None, allocated_map: Optional[bytes] = None):
    """Tier 0's core: the native one (`kdtree.engine.kv.native`) when `native` is True, or None and it
    builds here; else `PySlotRuns`. native=True where it cannot be built raises RuntimeError.
    `allocated_map` (one byte per slot, nonzero = allocated) rebuilds a core in that state."""
    if native is not False:
        from kdtree.engine.kv import native as native_build  # noqa: PLC0415

        module = native_build.slot_runs()
        if module is not None:
            return module.SlotRuns(num_slots) if allocated_map is None else module.SlotRuns(num_slots, allocated_map)
        if native:
            raise RuntimeError(f"the native allocator core is not available: {native_build.unavailable_reason()}")
    return PySlotRuns(num_slots, allocated_map)


class SortedRunAllocator(SlotAllocator):
    """Tier 0: free slots as merged runs, served lowest-fit, grown in place.

    ``alloc(n)`` takes the lowest run of at least n slots; when no run is that long it takes the
    largest runs (fewest pieces), lowest first among equals. ``alloc_after(last, n)`` first takes
    the free slots directly after `last` (growing the caller's last run), then falls back to
    ``alloc``; ``alloc_after_batch`` does that for a whole step's requests in one call, every
    request's growth before any fall-back. Frees merge with their neighbours, so a freed
    request's run comes back whole.

    The work is done by a core (`make_slot_runs`): the native one (engine/kv/csrc/slot_runs.cpp, a
    whole step's growth or frees in one call) where it builds, else `PySlotRuns`; ``native``
    forces one or the other. Both give the same answers.
    """

    def __init__(self, num_slots: int, native: Optional[bool] = None):
        super().__init__(num_slots, track_in_use=False)
        self._core = make_slot_runs(self.num_slots, native)
        self.native = not isinstance(self._core, PySlotRuns)

    @property
    def num_free(self) -> int:
        return self._core.num_free

    def __getstate__(self) -> dict:  # pickling and copy.deepcopy (a pool's snapshot): the core as its map
        state = self.__dict__.copy()
        core = state.pop("_core")
        state["_allocated_map"] = core.allocated_map()
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        allocated = state.pop("_allocated_map")
        self.__dict__.update(state)
        # the native core again where it builds here (the Python one otherwise: same answers)
        self._core = make_slot_runs(self.num_slots, None if self.native else False, allocated)
        self.native = not isinstance(self._core, PySlotRuns)

    @property
    def free_runs(self):
        """The free runs, read only (``runs()``, ``first_fit``, ``run_at``, ``largest_run``,
        ``contains``, ``num_free``, ``len``): change them through alloc/free/claim."""
        return self._core

    def is_allocated(self, slot: int) -> bool:
        return self._core.is_allocated(slot)

    def count_allocated(self, start: int, stop: int) -> int:
        return self._core.count_allocated(start, stop)

    def highest_allocated(self) -> int:
        return self._core.highest_allocated()

    def alloc(self, n: int) -> torch.Tensor:
        return torch.tensor(self.alloc_list(n), dtype=torch.int32)

    def alloc_list(self, n: int) -> list[int]:
        """alloc(n) as a Python list (the engine's bookkeeping is host lists)."""
        self._check_count(n, "alloc")
        return self._core.alloc(n)

    def alloc_after(self, last: int, n: int) -> list[int]:
        """n slots, as many as are free directly after slot `last` first (-1: no last slot)."""
        return self.alloc_after_batch([last], [n])[0]

    def alloc_after_batch(self, lasts: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
        """`alloc_after(lasts[b], sizes[b])` for every b (one step's requests), all or nothing: first
        every request grows after its last slot, then the ones still short fall back, in order."""
        if len(lasts) != len(sizes):
            raise ValueError(f"alloc_after_batch: {len(lasts)} last slots but {len(sizes)} sizes")
        if any(n < 0 for n in sizes):
            raise ValueError(f"alloc_after_batch: sizes must be >= 0, got {list(sizes)}")
        self._check_count(sum(sizes), "alloc_after_batch")
        return self._core.alloc_after_batch(list(lasts), list(sizes))

    def free(self, slots) -> None:
        self._core.free(_id_list(slots))

    def claim(self, slots: Iterable[int]) -> None:
        self._core.claim(_id_list(slots))

    def free_slots(self) -> list[int]:
        """Every free slot id, ascending."""
        return [s for start, length in self._core.runs() for s in range(start, start + length)]

    def _take(self, n: int) -> list[int]:
        raise AssertionError("SortedRunAllocator overrides alloc")

    def _give_back(self, slots: list[int]) -> None:
        raise AssertionError("SortedRunAllocator overrides free")

    def _remove_free(self, slots: list[int]) -> None:
        raise AssertionError("SortedRunAllocator overrides claim")


def _id_list(slots) -> list:
    """Slot ids as a list for a core (a list passes as it is: the cores read any int-like)."""
    if isinstance(slots, list):
        return slots
    return slots.tolist() if isinstance(slots, torch.Tensor) else list(slots)
