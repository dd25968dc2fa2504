"""CUDA-graph safety gate: a captured callable replays like the eager call on fresh inputs.

Protocol (the same as the accuracy gate's candidate):

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
torch's own capture of an empty body allocates), then for
``spec.replays`` fresh inputs: copy them into the static buffers, poison the static outputs,
replay (counting allocations made by the replay: the counters must not move), and compare with
an eager call on the same inputs into fresh poisoned buffers. With ``spec.min_replay_speedup``
set, replay and eager are then timed interleaved.

A case with ``allow_capture_allocations`` (a whole model step, whose intermediates come from the
graph's private pool at capture) has its capture allocations reported as
``pool_allocations_in_capture`` instead of being held to zero; replay allocations are always held.

`summarize` turns per-case reports into the result and needs no GPU.
"""

from __future__ import annotations

import math
import statistics
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from kdtree.gates.base import Figure, GateContext, GateResult, Outcome, verdict
from kdtree.gates.spec import GraphSafetyGateSpec
from kdtree.gates.tensors import compare, poison_, poisoned_mask
from kdtree.gates.timing import Spread, Timer, cuda_event_timer, interleaved, timer_label


@dataclass(frozen=True)
class GraphCase:
    """A named generator of inputs (static shapes) and their output buffers."""

    name: str
    make_inputs: Callable[[int, str], dict[str, Any]]
    make_outputs: Callable[[dict[str, Any]], dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)
    allow_capture_allocations: bool = False  # intermediates from the graph's pool (a model step)
    neg_inf_ok: tuple[str, ...] = ()  # outputs where -inf is a defined value (the lse of an empty row)


@dataclass
class CaseReport:
    """What happened to one case; `summarize` turns a list of them into a GateResult."""

    name: str
    capture_error: Optional[str] = None
    host_sync: bool = False
    allocations: int = 0
    torch_allocations: int = 0  # what torch's capture machinery itself allocated (not counted)
    pool_allocations: int = 0  # capture allocations of a case that may allocate from the graph pool
    replay_allocations: int = 0  # allocations made by graph.replay() calls, over all replays
    replays: int = 0
    worst_rel_l2: float = 0.0
    problems: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    replay_s: Optional[Spread] = None
    eager_s: Optional[Spread] = None

    @property
    def speedup(self) -> Optional[float]:
        if self.replay_s is None or self.eager_s is None or self.replay_s.median <= 0:
            return None
        return self.eager_s.median / self.replay_s.median

    def as_row(self) -> dict[str, Any]:
        return {"case": self.name, "capture_error": self.capture_error, "host_sync": self.host_sync,
                "allocations_in_capture": self.allocations, "torch_capture_allocations": self.torch_allocations,
                "pool_allocations_in_capture": self.pool_allocations,
                "allocations_in_replay": self.replay_allocations, "replays": self.replays,
                "worst_rel_l2": None if math.isnan(self.worst_rel_l2) or math.isinf(self.worst_rel_l2)
                else self.worst_rel_l2,
                "problems": self.problems[:10], "seeds": self.seeds,
                "replay": self.replay_s.ms() if self.replay_s else None,
                "eager": self.eager_s.ms() if self.eager_s else None, "speedup": self.speedup}


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


def _run_case(spec: GraphSafetyGateSpec, case: GraphCase, fn, ctx: GateContext, timer: Optional[Timer]) -> CaseReport:
    report = CaseReport(name=case.name)
    seed = ctx.fresh_seed()
    report.seeds.append(seed)
    static_in = case.make_inputs(seed, ctx.device)
    static_out = dict(case.make_outputs(static_in))
    graph, error, report.allocations, report.torch_allocations = _capture(fn, static_in, static_out,
                                                                          spec.warmup)
    if case.allow_capture_allocations:
        report.pool_allocations, report.allocations = report.allocations, 0
    if error is not None:
        report.capture_error = error
        report.host_sync = looks_like_sync(error)
        report.worst_rel_l2 = math.nan
        return report
    for _ in range(spec.replays):
        seed = ctx.fresh_seed()
        report.seeds.append(seed)
        err, problems, allocated = _replay_once(case, fn, graph, static_in, static_out, seed, ctx.device)
        report.replay_allocations += allocated
        report.replays += 1
        report.problems.extend(f"seed {seed}: {p}" for p in problems)
        report.worst_rel_l2 = err if math.isnan(err) or math.isnan(report.worst_rel_l2) else max(report.worst_rel_l2, err)
    if spec.min_replay_speedup is not None:
        t = timer or cuda_event_timer()
        tr, te = interleaved(lambda i: graph.replay(), lambda i: fn(static_in, static_out),
                             warmup=spec.warmup, repeats=spec.repeats, timer=t)
        report.replay_s, report.eager_s = Spread.of(tr), Spread.of(te)
    return report


def summarize(spec: GraphSafetyGateSpec, reports: list[CaseReport], **details: Any) -> GateResult:
    """The gate's result from per-case reports (no GPU needed).

    Figures: ``worst_rel_l2`` (key, replay vs eager, ``<= spec.max_rel_l2``), ``capture_failures``,
    ``allocations_in_capture`` and ``allocations_in_replay`` (all must be 0),
    ``pool_allocations_in_capture`` (cases allowed to allocate from the graph pool; recorded),
    ``replays_compared`` (every case's replays),
    and with ``spec.min_replay_speedup`` the median ``replay_speedup`` over cases.
    """
    if not reports:
        return GateResult(gate=spec.name, kind=spec.kind, outcome=Outcome.ERROR,
                          summary="no graph cases were given: measured nothing")
    rels = [r.worst_rel_l2 for r in reports]
    worst = math.nan if any(math.isnan(x) for x in rels) else max(rels)
    failures = [r for r in reports if r.capture_error]
    figures = [
        Figure(name="worst_rel_l2", value=worst, op="<=", threshold=spec.max_rel_l2, key=True),
        Figure(name="capture_failures", value=len(failures), op="<=", threshold=0),
        Figure(name="host_syncs_in_capture", value=sum(r.host_sync for r in reports)),
        Figure(name="allocations_in_capture", value=sum(r.allocations for r in reports), op="<=", threshold=0),
        Figure(name="allocations_in_replay", value=sum(r.replay_allocations for r in reports), op="<=", threshold=0),
        Figure(name="pool_allocations_in_capture", value=sum(r.pool_allocations for r in reports)),
        Figure(name="replays_compared", value=sum(r.replays for r in reports), op=">=",
               threshold=spec.replays * len(reports)),
    ]
    if spec.min_replay_speedup is not None:
        speedups = [r.speedup for r in reports if r.speedup is not None]
        figures.append(Figure(name="replay_speedup", value=statistics.median(speedups) if speedups else math.nan,
                              unit="x", op=">=", threshold=spec.min_replay_speedup))
    messages = []
    for r in reports:
        if r.capture_error:
            what = "host sync during capture" if r.host_sync else "capture failed"
            messages.append(f"{r.name}: {what}: {r.capture_error[:300]}")
        if r.allocations:
            messages.append(f"{r.name}: {r.allocations} allocations during capture")
        if r.replay_allocations:
            messages.append(f"{r.name}: {r.replay_allocations} allocations during {r.replays} replays")
        messages.extend(f"{r.name}: {p}" for p in r.problems[:2])
    result = verdict(spec.name, spec.kind, figures, "; ".join(messages[:4]),
                     cases=[r.as_row() for r in reports], **details)
    if messages and result.outcome is Outcome.PASSED:
        result.outcome = Outcome.FAILED
    return result


def check_graph_safety_pairs(spec: GraphSafetyGateSpec, pairs: Iterable[tuple[GraphCase, Callable]],
                             ctx: GateContext, *, timer: Optional[Timer] = None, **details: Any) -> GateResult:
    """`check_graph_safety` for cases that each bring their own callable: ``(case, fn)`` pairs."""
    pairs = list(pairs)
    reports = []
    for i, (case, fn) in enumerate(pairs):
        ctx.progress(f"graph {case.name}", i / max(len(pairs), 1))
        reports.append(_run_case(spec, case, fn, ctx, timer))
    label = timer_label(timer) if timer else "cuda_event"
    return summarize(spec, reports, timer=label, replays_per_case=spec.replays, **details)


def check_graph_safety(spec: GraphSafetyGateSpec, cases: Iterable[GraphCase],
                       fn: Callable[[dict[str, Any], dict[str, Any]], None], ctx: GateContext, *,
                       timer: Optional[Timer] = None) -> GateResult:
    """Capture, replay and compare every case (see the module docstring). Needs CUDA."""
    return check_graph_safety_pairs(spec, [(case, fn) for case in cases], ctx, timer=timer)
