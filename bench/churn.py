"""A churn workload over the KV pool: requests arrive, decode speculatively and leave.

Every step each live request allocates its draft tree's T slots, writes their KV, keeps the
accepted path's slots (the root plus a few nodes, at increasing node indices, as tree verify
does) and frees the rest; requests finish after their drawn number of new tokens and new ones
arrive while the pool's occupancy allows. Everything the workload draws (prompt and output
lengths, accepted paths) comes from per-request random streams, so every allocator mode sees
the same sequence of operations and the same number of free slots at every step.

Modes: ``unsorted`` (SGLang's page_size=1 order: one batch-wide alloc from the head of an
unsorted free list, frees at the tail), ``sglang_sorted`` (the same with SGLang's PD-disaggregation
sort), ``tier0`` (sorted runs, per-request allocation grown in place) and ``tier0+1`` (tier0 plus
a relocation round after every step under a copy budget).

With materialised stores (not ``device="meta"``) every written row is random and an independent
shadow copy is kept, so `check_integrity` can compare every live sequence's KV, read through the
maps, with what was written.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field


import torch

from kdtree.bench.sglang_allocator_model import UnsortedFreeListAllocator
from kdtree.engine.kv.allocator import SortedRunAllocator
from kdtree.engine.kv.kv_pool import KVPool
from kdtree.engine.kv.prefix_cache import PrefixCacheModel
from kdtree.engine.kv.relocation import PinTable, RelocationRound, Relocator

MODES = ("unsorted", "sglang_sorted", "tier0", "tier0+1")


@dataclass(frozen=True)
class ChurnConfig:
    num_slots: int = 1 << 20
    live_requests: int = 256
    prompt_len: tuple[int, int] = (256, 4096)
    new_tokens: tuple[int, int] = (64, 768)
    tree_size: int = 16  # T: slots a request's draft tree takes per step
    max_accept: int = 6  # accepted path length (root included) is drawn from 1..max_accept
    path: str = "tree"  # "tree": accepted nodes at random increasing indices; "chain": nodes 0..a-1
    steps: int = 200
    max_occupancy: float = 0.9  # arrivals wait while live tokens would exceed this fraction
    num_layers: int = 1
    draft_layers: int = 0
    device: str = "meta"  # "meta": bookkeeping only (no KV bytes); else KV rows are written
    dtype: torch.dtype = torch.bfloat16
    copy_budget_fraction: float = 0.01  # tier0+1: copy traffic (read+write) per step / step's KV reads
    prefix_cache_fraction: float = 0.0  # finished requests donated to a prefix cache
    pin_fraction: float = 0.0  # live requests whose slots are pinned during each relocation round
    write_rows: bool = True  # with materialised stores: write random KV rows and keep the shadow

    def __post_init__(self):
        if self.path not in ("tree", "chain"):
            raise ValueError(f"path must be 'tree' or 'chain', got {self.path!r}")
        if not 1 <= self.max_accept <= self.tree_size:
            raise ValueError(f"need 1 <= max_accept <= tree_size, got {self.max_accept}, {self.tree_size}")


@dataclass
class ChurnStats:
    mode: str
    steps: int = 0
    alloc_seconds: list[float] = field(default_factory=list)  # allocator calls + req_to_token bookkeeping, per step
    allocator_seconds: list[float] = field(default_factory=list)  # allocator calls alone (alloc, free), per step
    relocation_seconds: list[float] = field(default_factory=list)  # host time of relocation rounds
    rounds: list[RelocationRound] = field(default_factory=list)
    step_kv_bytes: list[int] = field(default_factory=list)  # KV bytes each step's attention reads
    finished: int = 0
    integrity: list[dict] = field(default_factory=list)  # check_integrity after each round, if asked

    def runs_per_request(self, pool: KVPool) -> float:
        keys = pool.requests.keys()
        return sum(pool.requests.num_runs(k) for k in keys) / max(1, len(keys))


def make_pool(cfg: ChurnConfig, mode: str) -> KVPool:
    if mode not in MODES:
        raise ValueError(f"unknown churn mode {mode!r}; known: {list(MODES)}")
    if mode.startswith("tier0"):
        allocator = SortedRunAllocator(cfg.num_slots)
    else:
        allocator = UnsortedFreeListAllocator(cfg.num_slots, need_sort=mode == "sglang_sorted")
    return KVPool(cfg.num_layers, cfg.num_slots, dtype=cfg.dtype, device=cfg.device,
                  allocator=allocator, draft_layers=cfg.draft_layers)


class ChurnRun:
    """One run of the workload in one mode; `run()` drives all steps, `step()` one."""

    def __init__(self, cfg: ChurnConfig, mode: str, seed: int, relocator_cls=Relocator,
                 integrity_every: int = 0, trace: bool = False):
        self.cfg, self.mode, self.seed = cfg, mode, seed
        self.pool = make_pool(cfg, mode)
        if trace:
            if mode.startswith("tier0"):
                raise ValueError("trace records SGLang-order allocator calls: use mode 'unsorted'")
            self.pool.allocator.trace = []
        self.pins = PinTable()
        self.relocator = relocator_cls(self.pool, self.pins) if mode == "tier0+1" else None
        self.cache = PrefixCacheModel(self.pool) if cfg.prefix_cache_fraction > 0 else None
        self.stats = ChurnStats(mode)
        self.integrity_every = integrity_every
        self._materialised = torch.device(cfg.device).type != "meta" and cfg.write_rows
        self._rngs: dict[int, random.Random] = {}
        self._target: dict[int, int] = {}  # rid -> new tokens it will generate
        self._prompt: dict[int, int] = {}  # rid -> prompt length
        self._made: dict[int, int] = {}
        self._shadow: dict[tuple[int, object], list[torch.Tensor]] = {}
        self._node_shadow_key: dict[int, tuple[int, object]] = {}
        self._next_rid = 0
        self._arrivals = random.Random(seed)
        self._write_gen = torch.Generator().manual_seed(seed ^ 0x5EED)
        self._t_allocator = self._t_maps = 0.0  # this step's allocator calls, map bookkeeping

    # -- the workload ---------------------------------------------------------------------------
    def run(self) -> ChurnStats:
        for _ in range(self.cfg.steps):
            self.step()
        return self.stats

    def step(self, relocate: bool = True) -> None:
        """One decode step of every live request (arrivals first, finished requests after);
        then, in tier0+1 and unless relocate=False, a relocation round (see `relocate`)."""
        cfg, pool = self.cfg, self.pool
        self._t_allocator = self._t_maps = 0.0
        self._admit()
        live = pool.requests.keys()
        if live:
            self.stats.step_kv_bytes.append(
                sum(pool.seq_len(r) + cfg.tree_size for r in live) * pool.bytes_per_slot)
            self._decode(live)
        self._finish()
        self.stats.allocator_seconds.append(self._t_allocator)
        self.stats.alloc_seconds.append(self._t_allocator + self._t_maps)
        self.stats.steps += 1
        trace = getattr(pool.allocator, "trace", None)
        if trace is not None:
            trace.append(("step",))
        if relocate:
            self.relocate()

    def _admit(self) -> None:
        cfg, pool = self.cfg, self.pool
        while len(pool.requests) < cfg.live_requests:
            rid = self._next_rid
            if rid not in self._rngs:
                rng = self._rngs[rid] = random.Random(self.seed * 1_000_003 + rid)
                self._prompt[rid] = rng.randint(*cfg.prompt_len)
                self._target[rid] = rng.randint(*cfg.new_tokens)
            need = self._prompt[rid] + cfg.tree_size * (len(pool.requests) + 1)
            used = pool.num_slots - pool.num_free
            if used + need > cfg.max_occupancy * pool.num_slots:
                if self.cache is None or not self.cache.num_slots:
                    break
                t0 = time.perf_counter()
                freed = self._evict(need)
                self._t_allocator += time.perf_counter() - t0
                if not freed:
                    break
                continue
            self._next_rid += 1
            t0 = time.perf_counter()
            pool.add_request(rid)
            t1 = time.perf_counter()
            slots = pool.alloc_for(rid, self._prompt[rid])
            t2 = time.perf_counter()
            pool.append(rid, slots)
            t3 = time.perf_counter()
            self._t_allocator += t2 - t1
            self._t_maps += (t1 - t0) + (t3 - t2)
            self._made[rid] = 0
            self._write((0, rid), slots)

    def _decode(self, live: list[int]) -> None:
        cfg, pool = self.cfg, self.pool
        T = cfg.tree_size
        t0 = time.perf_counter()
        trees = pool.alloc_trees(live, [T] * len(live))  # tier0: grown per request; else one alloc, split
        self._t_allocator += time.perf_counter() - t0
        written = {r: self._rows(len(s)) for r, s in zip(live, trees)}  # the model writes every node
        if self._materialised:
            for r, s in zip(live, trees):
                self._store_rows(s, written[r])
        rejected: list[int] = []
        kept_rows = {}
        paths = {r: self._path(r) for r in live}
        t0 = time.perf_counter()
        for r, slots in zip(live, trees):
            path = paths[r]
            keep = set(path)
            pool.append(r, [slots[n] for n in path])
            rejected.extend(s for n, s in enumerate(slots) if n not in keep)
            kept_rows[r] = path
        t1 = time.perf_counter()
        pool.free(rejected)
        t2 = time.perf_counter()
        self._t_maps += t1 - t0
        self._t_allocator += t2 - t1
        if self._materialised:
            for r in live:
                self._shadow[(0, r)].append(torch.cat(written[r], dim=1)[kept_rows[r]])
        for r in live:
            self._made[r] += len(paths[r])

    def _finish(self) -> None:
        pool = self.pool
        for r in pool.requests.keys():
            if self._made[r] < self._target[r]:
                continue
            rng = self._rngs[r]
            donate = self.cache is not None and rng.random() < self.cfg.prefix_cache_fraction
            t0 = time.perf_counter()
            if donate:
                node = self.cache.insert(r, [r] * pool.seq_len(r))  # token ids do not matter here
                self._t_maps += time.perf_counter() - t0
                self._shadow[(1, node)] = self._shadow.pop((0, r))
            else:
                pool.release(r)
                self._t_allocator += time.perf_counter() - t0
                self._shadow.pop((0, r), None)
            del self._made[r]
            self.stats.finished += 1

    def _evict(self, need: int) -> int:
        before = set(self.cache.nodes.keys())
        freed = self.cache.evict(need)
        for node in before.difference(self.cache.nodes.keys()):
            self._shadow.pop((1, node), None)
        return freed

    def relocate(self) -> None:
        """The relocation round after a step (nothing unless the mode is tier0+1)."""
        if self.relocator is None:
            return
        cfg, pool = self.cfg, self.pool
        step_bytes = self.stats.step_kv_bytes[-1] if self.stats.step_kv_bytes else 0
        budget = int(cfg.copy_budget_fraction * step_bytes / 2)  # a copy reads and writes each byte
        epochs, pinned = [], {}
        if cfg.pin_fraction > 0:
            rng = random.Random(self.seed + 7919 * self.stats.steps)  # drawn per step, not per mode
            for r in pool.requests.keys():
                if rng.random() < cfg.pin_fraction:
                    epochs.append(self.pins.pin(pool.requests.slots(r)))
                    pinned[r] = list(pool.requests.slots(r))
        rows_before = gather_rows(pool, [s for v in pinned.values() for s in v]) \
            if self._materialised and pinned else None
        t0 = time.perf_counter()
        report = self.relocator.step(budget)
        self.stats.relocation_seconds.append(time.perf_counter() - t0)
        self.stats.rounds.append(report)
        if self.integrity_every and self.stats.steps % self.integrity_every == 0:
            check = check_integrity(self)
            moved = sum(1 for r, slots in pinned.items()
                        for a, b in zip(slots, pool.requests.slots(r)) if a != b)
            if rows_before is not None:
                after = gather_rows(pool, [s for v in pinned.values() for s in v])
                moved += int((after != rows_before).any(dim=1).sum())
            check["pinned_slots_touched"] = moved
            self.stats.integrity.append(check)
        for e in epochs:
            self.pins.retire(e)

    # -- KV content -----------------------------------------------------------------------------
    def _path(self, rid: int) -> list[int]:
        cfg, rng = self.cfg, self._rngs[rid]
        a = rng.randint(1, cfg.max_accept)
        if cfg.path == "chain":
            return list(range(a))
        return [0] + sorted(rng.sample(range(1, cfg.tree_size), a - 1))

    def _rows(self, n: int) -> list[torch.Tensor]:
        if not self._materialised:
            return []
        return [torch.randn(n, t.shape[1], generator=self._write_gen).to(t.dtype) for t in self.pool.kv_stores()]

    def _store_rows(self, slots: list[int], rows: list[torch.Tensor]) -> None:
        idx = torch.tensor(slots, dtype=torch.long, device=self.pool.kv[0].device)
        for store, r in zip(self.pool.kv_stores(), rows):
            store[idx] = r.to(store.device)

    def _write(self, key, slots: list[int]) -> None:
        if not self._materialised:
            return
        rows = self._rows(len(slots))
        self._store_rows(slots, rows)
        self._shadow[key] = [torch.cat([r for r in rows], dim=1)]


def gather_rows(pool: KVPool, slots: list[int]) -> torch.Tensor:
    """[len(slots), total width] of every store's rows at these slots, on the host."""
    idx = torch.tensor(slots, dtype=torch.long, device=pool.kv[0].device)
    return torch.cat([s.index_select(0, idx).cpu() for s in pool.kv_stores()], dim=1)


def check_integrity(run: ChurnRun) -> dict:
    """Every live sequence's KV read through the maps vs the shadow written with it.

    Returns bytes that differ, tokens whose slot the allocator holds free or that two sequences
    share ("lost"), and the number of sequences checked.
    """
    pool = run.pool
    changed = lost = checked = 0
    seen: set[int] = set()
    width_bytes = pool.bytes_per_slot
    for set_index, seqs in enumerate(pool.sequence_sets()):
        for key, slots in seqs.items():
            want = _shadow_rows(run._shadow.get((set_index, key), []), pool)
            lost += sum(1 for s in slots if not pool.allocator.is_allocated(s) or s in seen)
            seen.update(slots)
            got = gather_rows(pool, slots) if slots else want[:0]
            if got.shape != want.shape:
                lost += abs(got.shape[0] - want.shape[0])
                n = min(got.shape[0], want.shape[0])
                got, want = got[:n], want[:n]
            if not torch.equal(got.view(torch.uint8), want.view(torch.uint8)):
                changed += int((got.view(torch.uint8) != want.view(torch.uint8)).sum())
            checked += 1
    return {"kv_bytes_changed": changed, "kv_slots_lost": lost, "sequences_checked": checked,
            "row_bytes": width_bytes}


def _shadow_rows(chunks: list, pool: KVPool) -> torch.Tensor:
    if not chunks:
        return torch.empty(0, sum(t.shape[1] for t in pool.kv_stores()), dtype=pool.kv[0].dtype)
    if len(chunks) > 1:
        chunks[:] = [torch.cat(chunks)]  # later checks reuse the concatenation
    return chunks[0]



def replay_on_sglang_model(trace: list, num_slots: int, device: str = "cpu") -> list[float]:
    """Seconds per step of SGLang's allocator (`SGLangTokenAllocatorModel`, tensors on `device`)
    replaying an ``unsorted`` run's allocator calls; the same scheme hands out the same slot ids.

    Freed ids are made device tensors before the clock starts (SGLang frees tensors it holds);
    each step ends with a device synchronise, so device work is counted.
    """
    from kdtree.bench.sglang_allocator_model import SGLangTokenAllocatorModel  # noqa: PLC0415

    dev = torch.device(device)
    ops = [(op[0], torch.tensor(op[1], dtype=torch.int64, device=dev)) if op[0] == "f" else op for op in trace]
    model = SGLangTokenAllocatorModel(num_slots, dev)
    per_step, t = [], 0.0
    for op in ops:
        if op[0] == "step":
            if dev.type == "cuda":
                t0 = time.perf_counter()
                torch.cuda.synchronize(dev)
                t += time.perf_counter() - t0
            per_step.append(t)
            t = 0.0
            continue
        t0 = time.perf_counter()
        if op[0] == "a":
            if model.alloc(op[1]) is None:
                raise AssertionError(f"the SGLang model ran out of slots replaying alloc({op[1]})")
        else:
            model.free(op[1])
        t += time.perf_counter() - t0
    return per_step
