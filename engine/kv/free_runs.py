"""Free slots as disjoint, non-adjacent runs ``[start, end)`` (Tier 0's free list), O(1) per update.

The runs live in two dicts, start -> end and end -> start, so every update the decode loop
makes — take the head of a run (growing a request's last run, a lowest-fit allocation), give back
a range that merges with the runs on either side (a rejected draft's slots) — is a few dict
operations, whatever the number of runs. A byte map of the pool (1 = free) answers membership,
finds the run holding a slot (`bytearray.rfind`, C speed) and catches a double free.

"The lowest run of at least n slots" (`first_fit`) uses, per power-of-two size class, a min-heap
of run *ends* (runs are disjoint, so the lowest end is the lowest run); keyed by end, a run's
entry survives the two commonest updates, a take from its head and a merge of a freed range in
front of it. Heap entries are never deleted in place: an entry is live while a run of that class
ends there, stale entries are dropped when they reach the top, and the heaps are rebuilt once
they hold more than twice the live runs (amortised O(1) per update). Every run of a class above
n's fits, so the answer is the lowest of those classes' tops, or a run of n's own class, found by
popping that heap in ascending order (and pushing back) until a run fits or passes the best.

The sorted view (`runs()`) is built on demand; nothing on the decode path needs it.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from typing import Iterable, Iterator, Optional

_ONES = b"\x01"


def _size_class(length: int) -> int:
    return length.bit_length() - 1  # class c holds lengths in [2**c, 2**(c+1))


class FreeRuns:
    """A set of free slot ids in [0, num_slots) stored as merged runs."""

    def __init__(self, num_slots: int, all_free: bool = True):
        self.num_slots = int(num_slots)
        self._end_of: dict[int, int] = {}  # run start -> end (exclusive)
        self._start_of: dict[int, int] = {}  # run end -> start
        self._heaps: dict[int, list[int]] = {}  # size class -> min-heap of run ends (may hold stale ones)
        self._heap_entries = 0
        self._map = bytearray(self.num_slots)  # 1 = free
        self.num_free = 0
        if all_free and self.num_slots:
            self._map[:] = _ONES * self.num_slots
            self._set_run(0, self.num_slots)
            self.num_free = self.num_slots

    # -- queries --------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Number of runs."""
        return len(self._end_of)

    def runs(self) -> Iterator[tuple[int, int]]:
        """(start, length) of every run, lowest first."""
        return ((s, e - s) for s, e in sorted(self._end_of.items()))

    def contains(self, slot: int) -> bool:
        return 0 <= slot < self.num_slots and bool(self._map[slot])

    def run_at(self, start: int) -> int:
        """Length of the free run starting exactly at `start` (0 if none starts there)."""
        end = self._end_of.get(start)
        return 0 if end is None else end - start

    def largest(self) -> int:
        return self.largest_run()[1]

    def largest_run(self) -> tuple[int, int]:
        """(start, length) of the longest run, the lowest among equals; (-1, 0) when none is free."""
        best = (-1, 0)
        for cls in sorted(self._heaps, reverse=True):
            for e in self._heaps[cls]:
                s = self._start_of.get(e)
                if s is None or _size_class(e - s) != cls:
                    continue  # stale
                if e - s > best[1] or e - s == best[1] and s < best[0]:
                    best = (s, e - s)
            if best[1]:
                break  # every run of a lower class is shorter
        return best

    def first_fit(self, n: int) -> Optional[int]:
        """Start of the lowest run of at least n slots, or None."""
        if n < 1:
            raise ValueError(f"first_fit: n must be >= 1, got {n}")
        c = _size_class(n)
        best: Optional[int] = None  # the lowest end of a run that fits (lowest end = lowest start)
        start_of = self._start_of
        for cls, heap in self._heaps.items():
            if cls > c and heap:
                top = heap[0]
                s = start_of.get(top)
                if s is None or (top - s).bit_length() - 1 != cls:
                    top = self._top(cls)  # drops stale tops
                if top is not None and (best is None or top < best):
                    best = top
        heap = self._heaps.get(c)
        if heap:
            passed: list[int] = []
            while heap:
                e = heap[0]
                s = start_of.get(e)
                if s is None or (e - s).bit_length() - 1 != c:
                    heappop(heap)  # stale
                    self._heap_entries -= 1
                    continue
                if best is not None and e >= best:
                    break
                if e - s >= n:
                    best = e
                    break
                passed.append(heappop(heap))
            for e in passed:
                heappush(heap, e)
        return None if best is None else self._start_of[best]

    # -- updates --------------------------------------------------------------------------------
    def take_head(self, start: int, n: int) -> int:
        """Take up to n slots from the head of the run starting at `start`; returns how many (0: no
        run starts there). O(1): the run keeps its end, so its heap entry stays."""
        end = self._end_of.pop(start, None)
        if end is None:
            return 0
        length = end - start
        if n >= length:
            n = length
            del self._start_of[end]
        else:
            rest = start + n
            self._end_of[rest] = end
            self._start_of[end] = rest
            c = _size_class(length - n)
            if c != _size_class(length):
                self._push(c, end)
        self._map[start:start + n] = bytes(n)
        self.num_free -= n
        return n

    def remove_range(self, start: int, length: int) -> None:
        """Mark [start, start+length) used; it must lie inside one free run."""
        end = start + length
        if length < 1 or start < 0 or end > self.num_slots or self._map.find(0, start, end) != -1:
            raise ValueError(f"remove_range: [{start}, {end}) is not inside one free run")
        if start in self._end_of:
            self.take_head(start, length)
            return
        rs = self._map.rfind(0, 0, start) + 1
        re = self._end_of[rs]
        self._map[start:end] = bytes(length)
        self.num_free -= length
        self._end_of[rs] = start  # the left part gets a new end
        self._start_of[start] = rs
        self._push(_size_class(start - rs), start)
        if end < re:  # the right part keeps the run's end
            self._end_of[end] = re
            self._start_of[re] = end
            c = _size_class(re - end)
            if c != _size_class(re - rs):
                self._push(c, re)
        else:
            del self._start_of[re]

    def add_range(self, start: int, length: int) -> None:
        """Mark [start, start+length) free (none of it may be free already), merging with neighbours."""
        self.add_runs(((start, length),))

    def add_runs(self, runs: Iterable[tuple[int, int]]) -> None:
        """add_range for every (start, length) in order: one call for a step's frees.

        Checked run by run: a run that is out of the pool or overlaps free slots raises before it
        changes anything (earlier runs stay added).
        """
        fmap, end_of, start_of = self._map, self._end_of, self._start_of
        num_slots = self.num_slots
        for start, length in runs:
            end = start + length
            if length < 1 or start < 0 or end > num_slots:
                raise ValueError(f"add_range: [{start}, {end}) is not a non-empty range of the pool")
            if fmap.find(1, start, end) != -1:
                raise ValueError(f"add_range: [{start}, {end}) overlaps a free run (double free?)")
            fmap[start:end] = _ONES * length
            self.num_free += length
            after_end = end_of.pop(end, None)  # a run starting at `end`
            before = start_of.pop(start, None)  # a run ending at `start`
            new_start = start if before is None else before
            if after_end is not None:  # the next run grows downwards: its end (heap entry) stays
                end_of[new_start] = after_end
                start_of[after_end] = new_start
                c = (after_end - new_start).bit_length()
                if c != (after_end - end).bit_length():
                    self._push(c - 1, after_end)
            else:
                end_of[new_start] = end
                start_of[end] = new_start
                self._push((end - new_start).bit_length() - 1, end)

    def add_slots(self, slots: list[int]) -> None:
        """Free a list of slot ids (any order; they are grouped into runs first)."""
        self.add_runs(runs_of_sorted(sorted(slots)))

    # -- internals ------------------------------------------------------------------------------
    def _set_run(self, start: int, end: int) -> None:
        """Record the run [start, end) under a new end."""
        self._end_of[start] = end
        self._start_of[end] = start
        self._push(_size_class(end - start), end)

    def _push(self, cls: int, end: int) -> None:
        heappush(self._heaps.setdefault(cls, []), end)
        self._heap_entries += 1
        if self._heap_entries > 2 * len(self._end_of) + 64:
            self._rebuild_heaps()

    def _rebuild_heaps(self) -> None:
        heaps: dict[int, list[int]] = {}
        for e, s in self._start_of.items():
            heaps.setdefault(_size_class(e - s), []).append(e)
        for h in heaps.values():
            heapify(h)
        self._heaps, self._heap_entries = heaps, len(self._start_of)

    def _top(self, cls: int) -> Optional[int]:
        """Lowest live end of a class (stale tops dropped), or None."""
        heap = self._heaps[cls]
        start_of = self._start_of
        while heap:
            e = heap[0]
            s = start_of.get(e)
            if s is not None and _size_class(e - s) == cls:
                return e
            heappop(heap)
            self._heap_entries -= 1
        return None


def runs_of_sorted(sorted_slots: list[int]) -> list[tuple[int, int]]:
    """(start, length) runs of an ascending list of distinct slot ids."""
    runs: list[tuple[int, int]] = []
    if not sorted_slots:
        return runs
    start = prev = sorted_slots[0]
    for s in sorted_slots[1:]:
        if s != prev + 1:
            runs.append((start, prev - start + 1))
            start = s
        prev = s
    runs.append((start, prev - start + 1))
    return runs
