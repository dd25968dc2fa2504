"""CUDA-graph capture and replay of a callable, measured against its eager calls: what the graph
safety gate (`kdtree.gates.graph_safety`) judges.

- a case is a `GraphCase`: ``make_inputs(seed, device) -> dict`` draws inputs (the first draw
  becomes the static input buffers; every later draw must have the same shapes and dtypes and is
  copied into them; non-tensor values must not change between draws, a graph cannot see them),
  ``make_outputs(inputs) -> dict[str, Tensor]`` allocates output buffers;
- ``fn(inputs, outputs) -> None`` reads the input buffers and writes the output buffers in place.

Per case: warm up on a side stream, capture ``fn`` into a ``torch.cuda.CUDAGraph`` with
``torch.cuda.set_sync_debug_mode("error")`` on (a host sync in capture raises, and any exception
in capture is a capture failure; the mode is a prototype in torch and does not see every sync,
but a sync it misses still breaks the capture), count caching-allocator allocations made during
capture (``allocation.all.allocated`` in ``torch.cuda.memory_stats``, before vs after, less what
torch's own capture of an empty body allocates), then for ``replays`` fresh inputs: copy them
into the static buffers, poison the static outputs, replay (counting allocations made by the
replay), and compare with an eager call on the same inputs into fresh poisoned buffers. When
timed, replay and eager are then timed interleaved (`kdtree.bench.timing.round_robin`).

A case with ``allow_capture_allocations`` (a whole model step, whose intermediates come from the
graph's private pool at capture) has its capture allocations reported apart. The result of each
case is a `kdtree.gates.graph_safety.CaseReport`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from kdtree.bench.timing import QueuedTimer, Timer, round_robin, timer_label
from kdtree.gates.base import GateContext
from kdtree.gates.graph_safety import CaseReport
from kdtree.gates.stats import Spread
from kdtree.gates.tensors import compare, poison_, poisoned_mask


@dataclass(frozen=True)
class GraphCase:
    """A named generator of inputs (static shapes) and their output buffers."""

    name: str
    make_inputs: Callable[[int, str], dict[str, Any]]
    make_outputs: Callable[[dict[str, Any]], dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)
    allow_capture_allocations: bool = False  # intermediates from the graph's pool (a model step)
    neg_inf_ok: tuple[str, ...] = ()  # outputs where -inf is a defined value (the lse of an empty row)


def looks_like_sync(message: str) -> bool:
    """Whether a capture exception says a host synchronisation was attempted."""
    m = message.lower()
    return ("synchroniz" in m or "not permitted when stream is capturing" in m
            or ("capture" in m and "invalid" in m))


def copy_into_static(static: dict[str, Any], fresh: dict[str, Any]) -> None:
    """Copy every tensor of ``fresh`` into the same-named static buffer; anything else must be equal."""
    import torch  # noqa: PLC0415

    if set(static) != set(fresh):
        raise ValueError(f"inputs changed keys between draws: {sorted(static)} vs {sorted(fresh)}")
    for key, buf in static.items():
        new = fresh[key]
        if isinstance(buf, torch.Tensor):
            if not isinstance(new, torch.Tensor) or new.shape != buf.shape or new.dtype != buf.dtype:
                raise ValueError(f"input {key!r} must keep shape {tuple(buf.shape)} and dtype {buf.dtype} "
                                 f"between draws to be replayed")
            buf.copy_(new)
        elif new != buf:
            raise ValueError(f"non-tensor input {key!r} changed between draws ({buf!r} -> {new!r}); "
                             f"a captured graph cannot see it")


def _alloc_count() -> int:
    import torch  # noqa: PLC0415

    return int(torch.cuda.memory_stats().get("allocation.all.allocated", 0))


def _set_sync_debug_mode(mode) -> None:
    import torch  # noqa: PLC0415

    with warnings.catch_warnings():  # "a prototype feature": we know, and say so in the docs
        warnings.simplefilter("ignore", UserWarning)
        torch.cuda.set_sync_debug_mode(mode)


def _captured_allocations(stream, body) -> tuple[Optional[object], Optional[str], int]:
    """Capture ``body()`` on ``stream``: (graph or None, error message or None, allocations)."""
    import torch  # noqa: PLC0415

    graph = torch.cuda.CUDAGraph()
    before = _alloc_count()
    error: Optional[str] = None
    previous = torch.cuda.get_sync_debug_mode()
    with torch.cuda.stream(stream):
        graph.capture_begin()
        try:
            _set_sync_debug_mode("error")
            body()
        except Exception as exc:  # noqa: BLE001 - anything raised in capture is the candidate's failure
            error = f"{type(exc).__name__}: {exc}"
        finally:
            _set_sync_debug_mode(previous)
            try:
                graph.capture_end()
            except Exception as exc:  # noqa: BLE001
                error = error or f"{type(exc).__name__}: {exc}"
    allocations = _alloc_count() - before
    torch.cuda.synchronize()
    return (None if error else graph), error, allocations


def _capture(fn, static_in, static_out, warmup: int):
    """(graph or None, error message or None, allocations ``fn`` made during capture, torch's own).

    torch's capture machinery allocates by itself (a few allocations per capture, likely the RNG's
    per-graph seed and offset), so a capture of an allocation-free body is made just before and its
    count is subtracted.
    """
    import torch  # noqa: PLC0415

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 1)):
            fn(static_in, static_out)
        scratch = torch.zeros(1, device="cuda")
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    _, _, own = _captured_allocations(side, scratch.zero_)
    graph, error, allocations = _captured_allocations(side, lambda: fn(static_in, static_out))
    return graph, error, max(allocations - own, 0), own


def _replay_once(case: GraphCase, fn, graph, static_in, static_out, seed: int,
                 device: str) -> tuple[float, list[str], int]:
    fresh = case.make_inputs(seed, device)
    copy_into_static(static_in, fresh)
    static_poison = {key: poison_(buf) for key, buf in static_out.items()}
    before = _alloc_count()
    graph.replay()
    replay_allocations = _alloc_count() - before
    eager = dict(case.make_outputs(fresh))
    eager_poison = {key: poison_(buf) for key, buf in eager.items()}
    fn(fresh, eager)
    problems: list[str] = []
    worst = 0.0
    import torch  # noqa: PLC0415

    for key, ref in eager.items():
        if key not in static_out:
            raise ValueError(f"make_outputs gave {key!r} for a fresh draw but not for the static one")
        unwritten = int(poisoned_mask(ref, eager_poison[key]).sum())
        r64 = ref.to(torch.float64)
        defined = torch.isfinite(r64) | ((r64 == -math.inf) if key in case.neg_inf_ok else False)
        if unwritten or not bool(defined.all()):
            allowed = " (-inf allowed)" if key in case.neg_inf_ok else ""
            problems.append(f"{key}: the eager call itself left {unwritten} elements unwritten or wrote "
                            f"NaN/Inf{allowed}")
            worst = math.nan
            continue
        cmp = compare(key, static_out[key], ref, poison=static_poison[key])
        problems.extend(f"replay {p}" for p in cmp.problems)
        worst = cmp.rel_l2 if math.isnan(cmp.rel_l2) or math.isnan(worst) else max(worst, cmp.rel_l2)
    return worst, problems, replay_allocations


def measure_graph_case(case: GraphCase, fn, ctx: GateContext, *, replays: int, warmup: int, repeats: int,
                       timed: bool, timer: Optional[Timer] = None) -> CaseReport:
    """Capture, replay and compare one case (module docstring); with ``timed``, replay and eager
    timed interleaved (``timer``, default a `QueuedTimer` without flush or lead: launch cost
    counts)."""
    report = CaseReport(name=case.name)
    seed = ctx.fresh_seed()
    report.seeds.append(seed)
    static_in = case.make_inputs(seed, ctx.device)
    static_out = dict(case.make_outputs(static_in))
    graph, error, report.allocations, report.torch_allocations = _capture(fn, static_in, static_out,
                                                                          warmup)
    if case.allow_capture_allocations:
        report.pool_allocations, report.allocations = report.allocations, 0
    if error is not None:
        report.capture_error = error
        report.host_sync = looks_like_sync(error)
        report.worst_rel_l2 = math.nan
        return report
    for _ in range(replays):
        seed = ctx.fresh_seed()
        report.seeds.append(seed)
        err, problems, allocated = _replay_once(case, fn, graph, static_in, static_out, seed, ctx.device)
        report.replay_allocations += allocated
        report.replays += 1
        report.problems.extend(f"seed {seed}: {p}" for p in problems)
        report.worst_rel_l2 = err if math.isnan(err) or math.isnan(report.worst_rel_l2) else max(report.worst_rel_l2, err)
    if timed:
        t = timer or QueuedTimer()
        tr, te = round_robin([lambda i: graph.replay(), lambda i: fn(static_in, static_out)],
                             warmup=warmup, repeats=repeats, timer=t)
        report.replay_s, report.eager_s = Spread.of(tr), Spread.of(te)
    return report


def graph_protocol(spec: Any) -> dict[str, Any]:
    """`measure_graph_cases`' protocol from a `kdtree.gates.spec.GraphSafetyGateSpec`."""
    return {"replays": spec.replays, "warmup": spec.warmup, "repeats": spec.repeats,
            "timed": spec.min_replay_speedup is not None}


def measure_graph_cases(pairs: Iterable[tuple[GraphCase, Callable]], ctx: GateContext, *, replays: int,
                        warmup: int, repeats: int, timed: bool,
                        timer: Optional[Timer] = None) -> tuple[list[CaseReport], dict[str, Any]]:
    """`measure_graph_case` for ``(case, fn)`` pairs: the reports, and the details the gate
    records beside them (the timer's label, the replays per case)."""
    pairs = list(pairs)
    reports = []
    for i, (case, fn) in enumerate(pairs):
        ctx.progress(f"graph {case.name}", i / max(len(pairs), 1))
        reports.append(measure_graph_case(case, fn, ctx, replays=replays, warmup=warmup, repeats=repeats,
                                          timed=timed, timer=timer))
    return reports, {"timer": timer_label(timer) if timer else "cuda_event", "replays_per_case": replays}
