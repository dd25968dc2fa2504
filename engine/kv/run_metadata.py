"""Slot sequences with their runs, and run-length KV metadata.

A *sequence* is what holds slots in token order: a request's req_to_token row, or a prefix-cache
node. `SlotSequences` keeps each sequence's slot list together with its runs (maximal stretches
where token i+1 sits in slot s+1), updated incrementally, so counting runs never rescans a
32k-token row. `expand_runs` turns (start, length) runs back into the per-token ``kv_indices`` the
kernel reads (on the device, no host sync); `runs_metadata_bytes` and `indices_metadata_bytes`
are the two layouts' sizes.
"""

from __future__ import annotations

from typing import Hashable, Iterable, Iterator, Optional

import torch


class SlotSequences:
    """key -> slots in token order, plus their runs ([start, length] lists, token order)."""

    def __init__(self) -> None:
        self._slots: dict[Hashable, list[int]] = {}
        self._runs: dict[Hashable, list[list[int]]] = {}

    def __contains__(self, key: Hashable) -> bool:
        return key in self._slots

    def __len__(self) -> int:
        return len(self._slots)

    def keys(self) -> list[Hashable]:
        return list(self._slots)

    def items(self) -> Iterator[tuple[Hashable, list[int]]]:
        return iter(self._slots.items())

    def slots(self, key: Hashable) -> list[int]:
        """The live slot list (do not mutate; use append / rewrite)."""
        return self._slots[key]

    def runs(self, key: Hashable) -> list[list[int]]:
        """The live run list (do not mutate)."""
        return self._runs[key]

    def num_runs(self, key: Hashable) -> int:
        return len(self._runs[key])

    def add(self, key: Hashable, slots: Iterable[int] = ()) -> None:
        if key in self._slots:
            raise ValueError(f"sequence {key!r} already exists")
        self._slots[key], self._runs[key] = [], []
        self.append(key, slots)

    def pop(self, key: Hashable) -> list[int]:
        del self._runs[key]
        return self._slots.pop(key)

    def append(self, key: Hashable, slots: Iterable[int]) -> None:
        ids = [int(s) for s in slots]
        self._slots[key].extend(ids)
        _extend_runs(self._runs[key], ids)

    def rewrite(self, key: Hashable, pos: int, new_slots: list[int]) -> None:
        """Tokens pos .. pos+len(new_slots)-1 now live in new_slots; runs rebuilt from pos on."""
        row, runs = self._slots[key], self._runs[key]
        end = pos + len(new_slots)
        if pos < 0 or end > len(row):
            raise ValueError(f"rewrite: tokens [{pos}, {end}) are outside sequence {key!r} of {len(row)}")
        row[pos:end] = [int(s) for s in new_slots]
        covered = 0  # truncate the runs to the first pos tokens
        for i, run in enumerate(runs):
            if covered + run[1] >= pos:
                run[1] = pos - covered
                del runs[i + 1 if run[1] else i:]
                break
            covered += run[1]
        _extend_runs(runs, row[pos:])


def _extend_runs(runs: list[list[int]], slots: list[int]) -> None:
    if len(slots) > 8 and slots[-1] - slots[0] == len(slots) - 1 and slots == list(range(slots[0], slots[-1] + 1)):
        if runs and runs[-1][0] + runs[-1][1] == slots[0]:  # one run (a prompt, a grown tail)
            runs[-1][1] += len(slots)
        else:
            runs.append([slots[0], len(slots)])
        return
    for s in slots:
        if runs and runs[-1][0] + runs[-1][1] == s:
            runs[-1][1] += 1
        else:
            runs.append([s, 1])


def runs_of(slots: Iterable[int]) -> list[tuple[int, int]]:
    """(start, length) runs of a slot sequence in token order."""
    runs: list[list[int]] = []
    for s in slots:
        if runs and runs[-1][0] + runs[-1][1] == s:
            runs[-1][1] += 1
        else:
            runs.append([int(s), 1])
    return [(a, b) for a, b in runs]


def expand_runs(run_starts: torch.Tensor, run_lens: torch.Tensor, total: Optional[int] = None) -> torch.Tensor:
    """int32 kv_indices [sum(run_lens)] from runs, on their device; `total` avoids a host sync.

    Parallel over tokens, whatever the runs' lengths: each token finds its run by a binary search
    over the runs' end positions (a repeat_interleave is parallel over runs, so a few long runs
    — a defragmented batch — would expand slower than many short ones).
    """
    lens = run_lens.long()
    if total is None:
        total = int(lens.sum())
    ends = torch.cumsum(lens, 0)  # token position one past each run
    pos = torch.arange(total, device=run_starts.device)
    run = torch.searchsorted(ends, pos, right=True)
    return (run_starts.long()[run] + pos - (ends - lens)[run]).to(torch.int32)


def indices_metadata_bytes(num_tokens: int, batch: int) -> int:
    """kv_indices (int32 per token) + kv_indptr (int32 [B+1])."""
    return 4 * num_tokens + 4 * (batch + 1)


def runs_metadata_bytes(num_runs: int, batch: int) -> int:
    """run starts + run lengths (int32 each per run) + run indptr (int32 [B+1])."""
    return 8 * num_runs + 4 * (batch + 1)
