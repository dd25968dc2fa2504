"""Tier 1: moving tokens rewrites every holder, relocation keeps its budget and pins, loses nothing;
SGLang's allocator model and the run-length metadata."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kdtree.bench.churn import ChurnConfig, ChurnRun, check_integrity, replay_on_sglang_model
from kdtree.bench.sglang_allocator_model import SGLangTokenAllocatorModel, UnsortedFreeListAllocator
from kdtree.engine.kv.allocator import SortedRunAllocator
from kdtree.engine.kv.kv_pool import KVPool
from kdtree.engine.kv.prefix_cache import PrefixCacheModel
from kdtree.engine.kv.relocation import PinTable, Relocator
from kdtree.engine.kv.run_metadata import SlotSequences, expand_runs, runs_of


def _pool(slots=64, draft_layers=1):
    return KVPool(2, slots, allocator=SortedRunAllocator(slots), draft_layers=draft_layers)


def _fill(pool, slots, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.tensor(slots)
    for store in pool.kv_stores():
        store[idx] = torch.randn(len(slots), store.shape[1], generator=g)


def _rows(pool, slots):
    idx = torch.tensor(slots)
    return [s[idx].clone() for s in pool.kv_stores()]


@given(st.lists(st.integers(0, 50), unique=True, min_size=1), st.data())
@settings(max_examples=80, deadline=None)
def test_rewrite_keeps_runs_equal_to_the_slots(slots, data):
    seqs = SlotSequences()
    seqs.add("a", slots)
    pos = data.draw(st.integers(0, len(slots)))
    new = data.draw(st.lists(st.integers(100, 200), unique=True, min_size=0, max_size=len(slots) - pos))
    seqs.rewrite("a", pos, new)
    want = slots[:pos] + new + slots[pos + len(new):]
    assert seqs.slots("a") == want
    assert [tuple(r) for r in seqs.runs("a")] == runs_of(want)


def test_slide_over_itself_moves_every_store_and_frees_the_holes():
    pool = _pool()
    pool.add_request(0)
    slots = [0, 1, 2, 4, 7, 8]  # holes at 3, 5, 6 (rejected drafts)
    pool.allocator.claim(slots)
    pool.append(0, slots)
    _fill(pool, slots)
    before = _rows(pool, slots)
    copied = pool.move_tokens(0, 0, 3, [3, 4, 5])
    assert pool.slots(0) == [0, 1, 2, 3, 4, 5] and pool.runs(0) == [(0, 6)]
    assert copied == 3  # 4->3, 7->4, 8->5
    for b, a in zip(before, _rows(pool, pool.slots(0))):
        assert torch.equal(a, b)  # target and draft stores alike
    assert not pool.allocator.is_allocated(7) and not pool.allocator.is_allocated(8)


def test_move_refuses_a_destination_someone_holds():
    pool = _pool()
    for rid, s in ((0, [0, 2]), (1, [3])):
        pool.add_request(rid)
        pool.allocator.claim(s)
        pool.append(rid, s)
    with pytest.raises(ValueError, match="already allocated"):
        pool.move_tokens(0, 0, 1, [3])
    assert pool.slots(0) == [0, 2] and pool.slots(1) == [3]


def test_prefix_cache_nodes_are_rewritten_with_their_rows():
    pool = _pool()
    cache = PrefixCacheModel(pool)
    pool.add_request(5)
    pool.allocator.claim([10, 20, 30])
    pool.append(5, [10, 20, 30])
    _fill(pool, [10, 20, 30])
    before = _rows(pool, [10, 20, 30])
    node = cache.insert(5, [1, 2, 3])
    report = Relocator(pool).step(10 * pool.bytes_per_slot)
    assert report.rows_copied > 0 and cache.nodes.num_runs(node) == 1
    for b, a in zip(before, _rows(pool, cache.slots(node))):
        assert torch.equal(a, b)
    assert cache.match([1, 2, 3]) == node and cache.evict(1) == 3 and pool.num_free == 64


def _fragmented_pool(seed=0):
    pool = _pool(slots=256)
    for rid in range(6):
        pool.add_request(rid)
    # interleave: every request gets one slot in turn, so each has many runs
    for s in range(0, 180):
        rid = s % 6
        pool.allocator.claim([s])
        pool.append(rid, [s])
    for rid in (1, 4):
        pool.release(rid)
    _fill(pool, [s for r in pool.requests.keys() for s in pool.slots(r)], seed)
    return pool


def test_relocation_keeps_the_budget_removes_runs_and_loses_nothing():
    pool = _fragmented_pool()
    keys = pool.requests.keys()
    before = {r: _rows(pool, pool.slots(r)) for r in keys}
    runs0 = sum(pool.num_runs(r) for r in keys)
    relocator = Relocator(pool)
    for _ in range(20):
        report = relocator.step(17 * pool.bytes_per_slot)
        assert report.rows_copied <= 17 and report.bytes_copied == report.rows_copied * pool.bytes_per_slot
    assert sum(pool.num_runs(r) for r in keys) < runs0 / 4
    for r in keys:
        for b, a in zip(before[r], _rows(pool, pool.slots(r))):
            assert torch.equal(a, b)
    pool.owner_map()  # no slot held twice


def test_pinned_slots_are_never_read_or_written():
    pool = _fragmented_pool()
    pins = PinTable()
    pinned = pool.slots(0) + pool.allocator.free_slots()[:40]
    epoch = pins.pin(pinned)
    before = pool.slots(0)
    Relocator(pool, pins).step(10_000 * pool.bytes_per_slot)
    assert pool.slots(0) == before
    assert not any(pool.allocator.is_allocated(s) for s in pinned[len(before):])
    pins.retire(epoch)
    assert len(pins) == 0
    runs_pinned = pool.num_runs(0)
    for _ in range(5):
        Relocator(pool, pins).step(10_000 * pool.bytes_per_slot)
    assert pool.num_runs(0) < runs_pinned  # once unpinned it moves


def test_a_zero_budget_moves_nothing():
    pool = _fragmented_pool()
    slots = {r: pool.slots(r) for r in pool.requests.keys()}
    assert Relocator(pool).step(pool.bytes_per_slot - 1).rows_copied == 0
    assert {r: pool.slots(r) for r in pool.requests.keys()} == slots


@pytest.mark.slow
def test_churn_integrity_holds_and_catches_a_dropped_row():
    cfg = ChurnConfig(num_slots=2048, live_requests=6, prompt_len=(16, 128), new_tokens=(8, 64), steps=25,
                      device="cpu", dtype=torch.float32, draft_layers=1, prefix_cache_fraction=0.5,
                      pin_fraction=0.3)
    run = ChurnRun(cfg, "tier0+1", seed=3, integrity_every=1)
    run.run()
    assert sum(r.rows_copied for r in run.stats.rounds) > 0
    assert all(c["kv_bytes_changed"] == 0 and c["kv_slots_lost"] == 0 and c["pinned_slots_touched"] == 0
               for c in run.stats.integrity)

    class DropsARow(Relocator):
        def copy_rows(self, src, dst):
            super().copy_rows(src[:-1], dst[:-1])

    broken = ChurnRun(cfg, "tier0+1", seed=3, relocator_cls=DropsARow)
    broken.run()
    assert check_integrity(broken)["kv_bytes_changed"] > 0


@pytest.mark.slow
def test_churn_modes_see_the_same_workload():
    cfg = ChurnConfig(num_slots=4096, live_requests=8, prompt_len=(16, 256), new_tokens=(8, 64), steps=30)
    runs = {m: ChurnRun(cfg, m, seed=11) for m in ("unsorted", "sglang_sorted", "tier0", "tier0+1")}
    for r in runs.values():
        r.run()
    lens = [{k: r.pool.seq_len(k) for k in r.pool.requests.keys()} for r in runs.values()]
    assert all(x == lens[0] for x in lens) and lens[0]
    assert len({r.pool.num_free for r in runs.values()}) == 1
    per_req = {m: r.stats.runs_per_request(r.pool) for m, r in runs.items()}
    assert per_req["tier0+1"] < per_req["unsorted"]


def test_sglang_model_hands_out_the_head_and_appends_frees_unsorted():
    m = SGLangTokenAllocatorModel(8)
    a = m.alloc(3)
    assert a.tolist() == [0, 1, 2]
    m.free(torch.tensor([2, 0]))
    assert m.free_pages.tolist() == [3, 4, 5, 6, 7, 2, 0]
    assert m.alloc(9) is None
    s = SGLangTokenAllocatorModel(8, need_sort=True)
    s.alloc(6)
    s.free(torch.tensor([4, 1]))
    assert s.free_pages.tolist() == [6, 7] and s.alloc(3).tolist() == [1, 4, 6]


def test_replaying_the_unsorted_trace_on_the_sglang_model_gives_the_same_ids():
    cfg = ChurnConfig(num_slots=2048, live_requests=5, prompt_len=(16, 64), new_tokens=(8, 32), steps=20)
    run = ChurnRun(cfg, "unsorted", seed=2, trace=True)
    run.run()
    trace = run.pool.allocator.trace
    per_step = replay_on_sglang_model(trace, cfg.num_slots)
    assert len(per_step) == cfg.steps
    model, ref = SGLangTokenAllocatorModel(64), UnsortedFreeListAllocator(64)
    for n, free in ((5, [1, 3]), (4, [0]), (6, [2, 4, 5])):
        assert model.alloc(n).tolist() == ref.alloc(n).tolist()
        model.free(torch.tensor(free))
        ref.free(free)
    assert model.free_pages.tolist() == ref.free_slots()


@given(st.lists(st.integers(0, 500), unique=True, min_size=1))
def test_expand_runs_gives_back_the_slots(slots):
    runs = runs_of(slots)
    starts = torch.tensor([s for s, _ in runs], dtype=torch.int32)
    lens = torch.tensor([n for _, n in runs], dtype=torch.int32)
    assert expand_runs(starts, lens).tolist() == slots
    assert expand_runs(starts, lens, len(slots)).tolist() == slots
