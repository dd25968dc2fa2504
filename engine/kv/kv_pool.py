"""The page_size=1 KV token pool: one [S, 576] latent tensor per layer and the req_to_token map.

``req_to_token[rid]`` lists, in token order, the slots holding request ``rid``'s KV; it is the
single source of truth for which slot holds which token (relocation rewrites it). The allocator
decides only which slots are free.

Everything indexed by slot id is registered here so that moving a token's KV updates all of it
at once (`move_tokens`): the target model's layers (``kv``), a draft model's own KV pool indexed
by the same slot ids (``draft_kv``, as SGLang's EAGLE draft pool shares the target's allocator),
and other holders of slot ids such as a prefix cache's nodes (`register_holder`).
"""

from __future__ import annotations

from typing import Callable, Hashable, Optional

import torch

from kdtree.engine.kv.allocator import FreeListAllocator, SlotAllocator
from kdtree.engine.kv.run_metadata import SlotSequences
from kdtree.kernels.contract import QK_DIM


class KVPool:
    def __init__(self, num_layers: int, num_slots: int, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", allocator: Optional[SlotAllocator] = None,
                 draft_layers: int = 0):
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if draft_layers < 0:
            raise ValueError(f"draft_layers must be >= 0, got {draft_layers}")
        self.allocator = allocator if allocator is not None else FreeListAllocator(num_slots)
        if self.allocator.num_slots != num_slots:
            raise ValueError(f"allocator has {self.allocator.num_slots} slots, pool has {num_slots}")
        self.num_slots = num_slots
        self.kv = [torch.zeros(num_slots, QK_DIM, dtype=dtype, device=device) for _ in range(num_layers)]
        self.draft_kv = [torch.zeros(num_slots, QK_DIM, dtype=dtype, device=device)
                         for _ in range(draft_layers)]
        self.requests = SlotSequences()
        self.holders: list[SlotSequences] = []

    @property
    def req_to_token(self) -> dict[int, list[int]]:
        """rid -> slots in token order (read only; change it through append / release / move_tokens)."""
        return self.requests._slots

    def kv_stores(self) -> list[torch.Tensor]:
        """Every tensor indexed by slot id: target layers, then draft layers."""
        return self.kv + self.draft_kv

    @property
    def bytes_per_slot(self) -> int:
        """Bytes one token's KV occupies over every store (what moving one slot copies)."""
        return sum(t.shape[1] * t.element_size() for t in self.kv_stores())

    def register_holder(self, holder: SlotSequences) -> None:
        """Another owner of slot sequences (e.g. a prefix cache's nodes) that relocation must update."""
        if holder is self.requests or any(h is holder for h in self.holders):
            raise ValueError("holder is already registered")
        self.holders.append(holder)

    def sequence_sets(self) -> list[SlotSequences]:
        """Requests first, then every registered holder."""
        return [self.requests, *self.holders]

    # -- requests -------------------------------------------------------------------------------
    def add_request(self, rid: int) -> None:
        if rid in self.requests:
            raise ValueError(f"request {rid} is already in the pool")
        self.requests.add(rid)

    def seq_len(self, rid: int) -> int:
        return len(self._slots_of(rid))

    def slots(self, rid: int) -> list[int]:
        """The request's slots in token order (a copy)."""
        return list(self._slots_of(rid))

    def runs(self, rid: int) -> list[tuple[int, int]]:
        """The request's (start, length) runs in token order."""
        self._check_rid(rid)
        return [(s, n) for s, n in self.requests.runs(rid)]

    def num_runs(self, rid: int) -> int:
        self._check_rid(rid)
        return self.requests.num_runs(rid)

    def append(self, rid: int, slots) -> None:
        """Record allocated slots as the request's next tokens."""
        ids = slots.tolist() if isinstance(slots, torch.Tensor) else [int(s) for s in slots]
        self._check_rid(rid)
        is_allocated = self.allocator.is_allocated
        contiguous = len(ids) > 8 and ids[-1] - ids[0] == len(ids) - 1 and ids == list(range(ids[0], ids[-1] + 1))
        if contiguous and 0 <= ids[0] and self.allocator.count_allocated(ids[0], ids[-1] + 1) == len(ids):
            pass
        elif not all(map(is_allocated, ids)):
            bad = next(s for s in ids if not is_allocated(s))
            raise ValueError(f"append: slot {bad} is not allocated")
        self.requests.append(rid, ids)

    def release(self, rid: int) -> None:
        """Free every slot of the request and forget it."""
        slots = self.requests.pop(self._check_rid(rid))
        if slots:
            self.allocator.free(slots)

    # -- slots ----------------------------------------------------------------------------------
    def alloc(self, n: int) -> torch.Tensor:
        return self.allocator.alloc(n)

    def alloc_for(self, rid: int, n: int) -> list[int]:
        """n slots for request rid's next tokens, grown after its last slot where the allocator can."""
        row = self._slots_of(rid)
        alloc_after = getattr(self.allocator, "alloc_after", None)
        if alloc_after is None:
            return self.allocator.alloc(n).tolist()
        return alloc_after(row[-1] if row else -1, n)

    def alloc_trees(self, rids, sizes) -> list[list[int]]:
        """sizes[b] slots for request rids[b]'s next tokens (one step's draft trees), all or nothing.

        With a growing allocator (Tier 0's ``alloc_after_batch``) each request's slots extend its
        last run where the slots after it are free; otherwise one allocation for the whole batch
        is split in request order (SGLang's page_size=1 order).
        """
        sizes = list(sizes)
        if len(sizes) != len(rids):
            raise ValueError(f"alloc_trees: {len(rids)} requests but {len(sizes)} sizes")
        batch = getattr(self.allocator, "alloc_after_batch", None)
        if batch is not None:
            rows = self.requests._slots
            try:
                lasts = [rows[r][-1] if rows[r] else -1 for r in rids]
            except KeyError as exc:
                raise ValueError(f"request {exc.args[0]} is not in the pool") from None
            return batch(lasts, sizes)
        block = self.allocator.alloc(sum(sizes)).tolist()
        out, at = [], 0
        for n in sizes:
            out.append(block[at:at + n])
            at += n
        return out

    def free(self, slots) -> None:
        self.allocator.free(slots)

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    def owner_map(self) -> dict[int, tuple[int, Hashable]]:
        """slot -> (sequence set index, key) for every held slot (ValueError if one is held twice).

        Set index 0 is the requests (key = rid); 1.. are the registered holders.
        """
        owner: dict[int, tuple[int, Hashable]] = {}
        for i, seqs in enumerate(self.sequence_sets()):
            for key, slots in seqs.items():
                for s in slots:
                    if s in owner:
                        raise ValueError(f"slot {s} is held by {owner[s]} and {(i, key)}")
                    owner[s] = (i, key)
        return owner

    # -- relocation -----------------------------------------------------------------------------
    def move_tokens(self, set_index: int, key: Hashable, pos: int, new_slots: list[int],
                    copy_rows: Optional[Callable[[list[int], list[int]], None]] = None) -> int:
        """Move tokens pos.. of one sequence into new_slots, on every store; returns rows copied.

        Each destination must be free or one of the moved tokens' own slots (a slide over itself
        is fine: rows are gathered before they are scattered). The copies are enqueued on the
        current stream before the sequence is rewritten and the vacated slots are freed, so any
        later step (which builds its metadata from the rewritten map) and any later writer of a
        vacated slot is ordered after them.
        """
        seqs = self.sequence_sets()[set_index]
        row = seqs.slots(key)
        old = row[pos:pos + len(new_slots)]
        if len(old) != len(new_slots):
            raise ValueError(f"move_tokens: sequence {key!r} has {len(row)} tokens, cannot move "
                             f"{len(new_slots)} from {pos}")
        if len(set(new_slots)) != len(new_slots):
            raise ValueError("move_tokens: destinations repeat")
        own = set(old)
        claim = [d for d in new_slots if d not in own]
        self.allocator.claim(claim)  # ValueError if a destination is held by anyone
        pairs = [(s, d) for s, d in zip(old, new_slots) if s != d]
        if pairs:
            (copy_rows or self.copy_rows)([s for s, _ in pairs], [d for _, d in pairs])
        seqs.rewrite(key, pos, list(new_slots))
        vacated = own.difference(new_slots)
        if vacated:
            self.allocator.free(sorted(vacated))
        return len(pairs)

    def copy_rows(self, src: list[int], dst: list[int]) -> None:
        """KV rows of slots src -> slots dst on every store (gathered first: src and dst may overlap)."""
        device = self.kv[0].device
        src_t = torch.tensor(src, dtype=torch.long).to(device, non_blocking=True)
        dst_t = torch.tensor(dst, dtype=torch.long).to(device, non_blocking=True)
        for store in self.kv_stores():
            store.index_copy_(0, dst_t, store.index_select(0, src_t))

    def relocate(self, src, dst) -> None:
        """Move live tokens' KV from slots src to free slots dst (every store), rewrite the maps."""
        src = [int(s) for s in src]
        dst = [int(s) for s in dst]
        if len(src) != len(dst):
            raise ValueError(f"relocate: {len(src)} sources but {len(dst)} destinations")
        owner = self.owner_map()
        missing = [s for s in src if s not in owner]
        if missing:
            raise ValueError(f"relocate: slots {missing[:8]} hold no request's token")
        taken = [d for d in dst if self.allocator.is_allocated(d)]
        if taken:
            raise ValueError(f"relocate: slot {taken[0]} is already allocated")
        moved = dict(zip(src, dst))
        for set_index, key in {owner[s] for s in src}:
            row = self.sequence_sets()[set_index].slots(key)
            first = min(i for i, s in enumerate(row) if s in moved)
            self.move_tokens(set_index, key, first, [moved.get(s, s) for s in row[first:]])

    def _check_rid(self, rid: int) -> int:
        if rid not in self.requests:
            raise ValueError(f"request {rid} is not in the pool")
        return rid

    def _slots_of(self, rid: int) -> list[int]:
        return self.requests.slots(self._check_rid(rid))
