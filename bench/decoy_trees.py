"""Decoy trees for phase 1's token-exact gate: verify steps whose tokens depend on the tree mask.

The engine's model decides greedily by prompt lookup ("continue as the last occurrence of this
token did, else follow the backbone"), with wide margins, so on drafted trees its tokens barely
depend on which tree nodes a query sees: a chain mask instead of the tree, or mask words past the
first ignored, still gave the same tokens. A decoy tree makes them depend on it.

For a request whose greedy continuation ``g_1 .. g_P`` is known (from the reference), the tree is

- a trunk of filler tokens from the root, with one decoy branch per target path node ``i``
  hanging off it: the pair ``(g_i, w_i)`` (``w_i`` a token greedy decoding does not choose
  there), at depths of its own and in depth-first order, so that under a mask that leaks
  (node t sees every node before it) ``w_i``'s previous-token code is still ``g_i``: a
  query of token ``g_i`` that sees it finds "g_i was followed by w_i" and copies ``w_i``;
- then the greedy path itself, from the root, as the last nodes: past index 32 (so mask words
  after the first matter to every path node), after every decoy in node order.

With the right mask the decoys are invisible to the path and the whole path is accepted (P
drafted tokens plus the bonus token). A leaking mask exposes the decoys, so path nodes copy
their ``w_i`` and acceptance stops early; a mask that hides nodes past the first word hides the
path from itself (each node loses itself and its ancestors past index 32), so the induction head
falls back to a diffuse read and tokens change.

Everything here is host-side tree construction; nothing imports torch at module level.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class DecoyTree:
    """A verify tree (tokens and parents in node order) and where its greedy path lies."""

    tokens: list[int]
    parents: list[int]
    path_nodes: list[int]  # node index of g_1 .. g_P

    @property
    def path_len(self) -> int:
        return len(self.path_nodes)


def decoy_tree(root: int, path: list[int], vocab: int, rng: random.Random, decoys: int = 8,
               min_path_start: int = 33) -> DecoyTree:
    """The decoy tree of the module docstring for a request whose pending token is ``root`` and
    whose greedy continuation is ``path`` (at least one token). Decoy ``i`` targets path node
    ``i % len(path)``; ``decoys`` branches of two nodes each, the trunk grows until the path
    starts at node index ``min_path_start`` or later."""
    if not path:
        raise ValueError("decoy_tree: the greedy path needs at least one token")
    tokens, parents = [int(root)], [-1]

    def add(token: int, parent: int) -> int:
        tokens.append(int(token))
        parents.append(parent)
        return len(tokens) - 1

    def filler(avoid: set[int]) -> int:
        while True:
            tok = rng.randrange(vocab)
            if tok not in avoid:
                return tok

    # first trunk node: the root's other child must differ from the path's first token
    trunk = add(filler(set(path)), 0)
    depth_node = [0, trunk]  # trunk node at each depth
    for i in range(decoys):
        # two more trunk nodes, then the branch (g, w) off the second: depths 2i+3 and 2i+4
        for _ in range(2):
            depth_node.append(add(filler(set(path)), depth_node[-1]))
        target = i % len(path)
        follow = path[target + 1] if target + 1 < len(path) else None
        g = add(path[target], depth_node[-1])
        add(filler({follow, path[target]} - {None}), g)
    while len(tokens) < min_path_start:
        depth_node.append(add(filler(set(path)), depth_node[-1]))
    path_nodes, parent = [], 0
    for tok in path:
        parent = add(tok, parent)
        path_nodes.append(parent)
    return DecoyTree(tokens, parents, path_nodes)
