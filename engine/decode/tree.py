"""Token trees for verification, and DDTree-style best-first tree building.

A `TokenTree` is ``tokens`` plus ``parents`` in node order: node 0 is the root (the newest token,
whose KV is not yet in the pool), ``parents[0] = -1`` and ``parents[t] < t``; siblings carry
distinct tokens, so greedy verification follows at most one child per node.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Sequence

import torch

from kdtree.kernels.contract import MAX_TREE_NODES


@dataclass(frozen=True)
class TokenTree:
    tokens: list[int]
    parents: list[int]
    _children: list[dict[int, int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"tree: {len(self.tokens)} tokens but {len(self.parents)} parents")
        if not self.tokens:
            raise ValueError("tree: needs at least its root")
        if len(self.tokens) > MAX_TREE_NODES:
            raise ValueError(f"tree: {len(self.tokens)} nodes exceed the op contract's {MAX_TREE_NODES}")
        if self.parents[0] != -1:
            raise ValueError(f"tree: parents[0] must be -1, got {self.parents[0]}")
        children: list[dict[int, int]] = [dict() for _ in self.tokens]
        for t in range(1, len(self.tokens)):
            p = self.parents[t]
            if not 0 <= p < t:
                raise ValueError(f"tree: parents[{t}] = {p}, need 0 <= parents[t] < t")
            if self.tokens[t] in children[p]:
                raise ValueError(f"tree: node {p} has two children with token {self.tokens[t]}")
            children[p][self.tokens[t]] = t
        object.__setattr__(self, "_children", children)

    @classmethod
    def single(cls, root: int) -> "TokenTree":
        return cls([int(root)], [-1])

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def root(self) -> int:
        return self.tokens[0]

    def child(self, node: int, token: int) -> int | None:
        """The child of `node` carrying `token`, or None."""
        return self._children[node].get(token)

    def depths(self) -> list[int]:
        depth = [0] * len(self.parents)
        for t in range(1, len(self.parents)):
            depth[t] = depth[self.parents[t]] + 1
        return depth


class TreeBuilder:
    """Grows a tree by paths of tokens under the root, merging shared prefixes, up to a budget."""

    def __init__(self, root: int, budget: int):
        self.tokens, self.parents, self.budget = [int(root)], [-1], budget
        self._index: dict[tuple[int, int], int] = {}

    @property
    def full(self) -> bool:
        return len(self.tokens) >= self.budget

    def add_child(self, parent: int, token: int) -> int | None:
        """The node for `token` under `parent` (made if new and the budget allows, else None)."""
        key = (parent, int(token))
        if key in self._index:
            return self._index[key]
        if self.full:
            return None
        self.tokens.append(int(token))
        self.parents.append(parent)
        self._index[key] = len(self.tokens) - 1
        return self._index[key]

    def add_path(self, path: Sequence[int]) -> None:
        node = 0
        for token in path:
            node = self.add_child(node, token)
            if node is None:
                return

    def build(self) -> TokenTree:
        return TokenTree(list(self.tokens), list(self.parents))


def best_first_tree(root: int, depth_logprobs: torch.Tensor, budget: int) -> TokenTree:
    """DDTree: the `budget` highest-scoring paths from per-depth candidate distributions.

    depth_logprobs [D, V]: log-probabilities of the token at depth d+1 (depth 0 is the root),
    taken as independent of the path above it (as a block drafter predicts them). A node's score
    is the sum of its path's log-probs; the tree holds the root and the budget-1 best nodes,
    every prefix of a kept path included (scores only fall along a path). Best-first with a heap
    whose entries are "the next-best sibling" and "the best child" of each node taken.
    """
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if depth_logprobs.dim() != 2:
        raise ValueError(f"depth_logprobs must be [D, V], got shape {tuple(depth_logprobs.shape)}")
    builder = TreeBuilder(root, budget)
    depth = depth_logprobs.shape[0]
    if depth == 0 or budget == 1:
        return builder.build()
    k = min(budget - 1, depth_logprobs.shape[1])
    top_lp, top_tok = depth_logprobs.float().topk(k, dim=-1)
    top_lp, top_tok = top_lp.cpu().tolist(), top_tok.cpu().tolist()
    # entries: (-score, tie-break counter, parent node, parent score, depth index, rank)
    heap = [(-top_lp[0][0], 0, 0, 0.0, 0, 0)]
    counter = 1
    while heap and not builder.full:
        neg, _, parent, parent_score, d, rank = heapq.heappop(heap)
        node = builder.add_child(parent, top_tok[d][rank])
        if rank + 1 < k:
            heapq.heappush(heap, (-(parent_score + top_lp[d][rank + 1]), counter, parent, parent_score, d, rank + 1))
            counter += 1
        if d + 1 < depth:
            heapq.heappush(heap, (-(-neg + top_lp[d + 1][0]), counter, node, -neg, d + 1, 0))
            counter += 1
    return builder.build()
