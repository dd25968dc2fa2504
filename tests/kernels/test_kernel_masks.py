"""Packed tree masks: hand-made trees, pack/unpack round trips, the batch layout, SGLang's layout."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kdtree.kernels import pack_sglang_custom_mask, pack_tree_masks, tree_mask_from_parents
from kdtree.kernels.masks import pack_bool_rows, unpack_bool_rows


def _words(mask: torch.Tensor) -> list:
    """Rows as lists of unsigned 32-bit words."""
    return [[w & 0xFFFFFFFF for w in row] for row in mask.tolist()]


@pytest.mark.parametrize("parents,rows", [
    ([-1], [0b1]),
    ([-1, 0, 1, 2], [0b1, 0b11, 0b111, 0b1111]),  # chain
    ([-1, 0, 0, 0], [0b1, 0b11, 0b101, 0b1001]),  # star
    ([-1, 0, 0, 1, 1, 2], [0b1, 0b11, 0b101, 0b1011, 0b10011, 0b100101]),  # two levels
])
def test_hand_made_trees(parents, rows):
    mask = tree_mask_from_parents(parents)
    assert mask.dtype == torch.int32 and mask.shape == (len(parents), 1)
    assert _words(mask) == [[r] for r in rows]


def test_chain_of_33_uses_two_words_and_bit_31():
    mask = tree_mask_from_parents([-1] + list(range(32)))
    assert mask.shape == (33, 2)
    assert mask[31, 0].item() == -1 and mask[31, 1].item() == 0  # bits 0..31: the sign bit is set
    assert _words(mask)[32] == [0xFFFFFFFF, 1]


def test_star_of_40_second_word():
    mask = tree_mask_from_parents([-1] + [0] * 39)
    assert _words(mask)[35] == [1, 1 << 3]  # the root and node 35 = word 1, bit 3


@pytest.mark.parametrize("parents,msg", [
    ([], "root"),
    ([0, 0], "parents\\[0\\] must be -1"),
    ([-1, 1], "parents\\[1\\] = 1"),
    ([-1, 0, -1], "parents\\[2\\] = -1"),
    ([-1] * 1 + [0] * 1024, "1025 nodes"),
])
def test_bad_parents(parents, msg):
    with pytest.raises(ValueError, match=msg):
        tree_mask_from_parents(parents)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 70), st.integers(0, 2), st.data())
def test_pack_unpack_round_trip(columns, spare_words, data):
    n = data.draw(st.integers(1, 5))
    bits = data.draw(st.lists(st.booleans(), min_size=n * columns, max_size=n * columns))
    rows = np.array(bits, dtype=bool).reshape(n, columns)
    words = (columns + 31) // 32 + spare_words
    packed = pack_bool_rows(rows, words)
    assert packed.dtype == np.int32 and packed.shape == (n, words)
    assert torch.equal(unpack_bool_rows(torch.from_numpy(packed), columns), torch.from_numpy(rows))
    assert not unpack_bool_rows(torch.from_numpy(packed), 32 * words)[:, columns:].any()


def test_pack_rejects_too_few_words():
    with pytest.raises(ValueError):
        pack_bool_rows(np.ones((2, 33), dtype=bool), 1)


def test_pack_tree_masks_batch_layout():
    trees = [[-1, 0, 1], [-1] + [0] * 39, [-1]]
    batch = pack_tree_masks(trees)
    assert batch.shape == (44, 2) and batch.dtype == torch.int32
    start = 0
    for parents in trees:
        one = tree_mask_from_parents(parents)
        T = len(parents)
        assert torch.equal(batch[start: start + T, : one.shape[1]], one)
        assert not batch[start: start + T, one.shape[1]:].any()  # padding words are zero
        start += T
    with pytest.raises(ValueError, match="empty"):
        pack_tree_masks([])


def _sglang_layout(trees, prefix_lens):
    """SGLang's flattened bool custom_mask: per request a row-major T x (L+T) block, prefix True."""
    blocks, mask_indptr, qo, kv = [], [0], [0], [0]
    for parents, L in zip(trees, prefix_lens):
        T = len(parents)
        block = np.zeros((T, L + T), dtype=bool)
        block[:, :L] = True
        for t in range(T):
            s = t
            while s >= 0:
                block[t, L + s] = True
                s = parents[s]
        blocks.append(block.ravel())
        mask_indptr.append(mask_indptr[-1] + block.size)
        qo.append(qo[-1] + T)
        kv.append(kv[-1] + L + T)
    as_i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    return torch.from_numpy(np.concatenate(blocks)), as_i32(mask_indptr), as_i32(qo), as_i32(kv)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sglang_custom_mask_round_trip(seed):
    rng = random.Random(seed)
    sizes = [rng.choice([1, 2, 7, 31, 32, 33, 64, 65]) for _ in range(rng.randint(1, 5))]
    trees = [[-1] + [rng.randrange(t) for t in range(1, T)] for T in sizes]
    prefix_lens = [rng.choice([0, 1, 17, 100]) for _ in sizes]
    custom, mask_indptr, qo, kv = _sglang_layout(trees, prefix_lens)
    assert torch.equal(pack_sglang_custom_mask(custom, mask_indptr, qo, kv), pack_tree_masks(trees))


def test_sglang_custom_mask_errors():
    custom, mask_indptr, qo, kv = _sglang_layout([[-1, 0], [-1, 0, 0]], [3, 2])
    hidden = custom.clone()
    hidden[0] = False  # request 0, node 0 cannot see prefix slot 0
    with pytest.raises(ValueError, match="custom_mask"):
        pack_sglang_custom_mask(hidden, mask_indptr, qo, kv)
    short = mask_indptr.clone()
    short[1] -= 1
    with pytest.raises(ValueError, match="mask_indptr"):
        pack_sglang_custom_mask(custom, short, qo, kv)
    with pytest.raises(ValueError, match="same length"):
        pack_sglang_custom_mask(custom, mask_indptr[:-1], qo, kv)
    fewer_slots = kv.clone()
    fewer_slots[1] = 1  # request 0: 2 tree nodes but only 1 slot
    with pytest.raises(ValueError, match="request 0"):
        pack_sglang_custom_mask(custom, mask_indptr, qo, fewer_slots)


@pytest.mark.parametrize("batch,match", [
    ([-1, 0, 1], r"^parents_per_request\[0\]: expected a list of parent indices, got -1"),
    (np.array([-1, 0, 0]), r"^parents_per_request: expected one parents row per request .* 1-D array"),
    (torch.tensor([-1, 0]), r"^parents_per_request: expected one parents row per request"),
    ("abc", r"^parents_per_request: expected a list"),
    ([], r"^parents_per_request: the batch is empty"),
    ([[-1, 0], []], r"^parents_per_request\[1\]: a tree needs at least its root"),
    ([[-1, 0], [-1, 5]], r"^parents_per_request\[1\]: parents\[1\] = 5"),
])
def test_pack_tree_masks_names_what_is_wrong_with_the_batch(batch, match):
    with pytest.raises(ValueError, match=match):
        pack_tree_masks(batch)


def test_pack_tree_masks_takes_a_2d_array_of_equal_trees():
    rows = np.array([[-1, 0, 0], [-1, 0, 1]])
    assert torch.equal(pack_tree_masks(rows), pack_tree_masks(rows.tolist()))


def test_pack_sglang_custom_mask_on_an_empty_batch_names_qo_indptr():
    empty = torch.zeros(0, dtype=torch.bool)
    one = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"^qo_indptr: the batch is empty"):
        pack_sglang_custom_mask(empty, one, one.int(), one.int())


def test_pack_sglang_custom_mask_names_a_short_or_shaped_mask():
    qo = torch.tensor([0, 2], dtype=torch.int32)
    kv = torch.tensor([0, 3], dtype=torch.int32)
    mi = torch.tensor([0, 6], dtype=torch.int64)
    with pytest.raises(ValueError, match=r"^mask_indptr: ends at 6 but custom_mask has 4 entries"):
        pack_sglang_custom_mask(torch.ones(4, dtype=torch.bool), mi, qo, kv)
    with pytest.raises(ValueError, match=r"^custom_mask: expected a flat"):
        pack_sglang_custom_mask(torch.ones(2, 3, dtype=torch.bool), mi, qo, kv)
