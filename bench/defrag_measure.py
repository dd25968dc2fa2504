"""What contiguity buys, measured: request layouts after churn, offload / hand-off copies, run metadata.

- `churn_layouts`: the same churn workload in several allocator modes; the live requests (same
  ids, same lengths in every mode) and their slot lists at the end.
- `copy_out_and_back`: one request's KV (every store) copied out of the pool into a host buffer
  and back into its slots, by a gather (index_select into a staging buffer, one copy) or by one
  copy per run; wall time to completion (the device is synchronised), the median of `repeats`.
- `pd_handoff`: the hand-off as SGLang's prefill-decode disaggregation issues it: the (source
  slot, destination slot) pairs grouped where both sides are contiguous (`pairwise_runs`, after
  ``group_concurrent_contiguous`` in sglang/srt/disaggregation/common/utils.py, used per layer by
  the Mooncake connector, mooncake/conn.py ``_send_kvcache_generic``), one transfer per group and
  layer, one way (prefill to decode); here a copy into a pinned host buffer stands for the transfer.
- `gather_staging_bytes` and `main_stream_slowdown`: what a gather costs that per-run copies do
  not: a staging buffer, and SM / HBM time taken from a verify kernel running on the main stream
  while the copy runs on a side stream.
- `expand_seconds`: the runs -> kv_indices expansion a run-length metadata path would add to a
  verify step, timed on the device the runs live on.
- `releasable_tail`: the free run at the top of the pool, which a VMM-backed pool could unmap.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch

from kdtree.bench.churn import ChurnConfig, ChurnRun
from kdtree.engine.kv.run_metadata import expand_runs, runs_of


def churn_layouts(cfg: ChurnConfig, seed: int, modes: Sequence[str],
                  trace_unsorted: bool = False) -> dict[str, ChurnRun]:
    """One finished ChurnRun per mode, same seed (so the same requests are live in each)."""
    runs = {}
    for mode in modes:
        run = ChurnRun(cfg, mode, seed, trace=trace_unsorted and mode == "unsorted")
        run.run()
        runs[mode] = run
    lives = [sorted(r.pool.requests.keys()) for r in runs.values()]
    if any(live != lives[0] for live in lives):
        raise AssertionError("churn modes ended with different live requests; the workload is not "
                             "independent of the allocator")
    return runs


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], None], device: torch.device, repeats: int, warmup: int = 2) -> float:
    """Median wall seconds of fn() to completion (the device synchronised after each), after warmup."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def host_buffer(rows: int, width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host buffer for offload: pinned when the pool is on a GPU."""
    return torch.empty(rows, width, dtype=dtype, pin_memory=device.type == "cuda")


def copy_out_and_back(stores: Sequence[torch.Tensor], slots: list[int], method: str,
                      repeats: int = 10) -> float:
    """Seconds to copy one request's rows (every store) to the host and back, median of repeats."""
    device = stores[0].device
    n, width = len(slots), stores[0].shape[1]
    hosts = [host_buffer(n, width, s.dtype, device) for s in stores]
    if method == "gather":
        idx = torch.tensor(slots, dtype=torch.long, device=device)
        staging = torch.empty(n, width, dtype=stores[0].dtype, device=device)

        def go() -> None:
            for store, host in zip(stores, hosts):
                torch.index_select(store, 0, idx, out=staging)
                host.copy_(staging, non_blocking=True)
                staging.copy_(host, non_blocking=True)
                store.index_copy_(0, idx, staging)
    elif method == "runs":
        runs = runs_of(slots)

        def go() -> None:
            for store, host in zip(stores, hosts):
                pos = 0
                for start, length in runs:
                    host[pos:pos + length].copy_(store[start:start + length], non_blocking=True)
                    pos += length
                pos = 0
                for start, length in runs:
                    store[start:start + length].copy_(host[pos:pos + length], non_blocking=True)
                    pos += length
    else:
        raise ValueError(f"method must be 'gather' or 'runs', got {method!r}")
    return median_seconds(go, device, repeats)


def pairwise_runs(src: Sequence[int], dst: Sequence[int]) -> list[tuple[int, int, int]]:
    """(src start, dst start, length) of the groups of pairs where src and dst both advance by one:
    the transfers SGLang's PD connector issues per layer for these token slots."""
    if len(src) != len(dst):
        raise ValueError(f"pairwise_runs: {len(src)} sources but {len(dst)} destinations")
    groups: list[tuple[int, int, int]] = []
    for i, (s, d) in enumerate(zip(src, dst)):
        if i and s == src[i - 1] + 1 and d == dst[i - 1] + 1:
            a, b, n = groups[-1]
            groups[-1] = (a, b, n + 1)
        else:
            groups.append((int(s), int(d), 1))
    return groups


def pd_handoff(stores: Sequence[torch.Tensor], slots: list[int], repeats: int = 10) -> tuple[float, int]:
    """(seconds, transfers per layer) of handing one request's KV off, every store, SGLang's way:
    one copy per (source, destination) group, the destination a contiguous region of the receiver
    (a freshly allocated run on the decode side; a pinned host buffer here)."""
    groups = pairwise_runs(slots, range(len(slots)))
    return median_seconds(runs_out(stores, slots), stores[0].device, repeats), len(groups)


def gather_staging_bytes(tokens: int, row_bytes: int, layers: int) -> dict[str, int]:
    """Device memory a gather needs that per-run copies do not: one layer's rows at a time, or the
    whole request's (every layer) when it is gathered before it is sent."""
    return {"per_layer": tokens * row_bytes, "all_layers": tokens * row_bytes * layers}


def main_stream_slowdown(main_fn: Callable[[], None], copy_fn: Callable[[], None], device: torch.device,
                         lead_cycles: Callable[[float], int], repeats: int = 5) -> dict[str, float]:
    """How much a copy on a side stream slows kernels on the main stream (CUDA only).

    The main stream runs `main_fn` back to back for about as long as one `copy_fn` takes; timed
    by CUDA events on the main stream alone, then with `copy_fn` enqueued on a side stream that
    starts with it. Both are enqueued behind a GPU busy-wait longer than their host enqueue time
    (`lead_cycles(seconds)` sizes it), so the span measures GPU time, not the host launching the
    copies. Returns the medians (ms) and their ratio (``slowdown``, 1.0 = no interference).
    """
    if device.type != "cuda":
        raise ValueError("main_stream_slowdown needs a CUDA device (streams and events)")
    main = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    copy_s = median_seconds(copy_fn, device, 3)
    one = median_seconds(main_fn, device, 5)
    count = max(4, int(copy_s / max(one, 1e-6)) + 2)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    copy_fn()
    for _ in range(count):
        main_fn()
    enqueue_s = time.perf_counter() - t0  # host time to enqueue one timed span (an upper bound)
    torch.cuda.synchronize(device)
    cycles = lead_cycles(2 * enqueue_s + 1e-3)

    def timed(with_copy: bool) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        torch.cuda._sleep(cycles)  # the GPU waits while the host enqueues what follows
        start.record(main)
        if with_copy:
            side.wait_event(start)
            with torch.cuda.stream(side):
                copy_fn()
        for _ in range(count):
            main_fn()
        end.record(main)
        torch.cuda.synchronize(device)
        return start.elapsed_time(end)

    timed(True)  # warm
    alone = statistics.median(timed(False) for _ in range(repeats))
    shared = statistics.median(timed(True) for _ in range(repeats))
    return {"main_ms_alone": alone, "main_ms_with_copy": shared, "slowdown": shared / alone,
            "copy_ms_alone": copy_s * 1e3, "main_calls": float(count)}


def gather_out(stores: Sequence[torch.Tensor], slots: list[int]) -> Callable[[], None]:
    """A callable that gathers one request's rows (every store) into a staging buffer and copies it
    to a pinned host buffer: the gather hand-off, one way."""
    device = stores[0].device
    idx = torch.tensor(slots, dtype=torch.long, device=device)
    staging = torch.empty(len(slots), stores[0].shape[1], dtype=stores[0].dtype, device=device)
    hosts = [host_buffer(len(slots), s.shape[1], s.dtype, device) for s in stores]

    def go() -> None:
        for store, host in zip(stores, hosts):
            torch.index_select(store, 0, idx, out=staging)
            host.copy_(staging, non_blocking=True)
    return go


def runs_out(stores: Sequence[torch.Tensor], slots: list[int]) -> Callable[[], None]:
    """A callable that copies one request's rows (every store) to a pinned host buffer, one copy per
    run (the PD hand-off's transfers)."""
    device = stores[0].device
    groups = pairwise_runs(slots, range(len(slots)))
    hosts = [host_buffer(len(slots), s.shape[1], s.dtype, device) for s in stores]

    def go() -> None:
        for store, host in zip(stores, hosts):
            for src, dst, n in groups:
                host[dst:dst + n].copy_(store[src:src + n], non_blocking=True)
    return go


def request_runs_tensors(slot_lists: Sequence[list[int]], device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(run starts, run lengths, total tokens) of a batch, flattened in request order, on device."""
    runs = [r for slots in slot_lists for r in runs_of(slots)]
    starts = torch.tensor([s for s, _ in runs], dtype=torch.int32, device=device)
    lens = torch.tensor([n for _, n in runs], dtype=torch.int32, device=device)
    return starts, lens, sum(len(s) for s in slot_lists)


def upload_seconds(slot_lists: Sequence[list[int]], device, repeats: int = 50) -> float:
    """Median seconds to upload a batch's whole kv_indices (int32, from pinned host memory) to
    `device`: what run-length metadata would save per step if the indices were sent every step."""
    device = torch.device(device)
    host = torch.tensor([s for slots in slot_lists for s in slots], dtype=torch.int32)
    if device.type == "cuda":
        host = host.pin_memory()
    return median_seconds(lambda: host.to(device, non_blocking=True), device, repeats)


def expand_seconds(starts: torch.Tensor, lens: torch.Tensor, total: int, repeats: int = 50) -> float:
    """Median seconds of one runs -> kv_indices expansion (to completion)."""
    return median_seconds(lambda: expand_runs(starts, lens, total), starts.device, repeats)


def releasable_tail(run: ChurnRun) -> int:
    """Slots in the free run that ends at the top of the pool (0 if the last slot is in use)."""
    alloc = run.pool.allocator
    return alloc.num_slots - 1 - alloc.highest_allocated()


H200_HBM_BYTES_PER_S = 4.3e12  # an H200's copy bandwidth (phase 1's roofline, rounded): the verify step's HBM floor


def verify_step_hbm_bytes(cfg, batch: int, context: int, tree_nodes: int) -> dict[str, int]:
    """HBM bytes one verify step of `cfg` (a `kdtree.engine.model.config.ModelConfig`) must read at least:
    every layer's KV for every request's context and tree (576 bf16 per token), and every layer's
    weights (bf16) plus the LM head, each once. A floor: activations and the kernel's re-reads are
    left out."""
    h, heads = cfg.hidden_size, cfg.num_heads
    q = h * (cfg.q_lora_rank or 0) + (cfg.q_lora_rank or h) * heads * cfg.qk_head_dim
    kv_a = h * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    kv_b = cfg.kv_lora_rank * heads * (cfg.qk_nope_head_dim + cfg.v_head_dim)
    o = heads * cfg.v_head_dim * h
    mlp = 3 * h * cfg.intermediate_size
    weights = 2 * (cfg.num_layers * (q + kv_a + kv_b + o + mlp) + cfg.vocab_size * h)
    kv = cfg.num_layers * batch * (context + tree_nodes) * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 2
    return {"kv_bytes": kv, "weight_bytes": weights, "total_bytes": kv + weights}
