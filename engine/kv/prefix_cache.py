"""A minimal prefix cache over the KV pool: finished requests' KV kept as nodes that hold slot ids.

The engine has no prefix cache; this models the part that matters to relocation: nodes that hold
slot ids in token order (as SGLang's radix-tree nodes hold ``value`` tensors of slot ids), which a
relocation must rewrite together with req_to_token. A finished request's KV is donated to a node
keyed by its token ids instead of being freed; ``match`` finds the node of a token prefix (whole
nodes only); ``evict`` frees least-recently-used nodes.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional, Sequence

from kdtree.engine.kv.kv_pool import KVPool
from kdtree.engine.kv.run_metadata import SlotSequences


class PrefixCacheModel:
    def __init__(self, pool: KVPool):
        self.pool = pool
        self.nodes = SlotSequences()  # node id -> slots in token order
        self._tokens: dict[int, tuple[int, ...]] = {}
        self._by_tokens: dict[tuple[int, ...], int] = {}
        self._lru: "OrderedDict[int, None]" = OrderedDict()
        self._next = 0
        pool.register_holder(self.nodes)

    @property
    def num_slots(self) -> int:
        return sum(len(s) for _, s in self.nodes.items())

    def insert(self, rid: int, tokens: Sequence[int]) -> int:
        """Take over request rid's KV (one slot per token of `tokens`) as a new node; returns its id."""
        tokens = tuple(int(t) for t in tokens)
        if self.pool.seq_len(rid) != len(tokens):
            raise ValueError(f"insert: request {rid} holds {self.pool.seq_len(rid)} slots, "
                             f"got {len(tokens)} tokens")
        if tokens in self._by_tokens:  # already cached: the request's copy is freed
            self.pool.release(rid)
            return self._by_tokens[tokens]
        slots = self.pool.requests.pop(rid)
        node, self._next = self._next, self._next + 1
        self.nodes.add(node, slots)
        self._tokens[node], self._by_tokens[tokens] = tokens, node
        self._lru[node] = None
        return node

    def match(self, tokens: Sequence[int]) -> Optional[int]:
        """The node caching exactly these tokens (marked recently used), or None."""
        node = self._by_tokens.get(tuple(int(t) for t in tokens))
        if node is not None:
            self._lru.move_to_end(node)
        return node

    def slots(self, node: int) -> list[int]:
        return list(self.nodes.slots(node))

    def evict(self, num_slots: int) -> int:
        """Free least-recently-used nodes until at least num_slots slots are freed; returns slots freed."""
        freed = 0
        while freed < num_slots and self._lru:
            node, _ = self._lru.popitem(last=False)
            slots = self.nodes.pop(node)
            del self._by_tokens[self._tokens.pop(node)]
            if slots:
                self.pool.allocator.free(slots)
            freed += len(slots)
        return freed
