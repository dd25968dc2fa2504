"""Run-length KV metadata for the tree-verify kernel: (first slot, first key) runs per request
instead of one slot id per key.

A request whose keys sit in consecutive slots needs one run, whatever its length; a fragmented
one needs one per stretch. The kernel (`kdtree.kernels.cuda_op.launch` with ``kv_runs=``) finds
key j's slot by a binary search for the last run of its request that starts at or before j, so a
request in R runs costs log2(R) extra cached loads per key and a defragmented one (R = 1) none.

Layout (`KVRuns`): request b's runs are ``indptr[b] .. indptr[b + 1] - 1`` in token order; run r
holds the request's keys ``pos[r] .. pos[r + 1] - 1`` (the request's last run: up to its N) in
slots ``start[r], start[r] + 1, ...``. ``num_kv`` is the batch's total keys (``kv_indptr[B]``),
kept on the host so that a launch plans without reading the device.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch


class KVRuns(NamedTuple):
    """Run-length KV metadata of a batch (module docstring): int32 tensors on the kernel's device."""

    indptr: torch.Tensor  # [B + 1]
    start: torch.Tensor  # [R]
    pos: torch.Tensor  # [R]
    num_kv: int  # sum of the requests' N (kv_indptr[B])

    @property
    def num_runs(self) -> int:
        return self.start.numel()

    def metadata_bytes(self) -> int:
        """Bytes the kernel reads as metadata: start and pos per run, indptr per request."""
        return 4 * (2 * self.num_runs + self.indptr.numel())


def runs_from_slot_lists(slot_lists: Sequence[Sequence[int]], device="cpu") -> KVRuns:
    """KVRuns of a batch given each request's slots in token order (built on the host, uploaded)."""
    indptr, start, pos = [0], [], []
    for slots in slot_lists:
        prev = None
        for j, s in enumerate(slots):
            s = int(s)
            if prev is None or s != prev + 1:
                start.append(s)
                pos.append(j)
            prev = s
        indptr.append(len(start))

    def t(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32).to(device)
    return KVRuns(t(indptr), t(start), t(pos), sum(len(s) for s in slot_lists))


def runs_from_run_lists(run_lists: Sequence[Sequence[tuple[int, int]]], device="cpu") -> KVRuns:
    """KVRuns of a batch given each request's (first slot, length) runs in token order, as the
    engine's pool keeps them (`kdtree.engine.kv.kv_pool.KVPool.runs`); adjacent runs that continue
    each other are merged."""
    indptr, start, pos, total = [0], [], [], 0
    for runs in run_lists:
        j, end = 0, None
        for s, n in runs:
            s, n = int(s), int(n)
            if n <= 0:
                continue
            if s != end:
                start.append(s)
                pos.append(j)
            j += n
            end = s + n
        indptr.append(len(start))
        total += j

    def t(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32).to(device)
    return KVRuns(t(indptr), t(start), t(pos), total)


def runs_from_indices(kv_indptr: torch.Tensor, kv_indices: torch.Tensor) -> KVRuns:
    """KVRuns of a batch given its kv_indptr / kv_indices, computed on their device (reads the run
    count and the total back to the host once)."""
    n = kv_indices.numel()
    device = kv_indices.device
    indptr = kv_indptr.long()
    first = torch.zeros(n, dtype=torch.bool, device=device)
    if n:
        first[1:] = kv_indices[1:].long() != kv_indices[:-1].long() + 1
        first[0] = True
        starts = indptr[:-1][indptr[:-1] < indptr[1:]]  # every non-empty request starts a run
        first[starts] = True
    where = torch.nonzero(first).flatten()
    request = torch.searchsorted(indptr, where, right=True) - 1  # the request each run belongs to
    counts = torch.bincount(request, minlength=kv_indptr.numel() - 1)
    run_indptr = torch.zeros(kv_indptr.numel(), dtype=torch.int32, device=device)
    run_indptr[1:] = torch.cumsum(counts, 0).to(torch.int32)
    return KVRuns(run_indptr, kv_indices[where].to(torch.int32).contiguous(),
                  (where - indptr[request]).to(torch.int32).contiguous(), int(n))


def expand(runs: KVRuns, kv_indptr: torch.Tensor) -> torch.Tensor:
    """The kv_indices the runs stand for (int32, on their device): what the kernel reads per key."""
    device = runs.start.device
    indptr = kv_indptr.to(device).long()
    key = torch.arange(runs.num_kv, device=device)
    request = torch.searchsorted(indptr, key, right=True) - 1
    j = key - indptr[request]
    # global run of each key: the last run of its request with pos <= j
    run_indptr = runs.indptr.long()
    order = runs.pos.long() + indptr[torch.searchsorted(run_indptr, torch.arange(runs.num_runs, device=device),
                                                         right=True) - 1]
    run = torch.searchsorted(order, key, right=True) - 1
    if runs.num_kv and bool(((run < run_indptr[request]) | (run >= run_indptr[request + 1])).any()):
        raise ValueError("kv_runs: a key falls outside its request's runs")
    return (runs.start.long()[run] + j - runs.pos.long()[run]).to(torch.int32)
