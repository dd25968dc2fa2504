"""Tier 0: the sorted free runs and the allocator built on them, against a plain set of free slots."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kdtree.engine.kv.allocator import PoolExhaustedError, SortedRunAllocator
from kdtree.engine.kv.free_runs import FreeRuns, runs_of_sorted
from kdtree.engine.kv.native import slot_runs, unavailable_reason


def _brute_first_fit(free: set[int], n: int):
    for start, length in runs_of_sorted(sorted(free)):
        if length >= n:
            return start
    return None


class FreeRunsMachine(RuleBasedStateMachine):
    """Random frees and takes: the runs always equal the free set, merged, sorted, indexed by size."""

    @initialize(size=st.integers(1, 300))
    def make(self, size):
        self.runs = FreeRuns(size)
        self.free = set(range(size))
        self.size = size

    @precondition(lambda self: self.free)
    @rule(data=st.data())
    def take(self, data):
        runs = runs_of_sorted(sorted(self.free))
        start, length = data.draw(st.sampled_from(runs))
        a = data.draw(st.integers(start, start + length - 1))
        b = data.draw(st.integers(a + 1, start + length))
        self.runs.remove_range(a, b - a)
        self.free -= set(range(a, b))

    @precondition(lambda self: len(self.free) < self.size)
    @rule(data=st.data())
    def give(self, data):
        used = runs_of_sorted(sorted(set(range(self.size)) - self.free))
        start, length = data.draw(st.sampled_from(used))
        a = data.draw(st.integers(start, start + length - 1))
        b = data.draw(st.integers(a + 1, start + length))
        self.runs.add_range(a, b - a)
        self.free |= set(range(a, b))

    @rule(n=st.integers(1, 64))
    def first_fit_is_the_lowest_run_that_fits(self, n):
        assert self.runs.first_fit(n) == _brute_first_fit(self.free, n)

    @rule(slot=st.integers(0, 299))
    def double_free_is_refused(self, slot):
        if slot in self.free:
            with pytest.raises(ValueError, match="overlaps"):
                self.runs.add_range(slot, 1)

    @invariant()
    def runs_are_the_free_set_merged(self):
        got = list(self.runs.runs())
        assert got == runs_of_sorted(sorted(self.free))  # merged: no two runs touch
        assert self.runs.num_free == len(self.free)
        assert all(self.runs.contains(s) == (s in self.free) for s in range(self.size))
        assert self.runs.largest() == max((n for _, n in got), default=0)


TestFreeRuns = FreeRunsMachine.TestCase
TestFreeRuns.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


class SortedAllocatorMachine(RuleBasedStateMachine):
    """Allocations never overlap, frees restore exactly, and a fully freed pool is one run again."""

    native = False  # which core (kdtree.engine.kv.allocator.make_slot_runs); the subclass below: native

    @initialize(size=st.integers(1, 200))
    def make(self, size):
        self.a = SortedRunAllocator(size, native=self.native)
        self.held: list[list[int]] = []

    def _all_held(self):
        return [s for h in self.held for s in h]

    @rule(n=st.integers(0, 40))
    def alloc(self, n):
        free_before = self.a.num_free
        if n > free_before:
            with pytest.raises(PoolExhaustedError):
                self.a.alloc(n)
            assert self.a.num_free == free_before
            return
        lowest = self.a.free_runs.first_fit(n) if n else None
        got = self.a.alloc(n).tolist()
        if lowest is not None:
            assert got == list(range(lowest, lowest + n))  # the lowest run that fits, contiguous
        self.held.append(got)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), n=st.integers(1, 20))
    def grow(self, data, n):
        i = data.draw(st.integers(0, len(self.held) - 1))
        if not self.held[i] or n > self.a.num_free:
            return
        last = self.held[i][-1]
        room = self.a.free_runs.run_at(last + 1)
        got = self.a.alloc_after(last, n)
        assert got[:min(n, room)] == list(range(last + 1, last + 1 + min(n, room)))  # grown in place
        self.held[i] = self.held[i] + got

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free_some(self, data):
        i = data.draw(st.integers(0, len(self.held) - 1))
        h = self.held[i]
        k = data.draw(st.integers(0, len(h)))
        chosen = data.draw(st.permutations(h))[:k]
        self.a.free(chosen)
        self.held[i] = [s for s in h if s not in set(chosen)]

    @precondition(lambda self: any(self.held))
    @rule(data=st.data())
    def double_free(self, data):
        s = data.draw(st.sampled_from(self._all_held()))
        self.a.free([s])
        with pytest.raises(ValueError, match="not allocated"):
            self.a.free([s])
        for h in self.held:
            if s in h:
                h.remove(s)

    @invariant()
    def no_slot_twice_and_free_is_the_rest(self):
        held = self._all_held()
        assert len(held) == len(set(held))
        assert all(self.a.is_allocated(s) for s in held)
        assert set(self.a.free_slots()) == set(range(self.a.num_slots)) - set(held)
        assert self.a.num_free + len(held) == self.a.num_slots

    def teardown(self):
        if hasattr(self, "a"):
            self.a.free(self._all_held())
            assert list(self.a.free_runs.runs()) == [(0, self.a.num_slots)]


TestSortedAllocator = SortedAllocatorMachine.TestCase
TestSortedAllocator.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


class NativeSortedAllocatorMachine(SortedAllocatorMachine):
    native = True


TestNativeSortedAllocator = pytest.mark.skipif(
    slot_runs() is None, reason=f"the native allocator core does not build here: {unavailable_reason()}")(
    NativeSortedAllocatorMachine.TestCase)
TestNativeSortedAllocator.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_no_run_long_enough_takes_the_largest_runs_first():
    a = SortedRunAllocator(20)
    a.alloc(20)
    a.free([0, 1, 5, 6, 7, 12, 13, 14, 15])  # runs of 2, 3, 4
    # the largest run whole, then the lowest run that fits the rest
    assert a.alloc(6).tolist() == [12, 13, 14, 15, 0, 1]


def test_claim_and_free_of_foreign_or_repeated_slots_are_errors():
    a = SortedRunAllocator(10)
    a.claim([3, 4])
    with pytest.raises(ValueError, match="already allocated"):
        a.claim([4])
    with pytest.raises(ValueError, match="not in this pool"):
        a.free([10])
    with pytest.raises(ValueError, match="repeat"):
        a.free([3, 3])
    assert a.num_free == 8 and a.alloc(3).tolist() == [0, 1, 2]


@given(st.lists(st.integers(0, 1000), unique=True))
def test_runs_of_sorted_covers_exactly_the_slots(slots):
    runs = runs_of_sorted(sorted(slots))
    assert [s for a, n in runs for s in range(a, a + n)] == sorted(slots)
    assert all(a + n < b for (a, n), (b, _) in zip(runs, runs[1:]))


def test_first_fit_stays_the_lowest_fit_over_long_churn_with_heap_rebuilds():
    """Thousands of takes and frees (so stale heap entries pile up and the heaps are rebuilt):
    first_fit, run_at and largest_run keep agreeing with a plain set of free slots."""
    import random

    rng = random.Random(7)
    size = 400
    runs, free = FreeRuns(size), set(range(size))
    rebuilds = 0
    real_rebuild = runs._rebuild_heaps

    def counted():
        nonlocal rebuilds
        rebuilds += 1
        real_rebuild()

    runs._rebuild_heaps = counted
    for _ in range(4000):
        if free and (rng.random() < 0.5 or len(free) == size):
            start, length = rng.choice(runs_of_sorted(sorted(free)))
            n = rng.randint(1, length)
            assert runs.take_head(start, n) == n
            free -= set(range(start, start + n))
        else:
            used = runs_of_sorted(sorted(set(range(size)) - free))
            start, length = rng.choice(used)
            a = rng.randint(start, start + length - 1)
            b = rng.randint(a + 1, start + length)
            runs.add_range(a, b - a)
            free |= set(range(a, b))
        n = rng.randint(1, 40)
        assert runs.first_fit(n) == _brute_first_fit(free, n)
        want = max(runs_of_sorted(sorted(free)), key=lambda r: (r[1], -r[0]), default=(-1, 0))
        assert runs.largest_run() == want
    assert rebuilds > 0  # the lazy-deletion path was exercised
    assert list(runs.runs()) == runs_of_sorted(sorted(free))


def test_take_head_takes_from_a_run_start_only():
    runs = FreeRuns(10)
    assert runs.take_head(3, 2) == 0  # no run starts at 3: nothing taken
    assert runs.take_head(0, 4) == 4 and list(runs.runs()) == [(4, 6)]
    assert runs.take_head(4, 100) == 6 and list(runs.runs()) == [] and runs.num_free == 0


def test_alloc_after_batch_grows_every_request_before_any_falls_back():
    a = SortedRunAllocator(64)
    first = a.alloc_list(4)  # 0..3
    a.alloc_list(4)  # 4..7: blocks the first request's growth
    second = a.alloc_list(2)  # 8, 9: free after it
    got = a.alloc_after_batch([first[-1], second[-1]], [3, 3])
    assert got[1] == [10, 11, 12]  # the second grows in place although the first asked before it
    assert got[0] == [13, 14, 15]  # the first, blocked, gets the lowest run that fits after that
    assert a.alloc_after_batch([got[1][-1], -1], [2, 1]) == [[16, 17], [18]]
    with pytest.raises(PoolExhaustedError):
        a.alloc_after_batch([first[-1], second[-1]], [30, 30])
    assert a.num_free == 64 - 19  # all or nothing
    with pytest.raises(ValueError, match="sizes"):
        a.alloc_after_batch([first[-1]], [1, 2])
