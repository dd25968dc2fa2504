"""The decode benchmark: end-to-end tree-speculative decoding, tokens/s per backend and mode.

For each context length: B prompts of that length are prefilled once (on the first arm's
backend), then every arm (`kdtree.bench.decode_backends.Arm`: kernel, Triton as SGLang serves it,
the sm_120 path; each with CUDA graphs and eager) decodes the same requests from that same state
(the pool is cut back to the prompt between runs, so every run starts from the same KV and the
same first token). One untimed run per arm first captures every graph bucket the timed runs
meet (the same start state gives the same trajectory). Then `rounds` rounds, each running every
arm once, in an order rotated by one per round (interleaved: drift of clocks or temperature
falls on every arm alike). The record keeps every round.

Per arm and context it also records a step breakdown (`step_breakdown`): GPU time of attention,
of the rest of the verify step, of drafting, of the conversion of metadata, and the host time
not hidden behind the GPU (the step's wall time minus its GPU time). GPU times are measured per
piece with CUDA events, each call queued behind a GPU busy-wait longer than its host enqueue
time, so they are GPU busy times as a graph replay would see them.

`run_decode(DecodeConfig(...))` returns the record (a JSON-able dict); `kdtree.bench.decode_report`
turns it into the table and the plot; ``python -m kdtree.tools.decode`` is the command, and
phase 2's decode gate calls the same function.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from kdtree.bench.decode_backends import BACKENDS, MODES, Arm, make_runner
from kdtree.bench.decode_stats import speedup, summarize
from kdtree.bench.timing import make_timer
from kdtree.engine.api import decode_loop
from kdtree.engine.decode.drafters import SelfDraftDrafter, get_drafter
from kdtree.engine.kv.kv_pool import KVPool
from kdtree.engine.decode.speculative import Request, Runner

BASELINE = "triton"
BREAKDOWN_LEAD_S = 0.05  # longer than an eager verify step's host time at 128k (dsv3-tp8, 8 layers)
BREAKDOWN_REPEATS = 5
ProgressFn = Callable[[str], None]


@dataclass
class DecodeConfig:
    """What the benchmark runs. ``batches``: one per context, or one for all."""

    contexts: Sequence[int] = (32768, 131072)
    batches: Sequence[int] = (2, 1)
    budget: int = 64
    drafter: str = "ddtree"
    new_tokens: int = 64
    rounds: int = 5
    backends: Sequence[str] = BACKENDS
    modes: Sequence[str] = MODES
    baseline: str = BASELINE
    preset: str = "dsv3-tp8"
    device: str = "cuda"
    seed: int = 0
    breakdown: bool = True
    time_budget_s: Optional[float] = None  # stop starting rounds past this (every round kept)
    prefill_backend: Optional[str] = None  # default: the first backend's

    def __post_init__(self):
        self.contexts, self.backends, self.modes = tuple(self.contexts), tuple(self.backends), tuple(self.modes)
        batches = tuple(self.batches)
        if not self.contexts or min(self.contexts) < 1:
            raise ValueError(f"contexts: need at least one length >= 1, got {list(self.contexts)}")
        if len(batches) == 1:
            batches = batches * len(self.contexts)
        if len(batches) != len(self.contexts) or min(batches) < 1:
            raise ValueError(f"batches: need one batch size >= 1 per context (or one for all), got {list(batches)} "
                             f"for {len(self.contexts)} contexts")
        self.batches = batches
        for name, value, low in (("budget", self.budget, 1), ("new_tokens", self.new_tokens, 2),  # the first comes from prefill
                                 ("rounds", self.rounds, 1)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not self.backends or not self.modes:
            raise ValueError("backends and modes: need at least one of each")
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ValueError(f"modes {bad}: known modes are {list(MODES)}")
        if len(set(self.backends)) != len(self.backends):
            raise ValueError(f"backends listed twice: {list(self.backends)}")

    @property
    def arms(self) -> list[Arm]:
        return [Arm(b, m) for m in self.modes for b in self.backends]


def decode_prompts(vocab: int, length: int, batch: int, seed: int) -> list[list[int]]:
    """`batch` prompts of `length` tokens: a random motif repeated with 5 % noise (so the draft model
    and prompt lookup both find matches far back), seeded."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(batch):
        motif = [rng.randrange(vocab) for _ in range(rng.randint(64, 256))]
        prompts.append([motif[j % len(motif)] if rng.random() > 0.05 else rng.randrange(vocab) for j in range(length)])
    return prompts


def _sync(device: torch.device) -> Callable[[], None]:
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


class DecodeSession:
    """One context: a model, a pool holding the prefilled prompts, and a runner per arm."""

    def __init__(self, model, prompts: list[list[int]], config: DecodeConfig):
        self.model, self.config = model, config
        self.spec = get_drafter(config.drafter)
        if self.spec is None:
            raise ValueError("the decode benchmark needs a drafter (tree-speculative decoding), got 'none'")
        depth = self.spec.max_depth
        batch = len(prompts)
        per_arm = 2 * len(config.arms) + batch * (config.budget + depth + 2)  # graphs' scratch, probe slots
        slots = sum(len(p) + config.new_tokens + config.budget + depth + 2 for p in prompts) + per_arm + 64
        self.pool = KVPool(model.config.num_layers, slots, dtype=model.dtype, device=model.device)
        self.draft_layers = (self.spec.layers_for(model.config.num_layers)
                             if isinstance(self.spec, SelfDraftDrafter) else None)
        self.runners = {arm.name: make_runner(arm, model, self.pool, self.draft_layers) for arm in config.arms}
        self.requests = [Request(i, p, config.new_tokens) for i, p in enumerate(prompts)]
        self.sync = _sync(model.device)
        prefill_arm = Arm(config.prefill_backend or config.arms[0].backend, "eager")
        prefill_runner = self.runners.get(prefill_arm.name) or make_runner(prefill_arm, model, self.pool, None)
        t0 = time.perf_counter()
        prefill_runner.prefill(self.requests)
        self.sync()
        self.prefill_s = time.perf_counter() - t0
        self.base = {r.rid: self.pool.slots(r.rid) for r in self.requests}
        self.first = {r.rid: list(r.output) for r in self.requests}

    def reset(self) -> None:
        """Back to the state right after prefill: prompt KV only, first token pending."""
        for r in self.requests:
            slots = self.pool.requests.pop(r.rid)
            extra = slots[len(self.base[r.rid]):]
            if extra:
                self.pool.free(extra)
            self.pool.requests.add(r.rid)
            self.pool.requests.append(r.rid, self.base[r.rid])
            r.output = list(self.first[r.rid])

    def run(self, arm: Arm) -> dict[str, Any]:
        """Decode every request to `new_tokens` on `arm` from the start state; its round's figures."""
        self.reset()
        runner = self.runners[arm.name]
        for r in self.requests:  # the runner's device copy of each prefix, cut back by the reset, outside the clock
            runner.prefix(r.rid)
        step_s: list[float] = []
        last = [0.0]

        def on_step(_kept: int) -> None:  # each step ends reading its tokens on the host: the GPU is done
            now = time.perf_counter()
            step_s.append(now - last[0])
            last[0] = now

        self.sync()
        start = last[0] = time.perf_counter()
        stats = decode_loop(runner, self.requests, self.spec, self.config.budget, on_step=on_step, release=False)
        self.sync()
        wall = time.perf_counter() - start
        made = sum(len(r.output) - len(self.first[r.rid]) for r in self.requests)
        return {"tokens_per_s": made / wall if wall > 0 else math.inf, "wall_s": wall, "tokens": made,
                "steps": len(step_s), "mean_accepted": stats.mean_accepted,
                "step_ms_median": statistics.median(step_s) * 1e3 if step_s else math.nan,
                "step_ms_mean": wall / len(step_s) * 1e3 if step_s else math.nan,
                "output": [list(r.output) for r in self.requests]}


def _median_ms(timer, fn, repeats: int) -> float:
    fn()  # first call: lazy loads, captures
    return statistics.median(timer(fn) for _ in range(repeats)) * 1e3


def step_breakdown(session: DecodeSession, arm: Arm, step_ms: float, repeats: int = BREAKDOWN_REPEATS) -> dict[str, float]:
    """GPU time of one decode step's pieces on `arm`, from the start state, and the host time the
    GPU does not hide (`step_ms`, the arm's measured wall time per step, minus its GPU time).

    drafting: one draft decode pass x the drafter's passes per step; verify: the whole verify step
    (graph replay or eager); attention: every layer's verify attention alone on the step's
    metadata; conversion: the metadata's device build (the graph's packed mask, indptrs and
    scattered slots; for the Triton backend also SGLang's layout: prefix compaction and the bool
    verify mask); rest: verify minus attention and conversion."""
    from kdtree.engine.decode.graph_capture import choose_bucket, stage_values, bucket_metadata  # noqa: PLC0415
    from kdtree.engine.decode.metadata import verify_metadata  # noqa: PLC0415

    session.reset()
    runner: Runner = session.runners[arm.name]
    model, pool, cfg = session.model, session.pool, session.config
    dev = model.device
    timer = make_timer(dev, cold_l2=False, lead_s=BREAKDOWN_LEAD_S)
    requests = session.requests
    trees = session.spec.propose(requests, cfg.budget, runner)
    session.sync()
    out: dict[str, float] = {}

    passes = session.spec.passes(cfg.budget) if isinstance(session.spec, SelfDraftDrafter) else 0
    if passes:
        slots = pool.alloc(len(requests)).tolist()
        contexts = [runner.prefix(r.rid) for r in requests]
        tokens = [r.pending for r in requests]
        try:
            one = _median_ms(timer, lambda: runner.draft_logits(contexts, tokens, slots, session.draft_layers), repeats)
        finally:
            pool.free(slots)
        out["drafting_gpu_ms"] = one * passes
    else:
        out["drafting_gpu_ms"] = 0.0

    sizes = [len(t) for t in trees]
    flat = pool.alloc(sum(sizes)).tolist()
    tree_slots, at = [], 0
    for n in sizes:
        tree_slots.append(flat[at: at + n])
        at += n
    try:
        out["verify_gpu_ms"] = _median_ms(timer, lambda: runner.verify_logits(requests, trees, tree_slots), repeats)
        prefixes = [runner.prefix(r.rid) for r in requests]
        meta = verify_metadata(prefixes, tree_slots, [t.parents for t in trees], dev)
        rows = sum(sizes)
        q = torch.randn(rows, model.config.num_heads, 576, device=dev, dtype=model.dtype)
        backend = runner.backend
        scale = model.config.sm_scale

        def attention():
            for layer in pool.kv:
                backend.forward_verify(q, layer, meta, scale)

        attention()  # a backend that converts once per metadata (SGLang's layout) has it cached now
        out["attention_gpu_ms"] = _median_ms(timer, attention, repeats)

        lens = [int(p.numel()) for p in prefixes]
        bucket = choose_bucket(len(trees), max(sizes), max(lens), model.config.max_position_embeddings)
        conv = 0.0
        if bucket is not None:
            values, starts = stage_values(bucket, lens, trees, tree_slots, flat[0])
            stage = torch.tensor(values, dtype=torch.int64, device=dev)
            kv_indices = torch.zeros(bucket.kv_capacity, dtype=torch.int32, device=dev)
            conv = _median_ms(timer, lambda: bucket_metadata(bucket, stage, kv_indices), repeats)
        if hasattr(backend, "layout"):
            from kdtree.bench.decode_triton import sglang_verify_layout  # noqa: PLC0415

            conv += _median_ms(timer, lambda: sglang_verify_layout(meta, rows), repeats)
        out["conversion_gpu_ms"] = conv
    finally:
        pool.free(flat)
    out["rest_gpu_ms"] = max(0.0, out["verify_gpu_ms"] - out["attention_gpu_ms"] - out["conversion_gpu_ms"])
    out["gpu_ms_per_step"] = out["drafting_gpu_ms"] + out["verify_gpu_ms"]
    out["step_ms"] = step_ms
    out["host_exposed_ms"] = max(0.0, step_ms - out["gpu_ms_per_step"])
    out["draft_passes"] = passes
    out["timer_overruns"] = getattr(timer, "overruns", 0)  # calls whose host time outran the lead
    return out


def _rotated(arms: list[Arm], k: int) -> list[Arm]:
    k %= len(arms)
    return arms[k:] + arms[:k]


def run_context(model, context: int, batch: int, config: DecodeConfig, seed: int,
                progress: ProgressFn = lambda label: None, deadline: Optional[float] = None) -> dict[str, Any]:
    """One context of the benchmark (module docstring): every round of every arm, speedups, breakdown."""
    prompts = decode_prompts(model.config.vocab_size, context, batch, seed)
    arms = config.arms
    session = DecodeSession(model, prompts, config)
    progress(f"L={context} B={batch}: prefilled")
    for arm in arms:  # untimed: captures every bucket the timed runs meet, loads every kernel
        session.run(arm)
        progress(f"L={context}: warm-up {arm.name}")
    rounds: dict[str, list[dict[str, Any]]] = {arm.name: [] for arm in arms}
    reference: Optional[list[list[int]]] = None
    same = {arm.name: True for arm in arms}
    cut = False
    for k in range(config.rounds):
        if deadline is not None and k >= 1 and time.monotonic() > deadline:
            cut = True
            break
        for arm in _rotated(arms, k):
            got = session.run(arm)
            output = got.pop("output")
            if reference is None:
                reference = output
            same[arm.name] = same[arm.name] and output == reference
            got["order"] = k
            rounds[arm.name].append(got)
            progress(f"L={context}: round {k + 1} {arm.name} {got['tokens_per_s']:.1f} tok/s")
    per_arm: dict[str, Any] = {}
    for arm in arms:
        rs = rounds[arm.name]
        per_arm[arm.name] = {
            "backend": arm.backend, "mode": arm.mode,
            "tokens_per_s": summarize([r["tokens_per_s"] for r in rs]),
            "mean_accepted": statistics.median(r["mean_accepted"] for r in rs),
            "step_ms": statistics.median(r["step_ms_mean"] for r in rs),
            "steps": statistics.median(r["steps"] for r in rs),
            "same_tokens": same[arm.name], "rounds": rs}
    speedups: dict[str, Any] = {}
    for mode in config.modes:
        base = f"{config.baseline}-{mode}"
        if base not in per_arm:
            continue
        for backend in config.backends:
            name = f"{backend}-{mode}"
            if backend != config.baseline:
                speedups[f"{name}/{base}"] = speedup(per_arm[name]["tokens_per_s"]["rounds"],
                                                     per_arm[base]["tokens_per_s"]["rounds"]).to_dict()
    if "graph" in config.modes and "eager" in config.modes:
        for backend in config.backends:
            speedups[f"{backend}-graph/{backend}-eager"] = speedup(
                per_arm[f"{backend}-graph"]["tokens_per_s"]["rounds"],
                per_arm[f"{backend}-eager"]["tokens_per_s"]["rounds"]).to_dict()
    if config.breakdown:
        for arm in arms:
            per_arm[arm.name]["breakdown"] = step_breakdown(session, arm, per_arm[arm.name]["step_ms"])
            progress(f"L={context}: breakdown {arm.name}")
    result = {"context": context, "batch": batch, "prefill_s": session.prefill_s, "rounds_run": len(rounds[arms[0].name]),
              "cut_by_time_budget": cut, "arms": per_arm, "speedups": speedups,
              "same_tokens": all(same.values())}
    del session
    return result


def progress_units(config: DecodeConfig) -> int:
    """How many times `run_decode` calls its progress function (for a progress bar's total)."""
    arms = len(config.arms)
    per_context = 1 + arms + config.rounds * arms + (arms if config.breakdown else 0)
    return per_context * len(config.contexts)


def run_decode(config: DecodeConfig, model=None, progress: ProgressFn = lambda label: None,
               on_context: Optional[Callable[[dict[str, Any]], None]] = None) -> dict[str, Any]:
    """The benchmark (module docstring): the record, every round kept. ``on_context(record)`` is
    called with the record so far after each context (e.g. to save it before a longer one)."""
    from kdtree.engine import build_model, preset  # noqa: PLC0415

    if model is None:
        model = build_model(preset(config.preset), seed=0, device=config.device)
    limit = model.config.max_position_embeddings
    depth = get_drafter(config.drafter).max_depth if config.drafter != "none" else 0
    for context in config.contexts:
        if context + config.new_tokens + depth + config.budget > limit:
            raise ValueError(f"context {context} + {config.new_tokens} new tokens + a draft of depth {depth} and "
                             f"{config.budget} nodes passes the model's {limit} positions; use a shorter context")
    deadline = time.monotonic() + config.time_budget_s if config.time_budget_s else None
    started = time.time()
    record = {"config": {**asdict(config), "arms": [a.name for a in config.arms]},
              "device": _device_name(model.device), "model": model.config.model_dump(),
              "started": started, "elapsed_s": 0.0, "contexts": []}
    for k, (context, batch) in enumerate(zip(config.contexts, config.batches)):
        record["contexts"].append(run_context(model, context, batch, config, config.seed + k, progress, deadline))
        record["elapsed_s"] = time.time() - started
        if model.device.type == "cuda":
            torch.cuda.empty_cache()
        if on_context is not None:
            on_context(record)
    return record


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return str(device)
