"""Free slots as sorted, disjoint, non-adjacent runs ``[start, end)`` (Tier 0's free list).

Runs are kept in two parallel sorted lists (starts, ends) plus, per power-of-two size class, a
sorted list of the starts of the runs in that class, so that "the lowest run of at least n slots"
is answered without scanning every run: every run of a class above n's class fits, so the
answer is the lowest of those classes' first starts, or a run of n's own class (scanned).
Adjacent runs always merge on insert; a run never has length 0.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from typing import Iterator, Optional


def _size_class(length: int) -> int:
    return length.bit_length() - 1  # class c holds lengths in [2**c, 2**(c+1))


class FreeRuns:
    """A set of free slot ids in [0, num_slots) stored as merged runs."""

    def __init__(self, num_slots: int, all_free: bool = True):
        self.num_slots = int(num_slots)
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._by_class: dict[int, list[int]] = {}
        self._length_of: dict[int, int] = {}
        self.num_free = 0
        if all_free and self.num_slots:
            self._insert_run(0, self.num_slots)

    # -- queries --------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Number of runs."""
        return len(self._starts)

    def runs(self) -> Iterator[tuple[int, int]]:
        """(start, length) of every run, lowest first."""
        return ((s, e - s) for s, e in zip(self._starts, self._ends))

    def contains(self, slot: int) -> bool:
        i = bisect_right(self._starts, slot) - 1
        return i >= 0 and slot < self._ends[i]

    def run_at(self, start: int) -> int:
        """Length of the free run starting exactly at `start` (0 if none starts there)."""
        return self._length_of.get(start, 0)

    def largest(self) -> int:
        if not self._by_class:
            return 0
        top = max(self._by_class)
        return max(self._length_of[s] for s in self._by_class[top])

    def first_fit(self, n: int) -> Optional[int]:
        """Start of the lowest run of at least n slots, or None."""
        if n < 1:
            raise ValueError(f"first_fit: n must be >= 1, got {n}")
        best: Optional[int] = None
        c = _size_class(n)
        for cls, starts in self._by_class.items():
            if cls > c and (best is None or starts[0] < best):
                best = starts[0]
        for s in self._by_class.get(c, ()):
            if best is not None and s >= best:
                break
            if self._length_of[s] >= n:
                best = s
                break
        return best

    # -- updates --------------------------------------------------------------------------------
    def remove_range(self, start: int, length: int) -> None:
        """Mark [start, start+length) used; it must lie inside one free run."""
        i = bisect_right(self._starts, start) - 1
        end = start + length
        if length < 1 or i < 0 or end > self._ends[i]:
            raise ValueError(f"remove_range: [{start}, {end}) is not inside one free run")
        rs, re = self._starts[i], self._ends[i]
        if rs < start and end == re:  # the run's tail: shrink it in place
            self._resize(rs, start - rs)
            self._ends[i] = start
            self.num_free -= length
            return
        self._delete_run(i)
        if rs < start:
            self._insert_run(rs, start)
        if end < re:
            self._insert_run(end, re)

    def add_range(self, start: int, length: int) -> None:
        """Mark [start, start+length) free (the caller guarantees none of it is free), merging."""
        end = start + length
        if length < 1 or start < 0 or end > self.num_slots:
            raise ValueError(f"add_range: [{start}, {end}) is not a non-empty range of the pool")
        i = bisect_left(self._starts, start)
        if i > 0 and self._ends[i - 1] > start or i < len(self._starts) and self._starts[i] < end:
            raise ValueError(f"add_range: [{start}, {end}) overlaps a free run (double free?)")
        joins_prev = i > 0 and self._ends[i - 1] == start
        joins_next = i < len(self._starts) and self._starts[i] == end
        if joins_prev and not joins_next:  # extend the previous run in place (no list shifts)
            prev = self._starts[i - 1]
            self._resize(prev, self._length_of[prev] + length)
            self._ends[i - 1] = end
            self.num_free += length
            return
        if joins_prev:
            start = self._starts[i - 1]
            self._delete_run(i - 1)
            i -= 1
        if joins_next:
            end = self._ends[i]
            self._delete_run(i)
        self._insert_run(start, end)

    def _resize(self, start: int, new_length: int) -> None:
        old = self._length_of[start]
        self._length_of[start] = new_length
        a, b = _size_class(old), _size_class(new_length)
        if a != b:
            bucket = self._by_class[a]
            del bucket[bisect_left(bucket, start)]
            if not bucket:
                del self._by_class[a]
            insort(self._by_class.setdefault(b, []), start)

    def add_slots(self, slots: list[int]) -> None:
        """Free a list of slot ids (any order; they are grouped into runs first)."""
        for start, length in runs_of_sorted(sorted(slots)):
            self.add_range(start, length)

    # -- internals ------------------------------------------------------------------------------
    def _insert_run(self, start: int, end: int) -> None:
        i = bisect_left(self._starts, start)
        self._starts.insert(i, start)
        self._ends.insert(i, end)
        length = end - start
        self._length_of[start] = length
        insort(self._by_class.setdefault(_size_class(length), []), start)
        self.num_free += length

    def _delete_run(self, i: int) -> None:
        start, end = self._starts.pop(i), self._ends.pop(i)
        length = self._length_of.pop(start)
        cls = _size_class(length)
        bucket = self._by_class[cls]
        del bucket[bisect_left(bucket, start)]
        if not bucket:
            del self._by_class[cls]
        self.num_free -= end - start


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
