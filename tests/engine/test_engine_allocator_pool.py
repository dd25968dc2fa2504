"""The allocator and the KV token pool: all-or-nothing alloc, checked frees, req_to_token invariants."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kdtree.engine.kv.allocator import FreeListAllocator, PoolExhaustedError
from kdtree.engine.kv.kv_pool import KVPool


def test_alloc_hands_out_distinct_int32_slots_in_range():
    a = FreeListAllocator(10)
    slots = a.alloc(4)
    assert slots.dtype == torch.int32
    assert sorted(slots.tolist()) == [0, 1, 2, 3]
    more = a.alloc(6)
    assert set(slots.tolist()).isdisjoint(more.tolist())
    assert a.num_free == 0 and a.num_used == 10


def test_exhausted_pool_raises_and_allocates_nothing():
    a = FreeListAllocator(5)
    a.alloc(3)
    with pytest.raises(PoolExhaustedError, match="asked for 3 slots, 2 of 5 are free"):
        a.alloc(3)
    assert a.num_free == 2
    assert len(a.alloc(2)) == 2


def test_double_free_foreign_slot_and_repeats_are_errors():
    a = FreeListAllocator(6)
    slots = a.alloc(3).tolist()
    a.free(slots[:1])
    with pytest.raises(ValueError, match="not allocated"):
        a.free(slots[:1])
    with pytest.raises(ValueError, match="not in this pool"):
        a.free([6])
    with pytest.raises(ValueError, match="repeat"):
        a.free([slots[1], slots[1]])
    with pytest.raises(ValueError, match="not allocated"):
        a.free([5])  # never handed out
    assert a.num_free == 4  # the failed frees changed nothing


def test_freed_slots_are_reused_first():
    a = FreeListAllocator(8)
    first = a.alloc(4).tolist()
    a.free(first[1:3])
    assert sorted(a.alloc(2).tolist()) == sorted(first[1:3])


def test_claim_takes_specific_free_slots_only():
    a = FreeListAllocator(8)
    a.claim([5, 7])
    assert a.is_allocated(5) and a.is_allocated(7) and a.num_free == 6
    with pytest.raises(ValueError, match="already allocated"):
        a.claim([5])
    assert 5 not in a.alloc(6).tolist()


def test_pool_append_needs_allocated_slots_and_release_frees_them():
    pool = KVPool(2, 16)
    pool.add_request(0)
    with pytest.raises(ValueError, match="not allocated"):
        pool.append(0, [3])
    pool.append(0, pool.alloc(5))
    assert pool.seq_len(0) == 5 and pool.num_free == 11
    pool.release(0)
    assert pool.num_free == 16
    with pytest.raises(ValueError, match="not in the pool"):
        pool.slots(0)


def test_relocate_moves_rows_on_every_layer_and_rewrites_req_to_token():
    pool = KVPool(3, 12)
    pool.add_request(7)
    slots = pool.alloc(4).tolist()
    pool.append(7, slots)
    for layer, kv in enumerate(pool.kv):
        kv[torch.tensor(slots)] = torch.arange(4 * 576, dtype=torch.float32).view(4, 576) + layer
    before = [kv[torch.tensor(slots)].clone() for kv in pool.kv]
    pool.relocate(slots[1:3], [10, 11])
    assert pool.slots(7) == [slots[0], 10, 11, slots[3]]
    for layer, kv in enumerate(pool.kv):
        assert torch.equal(kv[torch.tensor(pool.slots(7))], before[layer])
    assert not pool.allocator.is_allocated(slots[1]) and pool.num_free == 8
    with pytest.raises(ValueError, match="already allocated"):
        pool.relocate([slots[0]], [10])


class PoolChurn(RuleBasedStateMachine):
    """Random requests arrive, grow, move and leave; the pool never loses or double-books a slot."""

    @initialize(size=st.integers(1, 64))
    def make(self, size):
        self.pool = KVPool(1, size)
        self.next_rid = 0

    @rule(n=st.integers(0, 20))
    def add_request(self, n):
        rid, self.next_rid = self.next_rid, self.next_rid + 1
        free_before = self.pool.num_free
        self.pool.add_request(rid)
        if n > free_before:
            with pytest.raises(PoolExhaustedError):
                self.pool.alloc(n)
            assert self.pool.num_free == free_before
        else:
            self.pool.append(rid, self.pool.alloc(n))

    @precondition(lambda self: self.pool.req_to_token)
    @rule(data=st.data(), n=st.integers(1, 10))
    def grow(self, data, n):
        rid = data.draw(st.sampled_from(sorted(self.pool.req_to_token)))
        if n <= self.pool.num_free:
            self.pool.append(rid, self.pool.alloc(n))

    @precondition(lambda self: self.pool.req_to_token)
    @rule(data=st.data())
    def leave(self, data):
        self.pool.release(data.draw(st.sampled_from(sorted(self.pool.req_to_token))))

    @precondition(lambda self: self.pool.owner_map() and self.pool.num_free)
    @rule(data=st.data())
    def move(self, data):
        owned = sorted(self.pool.owner_map())
        free = self.pool.allocator.free_slots()
        k = data.draw(st.integers(1, min(len(owned), len(free))))
        self.pool.relocate(owned[:k], free[:k])

    @rule(slot=st.integers(-2, 70))
    def bad_free(self, slot):
        if not self.pool.allocator.is_allocated(slot):
            with pytest.raises(ValueError):
                self.pool.free([slot])

    @invariant()
    def every_slot_free_or_owned_once(self):
        owner = self.pool.owner_map()  # raises if a slot is held twice
        free = set(self.pool.allocator.free_slots())
        assert len(free) == self.pool.num_free
        assert free.isdisjoint(owner)
        assert free | set(owner) == set(range(self.pool.num_slots))

    def teardown(self):
        for rid in list(self.pool.req_to_token):
            self.pool.release(rid)
        assert self.pool.num_free == self.pool.num_slots


TestPoolChurn = PoolChurn.TestCase
TestPoolChurn.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
