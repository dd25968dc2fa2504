"""The native allocator core (engine/kv/csrc/slot_runs.cpp) against the Python core: the same random
operations give the same slots, runs and errors; where it cannot be built the Python core serves."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdtree.engine.kv import native
from kdtree.engine.kv.allocator import PoolExhaustedError, PySlotRuns, SortedRunAllocator, make_slot_runs

needs_native = pytest.mark.skipif(native.slot_runs() is None,
                                  reason=f"the native allocator core does not build here: {native.unavailable_reason()}")

_OPS = st.lists(st.tuples(st.sampled_from(["alloc", "grow", "batch", "free", "claim", "double_free"]),
                          st.integers(0, 2**31 - 1)), min_size=1, max_size=60)


def _apply(a: SortedRunAllocator, op: str, r: int, held: list[list[int]]):
    """One operation drawn from r (deterministic in r and the allocator's state); its result."""
    try:
        if op == "alloc":
            got = a.alloc_list(r % 50)
            held.append(got)
            return got
        if op in ("grow", "batch") and held:
            picks = [held[(r >> (4 * k)) % len(held)] for k in range(1 + (op == "batch") * (r % 5))]
            lasts = [h[-1] if h else -1 for h in picks]
            sizes = [(r >> (3 * k)) % 20 for k in range(len(picks))]
            got = a.alloc_after_batch(lasts, sizes)
            for h, g in zip(picks, got):
                h.extend(g)
            return got
        if op == "free" and held:
            h = held[r % len(held)]
            chosen = [s for i, s in enumerate(h) if (r >> (i % 30)) & 1]
            a.free(chosen)
            h[:] = [s for s in h if s not in set(chosen)]
            return chosen
        if op == "claim":
            free = a.free_slots()
            chosen = [s for i, s in enumerate(free[:40]) if (r >> (i % 30)) & 1]
            a.claim(chosen)
            held.append(chosen)
            return chosen
        if op == "double_free" and any(held):
            h = next(h for h in held if h)
            a.free([h[0]])
            a.free([h[0]])
    except (ValueError, PoolExhaustedError) as err:
        return type(err).__name__, str(err).split(":")[0]
    return None


@needs_native
@settings(max_examples=150, deadline=None)
@given(size=st.integers(1, 300), ops=_OPS)
def test_native_and_python_cores_agree_on_every_operation(size, ops):
    pair = [SortedRunAllocator(size, native=True), SortedRunAllocator(size, native=False)]
    helds: list[list[list[int]]] = [[], []]
    for op, r in ops:
        results = [_apply(a, op, r, h) for a, h in zip(pair, helds)]
        assert results[0] == results[1], (op, r)
        assert pair[0].free_runs.runs() == pair[1].free_runs.runs()
        assert pair[0].num_free == pair[1].num_free
        assert pair[0].highest_allocated() == pair[1].highest_allocated()
        assert pair[0].free_runs.largest_run() == pair[1].free_runs.largest_run()
        for n in (1, 3, 17):
            assert pair[0].free_runs.first_fit(n) == pair[1].free_runs.first_fit(n)
        assert len(pair[0].free_runs) == len(pair[1].free_runs)
        for probe in (-1, 0, r % size, size - 1, size):  # a run's start, a slot inside one, out of range
            assert pair[0].free_runs.run_at(probe) == pair[1].free_runs.run_at(probe), probe


@needs_native
def test_the_default_core_is_native_where_it_builds_and_errors_read_the_same():
    a = SortedRunAllocator(10)
    assert a.native
    a.alloc_list(4)
    with pytest.raises(ValueError, match="not allocated"):
        a.free([7])
    with pytest.raises(ValueError, match="not in this pool"):
        a.free([10])
    with pytest.raises(ValueError, match="repeat"):
        a.free([1, 1])
    with pytest.raises(ValueError, match="already allocated"):
        a.claim([2])
    with pytest.raises(PoolExhaustedError, match="asked for 7 slots, 6 of 10 are free"):
        a.alloc(7)
    assert a.free_runs.runs() == [(4, 6)] and a.num_free == 6  # no failed call changed anything


def test_without_the_native_core_the_python_core_serves(monkeypatch):
    monkeypatch.setenv("KDTREE_NATIVE", "0")
    native.slot_runs.cache_clear()
    try:
        assert isinstance(make_slot_runs(16), PySlotRuns)
        assert not SortedRunAllocator(16).native
        with pytest.raises(RuntimeError, match="KDTREE_NATIVE=0"):
            make_slot_runs(16, native=True)
    finally:
        monkeypatch.delenv("KDTREE_NATIVE")
        native.slot_runs.cache_clear()


def test_a_failed_build_says_why_and_the_python_core_serves(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no c++, g++ or clang++ either
    monkeypatch.setenv("KDTREE_CACHE_DIR", str(tmp_path / "cache"))
    native.slot_runs.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="kdtree.engine.kv.native"):
            assert native.slot_runs() is None
        assert "no C++ compiler" in native.unavailable_reason()
        assert any("using the Python core" in r.getMessage() for r in caplog.records)
        assert not SortedRunAllocator(8).native
    finally:
        native.slot_runs.cache_clear()


@pytest.mark.parametrize("use_native", [pytest.param(True, marks=needs_native), False], ids=["native", "python"])
def test_a_copied_or_pickled_allocator_has_the_same_state_and_is_its_own(use_native):
    import copy
    import pickle

    from kdtree.engine.kv.kv_pool import KVPool

    a = SortedRunAllocator(300, native=use_native)
    held = a.alloc_list(40)
    a.free(held[5:9] + held[20:21])
    a.claim([100, 101, 250])
    for b in (copy.deepcopy(a), pickle.loads(pickle.dumps(a))):
        assert b.native == a.native
        assert b.free_runs.runs() == a.free_runs.runs() and b.num_free == a.num_free
        assert [b.is_allocated(s) for s in range(300)] == [a.is_allocated(s) for s in range(300)]
        b.alloc_list(7)
        assert b.num_free == a.num_free - 7  # the copy is its own
    pool = KVPool(1, 300, allocator=SortedRunAllocator(300, native=use_native))
    snapshot = copy.deepcopy(pool)  # what phase 1's decoy step does to share a prefilled pool
    assert snapshot.allocator.free_runs.runs() == pool.allocator.free_runs.runs()


@needs_native
def test_a_native_allocator_unpickles_to_the_python_core_where_none_builds(monkeypatch):
    import pickle

    a = SortedRunAllocator(64, native=True)
    a.alloc_list(10)
    data = pickle.dumps(a)
    monkeypatch.setenv("KDTREE_NATIVE", "0")
    native.slot_runs.cache_clear()
    try:
        b = pickle.loads(data)
        assert not b.native and b.free_runs.runs() == [(10, 54)]
    finally:
        monkeypatch.delenv("KDTREE_NATIVE")
        native.slot_runs.cache_clear()
