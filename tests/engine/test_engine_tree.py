"""Token trees, the DDTree best-first builder and the prompt-lookup trie."""

from __future__ import annotations

import itertools

import pytest
import torch

from kdtree.engine import TokenTree
from kdtree.engine.decode.drafters import NgramDrafter
from kdtree.engine.decode.tree import TreeBuilder, best_first_tree
from kdtree.kernels import pack_tree_masks


def test_tree_rejects_malformed_parents_and_duplicate_siblings():
    with pytest.raises(ValueError, match="parents\\[0\\]"):
        TokenTree([1, 2], [0, 0])
    with pytest.raises(ValueError, match="parents\\[2\\] = 2"):
        TokenTree([1, 2, 3], [-1, 0, 2])
    with pytest.raises(ValueError, match="two children with token 7"):
        TokenTree([1, 7, 7], [-1, 0, 0])
    with pytest.raises(ValueError, match="1025 nodes"):
        TokenTree(list(range(1025)), [-1] + list(range(1024)))
    tree = TokenTree([1, 7, 8, 9], [-1, 0, 0, 1])
    assert tree.child(0, 8) == 2 and tree.child(1, 9) == 3 and tree.child(2, 9) is None
    assert tree.depths() == [0, 1, 1, 2]


def path_tokens(tree: TokenTree) -> set[tuple[int, ...]]:
    paths = {}
    for t in range(1, len(tree)):
        paths[t] = paths.get(tree.parents[t], ()) + (tree.tokens[t],)
    return set(paths.values())


@pytest.mark.parametrize("seed,budget", [(0, 8), (1, 20), (2, 40), (3, 156)])
def test_best_first_tree_holds_the_highest_scoring_paths(seed, budget):
    depth, vocab = 3, 5
    logprobs = torch.log_softmax(torch.randn(depth, vocab, generator=torch.Generator().manual_seed(seed)), -1)
    tree = best_first_tree(42, logprobs, budget)
    assert len(tree) == min(budget, 1 + 5 + 25 + 125)
    assert tree.root == 42 and all(p < t for t, p in enumerate(tree.parents) if t)
    every = [path for d in range(1, depth + 1) for path in itertools.product(range(vocab), repeat=d)]
    score = {path: float(sum(logprobs[i, tok] for i, tok in enumerate(path))) for path in every}
    best = sorted(every, key=score.get, reverse=True)[: len(tree) - 1]
    assert path_tokens(tree) == set(best)
    pack_tree_masks([tree.parents])  # a valid op-contract tree


def test_best_first_tree_reaches_the_largest_budgets():
    logprobs = torch.log_softmax(torch.randn(8, 1024, generator=torch.Generator().manual_seed(0)), -1)
    for budget in (16, 256, 512, 1024):
        assert len(best_first_tree(0, logprobs, budget)) == budget
    with pytest.raises(ValueError, match="budget"):
        best_first_tree(0, logprobs, 0)


def test_tree_builder_merges_shared_prefixes_and_stops_at_the_budget():
    b = TreeBuilder(9, budget=5)
    b.add_path([1, 2, 3])
    b.add_path([1, 2, 4])
    b.add_path([5, 6])
    tree = b.build()
    assert tree.tokens == [9, 1, 2, 3, 4] and tree.parents == [-1, 0, 1, 2, 2]


def test_prompt_lookup_follows_earlier_occurrences_most_recent_first():
    drafter = NgramDrafter(max_n=3, max_depth=4)
    context = [1, 2, 3, 4, 9, 2, 3, 5, 6, 2, 3]
    tree = drafter.tree_for(context, budget=32)
    assert tree.root == 3
    paths = path_tokens(tree)
    assert (5, 6, 2, 3) in paths and (4, 9, 2, 3) in paths  # both earlier "2 3" continuations
    assert tree.tokens[1] == 5  # the most recent match comes first
    assert len(drafter.tree_for(context, budget=3)) == 3
    assert len(drafter.tree_for([7, 8, 9], budget=16)) == 1  # nothing to look up
