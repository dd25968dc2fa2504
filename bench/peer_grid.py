"""Our kernel against the peers (FlashInfer's MLA backends, FlashMLA's dense decode) on one shape:
each peer bound once per case, its output held to ours on the chain mask (rel-L2 <= 1e-2) before
its time counts, then every call timed interleaved (`kdtree.bench.timing.round_robin`) against
the roofline. `kdtree.tools.peers` is its command line.
"""

from __future__ import annotations

import statistics

import torch

from kdtree.bench import flashinfer_peer
from kdtree.bench.cases import case_args, uniform_case
from kdtree.bench.roofline import Shape, floor_seconds
from kdtree.bench.timing import round_robin
from kdtree.kernels import tree_verify_mla


def rel_l2(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def measure(shape: Shape, pool, peers: dict, bw: float, rate: float, timer, reps: int, seed: int,
            ours=tree_verify_mla) -> dict:
    case = uniform_case(shape.H, shape.T, shape.B, shape.L, "scattered", pool, seed)
    q, kv, qo, kvp, kvi, tree, scale = case_args(case)
    chain = flashinfer_peer.chain_mask(qo, device=q.device)
    out_tree = torch.empty(q.shape[0], shape.H, 512, dtype=q.dtype, device=q.device)
    out_chain = torch.empty_like(out_tree)
    calls = {"ours_tree": lambda r: ours(q, kv, qo, kvp, kvi, tree, scale, out=out_tree),
             "ours_chain": lambda r: ours(q, kv, qo, kvp, kvi, chain, scale, out=out_chain)}
    row = dict(shape=shape.label, H=shape.H, T=shape.T, B=shape.B, L=shape.L,
               floor_ms=floor_seconds(shape, bw, rate) * 1e3)
    calls["ours_chain"](0)
    torch.cuda.synchronize()
    ref = out_chain.clone()
    for name, peer in peers.items():
        try:
            run = peer.bind(q, kv, qo, kvp, kvi, scale)
            got = run()
            torch.cuda.synchronize()
        except Exception as exc:  # a peer that refuses a shape is reported, not fatal
            row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        row[f"{name}_rel_l2"] = rel_l2(got, ref)
        if row[f"{name}_rel_l2"] > 1e-2:
            row[f"{name}_error"] = f"disagrees with ours on the chain: rel-L2 {row[f'{name}_rel_l2']:.3g}"
            continue
        calls[name] = lambda r, run=run: run()
    for fn in calls.values():
        fn(0)
    host = {name: [] for name in calls}
    gpu = round_robin(calls, repeats=reps, timer=timer, host=host)
    for name, ts in gpu.items():
        row[f"{name}_ms"] = statistics.median(ts) * 1e3
        row[f"{name}_spread"] = [min(ts) * 1e3, max(ts) * 1e3]
        row[f"{name}_host_us"] = statistics.median(host[name]) * 1e6
        row[f"{name}_roofline"] = row["floor_ms"] / row[f"{name}_ms"]
    for name in peers:
        if f"{name}_ms" in row:
            row[f"{name}_over_ours_tree"] = row[f"{name}_ms"] / row["ours_tree_ms"]
    return row
