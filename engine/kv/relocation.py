"""Tier 1: move live KV rows of fragmented sequences into runs, between steps, under a copy budget.

A round (`Relocator.step(budget_bytes)`) looks at every sequence the pool knows (requests'
req_to_token rows and every registered holder, e.g. a prefix cache's nodes) and proposes, per
sequence, the move with the best expected gain — runs removed per row copied:

- *slide*: the tokens from run i on move to the slots right after run i-1 (those slots must be
  free, or be the moved tokens' own slots); runs i-1.. become one. This is what compacts a
  speculative-decoding tail whose rejected draft slots left holes.
- *fresh*: the tokens from run i on (i = 0: the whole sequence), or runs 0..j of a sequence too
  long to move whole, move to the lowest free run long enough to hold them (needs the Tier 0
  allocator's free runs).

Moves are applied greedily, best ratio first, each re-checked against the pool as it is by then,
and never past the budget; a move is never split. A round rewrites every reference on the host
and enqueues all of its copies (one gather and one scatter per store) on the current stream
before it returns, so the next step — whose metadata is built from the maps after the round —
reads the new slots, ordered after the copies.

Slots a running or captured step can still read are pinned (`PinTable`): relocation never reads
a pinned slot as a source, nor writes one as a destination.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Iterable, Optional

from kdtree.engine.kv.kv_pool import KVPool


class PinTable:
    """Slots held by in-flight or captured steps, by epoch: `pin` when a step's metadata is built,
    `retire` when the step can no longer read them (finished, or its graph dropped)."""

    def __init__(self) -> None:
        self._count: dict[int, int] = {}
        self._epochs: dict[int, list[int]] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._count)

    def pin(self, slots: Iterable[int]) -> int:
        epoch, self._next = self._next, self._next + 1
        held = [int(s) for s in slots]
        self._epochs[epoch] = held
        for s in held:
            self._count[s] = self._count.get(s, 0) + 1
        return epoch

    def retire(self, epoch: int) -> None:
        for s in self._epochs.pop(epoch):
            left = self._count[s] - 1
            if left:
                self._count[s] = left
            else:
                del self._count[s]

    def is_pinned(self, slot: int) -> bool:
        return slot in self._count

    def any_pinned(self, slots: Iterable[int]) -> bool:
        count = self._count
        return bool(count) and any(s in count for s in slots)


@dataclass(frozen=True)
class Move:
    set_index: int  # which of pool.sequence_sets()
    key: Hashable
    pos: int  # first token moved
    new_slots: tuple[int, ...]
    old_slots: tuple[int, ...]  # the slots the moved tokens held when the move was planned
    gain: int  # runs removed
    rows: int  # rows copied (tokens whose slot changes)
    kind: str  # "slide" | "fresh"


@dataclass
class RelocationRound:
    budget_bytes: int
    bytes_copied: int = 0
    rows_copied: int = 0
    runs_removed: int = 0
    moves: list[Move] = field(default_factory=list)


class Relocator:
    """Plans and applies relocation rounds over one pool (see the module docstring)."""

    def __init__(self, pool: KVPool, pins: Optional[PinTable] = None, max_runs_scanned: int = 64):
        self.pool = pool
        self.pins = pins if pins is not None else PinTable()
        self.max_runs_scanned = max_runs_scanned

    def step(self, budget_bytes: int) -> RelocationRound:
        """One round between steps: moves chosen by gain per byte, at most budget_bytes copied."""
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        report = RelocationRound(budget_bytes=int(budget_bytes))
        bps = self.pool.bytes_per_slot
        budget_rows = self.budget_rows(budget_bytes)
        if budget_rows < 1:
            return report
        proposals = [m for m in self.propose(budget_rows) if m is not None]
        proposals.sort(key=lambda m: (-m.gain / m.rows, -m.gain))
        src: list[int] = []
        dst: list[int] = []

        def collect(s: list[int], d: list[int]) -> None:
            src.extend(s)
            dst.extend(d)

        for m in proposals:
            if report.rows_copied + m.rows > budget_rows:
                continue
            if not self.still_valid(m):  # an earlier move took its destination: plan it again
                m = self.best_move(m.set_index, m.key, budget_rows - report.rows_copied)
                if m is None:
                    continue
            copied = self.pool.move_tokens(m.set_index, m.key, m.pos, list(m.new_slots), copy_rows=collect)
            report.rows_copied += copied
            report.bytes_copied += copied * bps
            report.runs_removed += m.gain
            report.moves.append(m)
        if src:
            # One gather over every store, then one scatter: a slot vacated by one move and
            # claimed by a later one is read before it is written.
            self.copy_rows(src, dst)
        return report

    def still_valid(self, m: Move) -> bool:
        """The move's tokens still sit where they were planned and its destinations are still free."""
        row = self.pool.sequence_sets()[m.set_index].slots(m.key)
        if tuple(row[m.pos:m.pos + len(m.old_slots)]) != m.old_slots:
            return False
        start, stop = m.new_slots[0], m.new_slots[-1] + 1  # destinations are one run
        own_inside = sum(1 for s in m.old_slots if start <= s < stop)
        return self.pool.allocator.count_allocated(start, stop) == own_inside and \
            not self.pins.any_pinned(m.new_slots)

    def budget_rows(self, budget_bytes: int) -> int:
        return int(budget_bytes) // self.pool.bytes_per_slot

    def propose(self, budget_rows: int) -> list[Optional[Move]]:
        return [self.best_move(i, key, budget_rows)
                for i, seqs in enumerate(self.pool.sequence_sets())
                for key in seqs.keys() if seqs.num_runs(key) > 1]

    def copy_rows(self, src: list[int], dst: list[int]) -> None:
        """Copy a round's rows (every store); the one place a round touches KV bytes."""
        self.pool.copy_rows(src, dst)

    # -- planning -------------------------------------------------------------------------------
    def best_move(self, set_index: int, key: Hashable, budget_rows: int) -> Optional[Move]:
        """The move of one sequence with the most runs removed per row copied, within budget_rows.

        Candidates are scored from the runs alone (no per-slot work); only the chosen one builds
        its slot lists, and free runs are looked up only for the best-scoring fresh candidates.
        """
        seqs = self.pool.sequence_sets()[set_index]
        runs, row = seqs.runs(key), seqs.slots(key)
        k, n = len(runs), len(row)
        if k < 2:
            return None
        pinned = len(self.pins) > 0
        best_slide = None  # (gain, rows, i, pos, base)
        fresh = []  # (gain / rows, gain, rows, pos, length)
        pos = n
        lowest = max(0, k - self.max_runs_scanned)
        for i in range(k - 1, lowest - 1, -1):  # suffixes from the shortest up
            pos -= runs[i][1]
            length = n - pos
            if length > budget_rows:
                break
            if pinned and self.pins.any_pinned(row[pos:]):
                break  # every longer suffix holds these pinned slots too
            slide = self._score_slide(runs, i, pos, length) if i >= 1 else None
            if slide is not None:
                gain, rows, base = slide
                if best_slide is None or (gain * best_slide[1], gain) > (best_slide[0] * rows, best_slide[0]):
                    best_slide = (gain, rows, i, pos, base)
            elif k - i >= 2:
                fresh.append(((k - i - 1) / length, k - i - 1, length, pos, length))
        head = 0  # prefixes: runs 0..j into a fresh run, for sequences too long to move whole
        for j in range(min(k - 1, self.max_runs_scanned)):
            head += runs[j][1]
            if head > budget_rows:
                break
            if j >= 1:
                fresh.append((j / head, j, head, 0, head))
        best: Optional[Move] = None
        if best_slide is not None:
            gain, rows, i, pos, base = best_slide
            best = Move(set_index, key, pos, tuple(range(base, base + n - pos)), tuple(row[pos:]),
                        gain=gain, rows=rows, kind="slide")
        fresh.sort(reverse=True)
        for _, gain, rows, pos, length in fresh[:3]:
            if best is not None and gain * best.rows <= best.gain * rows:
                break
            move = self._fresh(set_index, key, pos, row[pos:pos + length], gain)
            if move is not None:
                best = move
                break
        return best

    def _score_slide(self, runs, i, pos, length):
        """(gain, rows, base) of sliding runs i.. to just after run i-1, or None if blocked."""
        base = runs[i - 1][0] + runs[i - 1][1]
        stop = base + length
        if stop > self.pool.num_slots:
            return None
        own_inside = identity = 0
        p = pos
        for start, run_len in runs[i:]:
            own_inside += max(0, min(start + run_len, stop) - max(start, base))
            if start == base + (p - pos):
                identity += run_len
            p += run_len
        if self.pool.allocator.count_allocated(base, stop) != own_inside:
            return None  # someone else holds a slot of the window
        if len(self.pins) and self.pins.any_pinned(range(base, stop)):
            return None
        rows = length - identity
        return (len(runs) - i, rows, base) if rows else None

    def _fresh(self, set_index, key, pos, tokens, gain) -> Optional[Move]:
        """`tokens` (from token pos; `gain` runs removed) into the lowest free run that holds them."""
        free_runs = getattr(self.pool.allocator, "free_runs", None)
        if free_runs is None:
            return None
        start = free_runs.first_fit(len(tokens))
        if start is None:
            return None
        window = range(start, start + len(tokens))
        if self.pins.any_pinned(window):
            return None
        return Move(set_index, key, pos, tuple(window), tuple(tokens), gain=gain, rows=len(tokens), kind="fresh")


def _better(a: Optional[Move], b: Optional[Move]) -> Optional[Move]:
    if b is None or b.gain < 1:
        return a
    if a is None:
        return b
    return b if (b.gain * a.rows, b.gain) > (a.gain * b.rows, a.gain) else a
