"""Phase 3's workloads and measurements: what is captured in CUDA graphs, and how replay is
measured against eager.

- **launch** cases (`launch_cases`): one kernel launch with a bucket's fixed plan
  (`kdtree.kernels.plan_bucket`) over static buffers sized for the bucket; every draw has a fresh
  number of live requests (the rest padded: no rows, no keys), fresh tree sizes up to the
  bucket's (the rows past the last node padded, their mask rows garbage), fresh prefix lengths
  from 0 to the bucket's context, fresh slots, q and KV; the callable zeroes ``out`` and ``lse``
  then launches, so every output element is defined;
- **converter** case (`converter_case`): SGLang's target-verify metadata converted on the device
  (`VerifyConverter`, Triton) and the kernel launched, both into preallocated buffers;
- **step** cases (`step_cases`): the engine's whole verify step (`graph_capture.verify_body`:
  metadata conversion, every layer, the head) for a bucket, fresh lengths / trees / tokens / slots.

Measurements: `oracle_check` (bucket-planned launches against the fp64 oracle),
`engine_step_allocations`, `buffer_comparison` (graph buffers against SGLang's verify mask),
`time_verify_step` (a whole verify step, graph against eager, host time counted),
`captured_launch_loss` (a captured launch against an eager launch planned for the exact length,
GPU time) and `timed_decode_graphs` (decode tokens/s with and without graphs).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from typing import Any, Callable, Optional, Sequence

import torch

from kdtree.bench.graph_replay import GraphCase
from kdtree.bench.timing import make_timer, round_robin
from kdtree.bench.verify_step import EngineVerify, StepInputs, mixed_parents
from kdtree.engine.api import decode_loop
from kdtree.engine.decode.backends import get_backend
from kdtree.engine.decode.drafters import get_drafter
from kdtree.engine.decode.graph_capture import (
    Bucket, BucketKernelBackend, VerifyGraphs, graph_buffer_bytes, sglang_verify_mask_bytes,
)
from kdtree.engine.kv.kv_pool import KVPool
from kdtree.engine.decode.speculative import Request, Runner
from kdtree.gates.base import GateContext
from kdtree.gates.tensors import compare
from kdtree.integrations.sglang.converter import VerifyConverter
from kdtree.bench.sglang_batches import make_verify_batch
from kdtree.kernels import pack_tree_masks, plan_bucket
from kdtree.kernels.contract import Problem
from kdtree.kernels.cuda_op import cached_plan, device_state, launch
from kdtree.kernels.reference import tree_verify_mla_reference

SM_SCALE = 1.0 / math.sqrt(192)


def _agree(cmp, tol: float = 1e-2) -> bool:
    return not cmp.problems and cmp.rel_l2 <= tol


def launch_inputs(bucket, heads: int, seed: int, device: str, lens: Optional[Sequence[int]] = None,
                  sizes: Optional[Sequence[int]] = None) -> dict[str, Any]:
    """Static-shaped op-contract inputs of a bucket: fresh live requests (the rest padded), tree
    sizes, prefix lengths (0 and the maximum drawn often), slots, q, KV, and garbage mask rows
    for the padded rows. `lens` / `sizes` fix the live requests' lengths and tree sizes."""


    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    B, T, C = bucket.batch, bucket.tree, bucket.context
    if lens is None:
        live = rng.choice([B, rng.randint(1, B)])
        lens = [rng.choice([0, C, rng.randint(0, C)]) for _ in range(live)]
    if sizes is None:
        sizes = [rng.choice([T, 1, rng.randint(1, T)]) for _ in lens]
    slots = B * (C + T) + 7
    kv_indices = torch.randint(0, slots, (B * (C + T),), generator=gen, dtype=torch.int32)  # stale, in range
    perm = torch.randperm(slots, generator=gen).to(torch.int32)
    qo, kv, parents = [0], [0], []
    for length, size in zip(lens, sizes):
        at = kv[-1]
        kv_indices[at: at + length + size] = perm[at: at + length + size]
        qo.append(qo[-1] + size)
        kv.append(at + length + size)
        parents.append(mixed_parents(rng, size))
    qo += [qo[-1]] * (B + 1 - len(qo))
    kv += [kv[-1]] * (B + 1 - len(kv))
    words = bucket.mask_words
    mask = torch.randint(-2 ** 31, 2 ** 31 - 1, (bucket.rows, words), generator=gen, dtype=torch.int32)
    packed = pack_tree_masks(parents)
    mask[: packed.shape[0]] = 0
    mask[: packed.shape[0], : packed.shape[1]] = packed
    values = torch.Generator(device=device).manual_seed(seed)  # q and KV drawn where they live
    return {
        "q": torch.randn(bucket.rows, heads, 576, generator=values, device=device).to(torch.bfloat16),
        "kv_cache": torch.randn(slots, 576, generator=values, device=device).to(torch.bfloat16),
        "qo_indptr": torch.tensor(qo, dtype=torch.int32, device=device),
        "kv_indptr": torch.tensor(kv, dtype=torch.int32, device=device),
        "kv_indices": kv_indices.to(device),
        "tree_mask": mask.to(device),
    }


def launch_outputs(inputs: dict[str, Any]) -> dict[str, Any]:
    q = inputs["q"]
    return {"out": torch.empty(q.shape[0], q.shape[1], 512, dtype=q.dtype, device=q.device),
            "lse": torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)}


def bucket_launch(plan) -> Callable[[dict[str, Any], dict[str, Any]], None]:
    """The captured callable of a launch case: out zero and lse -inf (what padded rows keep), then
    the launch with the bucket's plan, run as it is."""

    def fn(inputs, outputs):
        outputs["out"].zero_()
        outputs["lse"].fill_(float("-inf"))
        launch(inputs["q"], inputs["kv_cache"], inputs["qo_indptr"], inputs["kv_indptr"], inputs["kv_indices"],
               inputs["tree_mask"], SM_SCALE, out=outputs["out"], lse=outputs["lse"], plan=plan, padded_rows=True)
    return fn


def device_plan(bucket, heads: int, variant: Optional[str] = None):
    """The bucket's launch plan on the current CUDA device (`kdtree.kernels.plan_bucket`)."""

    return plan_bucket(bucket.batch, bucket.tree, bucket.context, heads, variant=variant)


def launch_cases(buckets, candidate=None) -> list[tuple[Any, Callable]]:
    """(GraphCase, captured callable) per launch bucket; `candidate(plan)` replaces `bucket_launch`."""

    out = []
    for B, T, C, H, variant in buckets:
        bucket = Bucket(B, T, C)
        plan = device_plan(bucket, H, variant)
        case = GraphCase(f"launch B{B} T{T} L<={C} H{H} {variant or 'auto'} s{plan.num_splits}",
                         lambda seed, dev, b=bucket, h=H: launch_inputs(b, h, seed, dev), launch_outputs,
                         params={"B": B, "T": T, "L": C, "H": H, "variant": plan.variant, "splits": plan.num_splits},
                         neg_inf_ok=("lse",))  # padded rows: out 0, lse -inf (an empty row's)
        out.append((case, (candidate or bucket_launch)(plan)))
    return out


def converter_case(heads: int = 16, batch: int = 4, tree: int = 16, context: int = 4096):
    """SGLang's target-verify metadata -> the op contract (Triton, preallocated) + the kernel."""


    conv = VerifyConverter(batch, batch * tree, tree, batch * (context + tree), "cuda")
    keys = ("q", "pool", "qo_indptr", "kv_indptr", "kv_indices", "out_cache_loc", "custom_mask", "mask_indptr")

    pool_slots = batch * (context + tree) + 64

    def inputs(seed, dev):
        rng = random.Random(seed)
        lens = [rng.randint(1, context) for _ in range(batch)]
        fx = make_verify_batch(heads, lens, tree, seed, device=dev, pool_extra=pool_slots - sum(lens) - batch * tree)
        fx["pool"][fx["out_cache_loc"]] = fx["k_extend"]  # the draft KV, as forward_extend writes it first
        fixed = {k: fx[k] for k in keys}
        # static shapes: the prefix indices padded to the bucket, the mask to its largest block
        kvi = torch.zeros(batch * context, dtype=fx["kv_indices"].dtype, device=dev)
        kvi[: fx["kv_indices"].numel()] = fx["kv_indices"]
        cm = torch.zeros(batch * tree * (context + tree), dtype=fx["custom_mask"].dtype, device=dev)
        cm[: fx["custom_mask"].numel()] = fx["custom_mask"]
        fixed.update(kv_indices=kvi, custom_mask=cm, pool=fx["pool"].view(-1, 576))
        return fixed

    def outputs(inp):
        q = inp["q"]
        return {"out": torch.empty(q.shape[0], heads, 512, dtype=q.dtype, device=q.device)}

    def fn(inp, out):
        meta = conv.convert(inp["qo_indptr"], inp["kv_indptr"], inp["kv_indices"], inp["out_cache_loc"],
                            inp["custom_mask"], inp["mask_indptr"])
        launch(inp["q"], inp["pool"], meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.tree_mask, SM_SCALE,
               out=out["out"])

    return GraphCase(f"sglang converter + kernel B{batch} T{tree} L<={context}", inputs, outputs,
                     params={"B": batch, "T": tree, "L": context, "H": heads}), fn


def step_cases(model, buckets, backend_for=None) -> list[tuple[Any, Callable]]:
    """(GraphCase, captured callable) per engine bucket (whole verify steps of `model`)."""

    out = []
    for B, T, C in buckets:
        bucket = Bucket(B, T, C)
        setup = StepInputs(model, bucket)
        plan = device_plan(bucket, model.config.num_heads)
        backend = (backend_for or BucketKernelBackend)(plan)
        case = GraphCase(f"step B{B} T{T} L<={C} ({model.config.num_layers} layers)", setup.draw, setup.outputs,
                         params={"B": B, "T": T, "L": C, "layers": model.config.num_layers},
                         allow_capture_allocations=True)
        out.append((case, setup.body(backend)))
    return out


def oracle_check(buckets, candidate, ctx: GateContext, draws: int = 2) -> tuple[float, list[dict]]:
    """Bucket-planned launches (eager; replay equals them bitwise) vs the fp64 oracle on the live rows."""

    worst, rows = 0.0, []
    for B, T, C, H, variant in buckets:
        bucket = Bucket(B, T, C)
        plan = device_plan(bucket, H, variant)
        fn = (candidate or bucket_launch)(plan)
        for _ in range(draws):
            seed = ctx.fresh_seed()
            inp = launch_inputs(bucket, H, seed, ctx.device)
            pristine = {k: v.clone() for k, v in inp.items()}  # what the candidate cannot change
            out = launch_outputs(inp)
            fn(inp, out)
            inp = pristine
            qo, kv = inp["qo_indptr"].tolist(), inp["kv_indptr"].tolist()
            live = [b for b in range(B) if qo[b + 1] > qo[b]]
            n, k = qo[live[-1] + 1], kv[live[-1] + 1]
            ref = tree_verify_mla_reference(inp["q"][:n].contiguous(), inp["kv_cache"], inp["qo_indptr"][: len(live) + 1],
                                            inp["kv_indptr"][: len(live) + 1], inp["kv_indices"][:k].contiguous(),
                                            inp["tree_mask"][:n].contiguous(), SM_SCALE)
            cmp = compare("out", out["out"][:n], ref)
            worst = max(worst, cmp.rel_l2) if not math.isnan(cmp.rel_l2) else math.nan
            rows.append({"bucket": [B, T, C, H], "seed": seed, "rel_l2": cmp.rel_l2, "rows": n})
            if math.isnan(worst):
                return worst, rows
    return worst, rows


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


def buffer_comparison(context: int, buckets) -> list[dict[str, Any]]:
    """Graph buffer bytes per (batch, tree) bucket at `context` vs SGLang's verify mask buffer."""

    rows = []
    for batch, tree in buckets:
        ours = graph_buffer_bytes(Bucket(batch, tree, context))
        theirs = sglang_verify_mask_bytes(batch, tree, context)
        packed = 4 * batch * tree * math.ceil(tree / 32)
        # SGLang's Triton backend also preallocates int64 kv_indices for max_num_tokens x max_context_len
        their_indices = 8 * batch * tree * context
        rows.append({"batch": batch, "tree": tree, "context": context, "graph_buffer_bytes": ours,
                     "sglang_mask_bytes": theirs, "ratio": theirs / ours, "graph_mask_bytes": packed,
                     "mask_only_ratio": theirs / packed, "sglang_kv_indices_bytes": their_indices,
                     "total_ratio": (theirs + their_indices) / ours})
    return rows


def engine_step_allocations(model, steps: int, context: int = 1000, batch: int = 2, tree: int = 8,
                            graphs_factory=None) -> tuple[int, dict[str, Any]]:
    """CUDA allocations made by the engine's graph verify steps after the first (capture) one."""


    setup = EngineVerify(model, context, batch, tree, seed=1, graphs_factory=graphs_factory)
    setup.step("graph")  # captures
    torch.cuda.synchronize()
    before = int(torch.cuda.memory_stats().get("allocation.all.allocated", 0))
    for _ in range(steps):
        setup.step("graph")
    torch.cuda.synchronize()
    allocated = int(torch.cuda.memory_stats().get("allocation.all.allocated", 0)) - before
    graphs = setup.runners["graph"].graphs
    return allocated, {"steps": steps, "allocations": allocated, "replays": graphs.replays,
                       "captures": graphs.captures, "fallbacks": graphs.fallbacks}

def time_verify_step(model, context: int, batch: int, tree: int, seed: int, *, warmup: int,
                     repeats: int) -> dict[str, Any]:
    """A whole verify step of `model` (`EngineVerify`), the engine's graph path against its eager
    path: logits compared before and after, then timed interleaved with host time counted (launch
    cost is what graphs remove). Returns the seconds of each path (``graph_s``, ``eager_s``), the
    first comparison's ``rel_l2``, the graph counters and the ``problems`` seen."""
    setup = EngineVerify(model, context, batch, tree, seed=seed)
    problems = []
    cmp = compare("logits", setup.step("graph"), setup.step("eager"))
    if not _agree(cmp):
        problems.append(f"graph and eager logits disagree (rel L2 {cmp.rel_l2:.3g})")
    timer = make_timer(model.device, cold_l2=False, lead_s=0.0)
    tg, te = round_robin([lambda i: setup.step("graph"), lambda i: setup.step("eager")], warmup=warmup,
                         repeats=repeats, timer=timer)
    last = compare("logits", setup.step("graph"), setup.step("eager"))
    if not _agree(last):
        problems.append(f"logits disagree after timing (rel L2 {last.rel_l2:.3g})")
    graphs = setup.runners["graph"].graphs
    return {"graph_s": tg, "eager_s": te, "rel_l2": cmp.rel_l2, "problems": problems,
            "graphs": {"replays": graphs.replays, "captures": graphs.captures}}


def captured_launch_loss(batch: int, tree: int, size: int, heads: int, ctx: GateContext,
                         repeats: int = 15) -> list[dict[str, Any]]:
    """One bucket (batch, tree, context `size`): its launch captured once, replayed at lengths from
    max(32k, size / 2 + 1) to `size`, each against an eager launch planned for that exact length."""


    bucket = Bucket(batch, tree, size)
    plan = device_plan(bucket, heads)
    lo = max(32768, size // 2 + 1)
    lengths = sorted({lo, (lo + size) // 2, size})
    inp = launch_inputs(bucket, heads, ctx.fresh_seed(), ctx.device, lens=[size] * batch, sizes=[tree] * batch)
    out = launch_outputs(inp)["out"]

    def captured():  # the launch alone, as a graph holds it: only the plan differs from `eager`
        launch(inp["q"], inp["kv_cache"], inp["qo_indptr"], inp["kv_indptr"], inp["kv_indices"], inp["tree_mask"],
               SM_SCALE, out=out, plan=plan)

    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        captured()
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        captured()
    exact_out = torch.empty_like(out)
    timer = make_timer(ctx.device)
    state = device_state(torch.cuda.current_device())
    rows = []
    for length in lengths:
        kv = torch.arange(batch + 1, dtype=torch.int32, device=ctx.device) * (length + tree)
        inp["kv_indptr"].copy_(kv)  # request b's slots: [b (L + T), (b + 1)(L + T)) of kv_indices
        exact = inp["kv_indices"][: batch * (length + tree)]

        def eager(i):
            launch(inp["q"], inp["kv_cache"], inp["qo_indptr"], inp["kv_indptr"], exact, inp["tree_mask"], SM_SCALE,
                   out=exact_out)

        graph.replay()
        eager(0)
        agree = _agree(compare("out", out, exact_out))
        tg, te = round_robin([lambda i: graph.replay(), eager], warmup=3, repeats=repeats, timer=timer)
        g, e = statistics.median(tg), statistics.median(te)
        exact_plan = cached_plan(Problem(bucket.rows, heads, batch, bucket.mask_words, inp["kv_cache"].shape[0]),
                                 exact.numel(), state)
        rows.append({"batch": batch, "tree": tree, "bucket_context": size, "context": length, "heads": heads,
                     "captured_ms": g * 1e3, "exact_ms": e * 1e3, "loss": g / e - 1.0, "agree": agree,
                     "bucket_splits": plan.num_splits, "exact_splits": exact_plan.num_splits,
                     "variant": plan.variant, "exact_variant": exact_plan.variant})
    del graph
    return rows


def timed_decode_graphs(model, context: int, new_tokens: int, seed: int, batch: int = 1, drafter: str = "ddtree",
                        budget: int = 16, rounds: int = 2) -> dict[str, Any]:
    """Prefill once, then decode the same requests with and without verify graphs, interleaved
    (the pool truncated back to the prompt between runs). Decode tokens/s, median of `rounds`."""


    rng = random.Random(seed)
    vocab = model.config.vocab_size
    motif = [rng.randrange(vocab) for _ in range(rng.randint(64, 256))]
    prompts = [[motif[j % len(motif)] if rng.random() > 0.05 else rng.randrange(vocab) for j in range(context)]
               for _ in range(batch)]
    spec = get_drafter(drafter)
    slots = sum(len(p) + new_tokens + budget + spec.max_depth + 2 for p in prompts) + 64
    pool = KVPool(model.config.num_layers, slots, dtype=model.dtype, device=model.device)
    runners = {"eager": Runner(model, pool, get_backend("kernel")),
               "graph": Runner(model, pool, get_backend("kernel"), graphs=VerifyGraphs(model, pool))}
    requests = [Request(i, p, new_tokens) for i, p in enumerate(prompts)]
    runners["eager"].prefill(requests)
    torch.cuda.synchronize()
    base = {r.rid: list(pool.req_to_token[r.rid]) for r in requests}
    first = {r.rid: list(r.output) for r in requests}
    rates: dict[str, list[float]] = {"eager": [], "graph": []}
    tokens: dict[str, list] = {}
    for _ in range(rounds + 1):  # the first round warms up (captures the graphs) and is not counted
        for name in ("graph", "eager"):
            for r in requests:
                extra = pool.req_to_token[r.rid][len(base[r.rid]):]
                if extra:
                    pool.free(extra)
                pool.req_to_token[r.rid] = list(base[r.rid])
                r.output = list(first[r.rid])
            torch.cuda.synchronize()
            t = time.perf_counter()
            decode_loop(runners[name], requests, spec, budget, release=False)
            torch.cuda.synchronize()
            rates[name].append(sum(len(r.output) - len(first[r.rid]) for r in requests) / (time.perf_counter() - t))
            tokens[name] = [list(r.output) for r in requests]
    graphs = runners["graph"].graphs
    return {"tokens_per_s": {n: statistics.median(v[1:]) for n, v in rates.items()}, "runs": rates,
            "same_tokens": tokens["graph"] == tokens["eager"], "tokens": tokens, "context": context,
            "batch": batch, "drafter": drafter, "budget": budget,
            "graphs": {"replays": graphs.replays, "captures": graphs.captures, "fallbacks": graphs.fallbacks}}
