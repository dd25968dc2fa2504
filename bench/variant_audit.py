"""Logit drift per kernel variant on phase 2's token_exact workload: near-tie or defect?

For each prompt the oracle's greedy continuation is taken; then, for the oracle and for the CUDA
kernel with each variant forced on every call (`ForcedVariantBackend`), the prompts are prefilled
in one batch and one verify step runs over one tree per prompt holding the oracle's path plus
random branches (`path_tree`; teacher forcing: every backend scores the same positions). Per path
position: the oracle's margin, each backend's largest logit drift, its drift along the margin and
whether its argmax flips (`position_drifts`, `summarise`); re-runs of each verify step on the same
pool show a race as reruns that are not bitwise equal (`audit`). `verdict` tells a near-tie from
a defect. `kdtree.tools.variant_audit` is its command line.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Sequence

import torch

from kdtree.engine.decode.backends import AttentionBackend, OpBackend, ReferenceBackend
from kdtree.engine.kv.kv_pool import KVPool
from kdtree.engine.decode.speculative import Request, Runner
from kdtree.engine.decode.tree import TokenTree


class ForcedVariantBackend(OpBackend):
    """The CUDA kernel with one launch-plan variant forced on every call (verify, decode, prefill)."""

    def __init__(self, variant: str):
        super().__init__(f"kernel[{variant}]", "kdtree.kernels.cuda_op", "launch")
        self.variant = variant

    def _op(self, which: str) -> Callable:
        from kdtree.bench.forced import forced_kernel  # noqa: PLC0415

        return forced_kernel(self.variant)


def path_tree(path: Sequence[int], branch_nodes: int, vocab: int, seed: int) -> tuple[TokenTree, list[int]]:
    """A tree whose chain of nodes carries `path` (root = path[0]) with `branch_nodes` random
    siblings hung off random path nodes; returns it and the node index of each path token."""
    rng = random.Random(seed)
    tokens, parents, path_nodes = [int(path[0])], [-1], [0]
    children: list[set[int]] = [set()]
    pending_branches = branch_nodes
    for k in range(1, len(path)):
        tokens.append(int(path[k]))
        parents.append(path_nodes[-1])
        children[path_nodes[-1]].add(int(path[k]))
        children.append(set())
        path_nodes.append(len(tokens) - 1)
        share = pending_branches // max(1, len(path) - k)
        for _ in range(share + (1 if rng.random() < 0.5 and pending_branches > share else 0)):
            parent = path_nodes[rng.randrange(len(path_nodes) - 1)]  # the newest waits for its path child
            token = rng.randrange(vocab)
            if token in children[parent]:
                continue
            children[parent].add(token)
            tokens.append(token)
            parents.append(parent)
            children.append(set())
            pending_branches -= 1
    return TokenTree(tokens, parents), path_nodes


def teacher_forced_logits(model, backend: AttentionBackend, prompts: Sequence[Sequence[int]],
                          paths: Sequence[Sequence[int]], trees: Sequence[TokenTree],
                          path_nodes: Sequence[Sequence[int]], repeats: int = 0,
                          prefill_chunk: int = 8192) -> tuple[list[torch.Tensor], int]:
    """Per prompt, fp32 logits [len(path), vocab] at its path's nodes after prefilling every prompt
    on `backend` in one batch and verifying every tree in one step (as the gate's generate batches
    them; node k predicts path[k + 1]); and how many of `repeats` reruns of the verify step on the
    same pool were not bitwise equal to the first."""
    cfg = model.config
    slots = sum(len(p) + len(t) + 1 for p, t in zip(prompts, trees))
    pool = KVPool(cfg.num_layers, slots, dtype=model.dtype, device=model.device)
    runner = Runner(model, pool, backend, prefill_chunk=prefill_chunk)
    requests = [Request(i, list(p), max_new_tokens=len(path) + 1) for i, (p, path) in enumerate(zip(prompts, paths))]
    runner.prefill(requests)
    for r, path in zip(requests, paths):
        r.output = [int(path[0])]  # teacher forcing: the oracle's first token, whatever this backend chose
    tree_slots = pool.alloc_trees([r.rid for r in requests], [len(t) for t in trees])
    starts = [sum(len(t) for t in trees[:b]) for b in range(len(trees))]
    rows = torch.tensor([s + n for s, nodes in zip(starts, path_nodes) for n in nodes], device=model.device)
    first = runner.verify_logits(requests, list(trees), tree_slots)[rows]
    unequal = 0
    for _ in range(repeats):
        again = runner.verify_logits(requests, list(trees), tree_slots)[rows]
        unequal += int(not torch.equal(again, first))
    return list(first.float().cpu().split([len(n) for n in path_nodes])), unequal


@dataclass
class PositionDrift:
    """One path position of one prompt, one backend against the oracle."""

    prompt: int
    position: int
    margin: float  # oracle's top-1 minus top-2 logit
    drift_max: float  # largest |logit - oracle logit| over the vocabulary
    drift_margin: float  # |this backend's (top-1 - top-2) - the oracle's|, at the oracle's two tokens
    flipped: bool  # this backend's argmax is not the oracle's


def position_drifts(prompt_index: int, ref: torch.Tensor, cand: torch.Tensor) -> list[PositionDrift]:
    """PositionDrift per row of two [positions, vocab] logit tensors (oracle, candidate)."""
    top = ref.topk(2, dim=-1)
    a, b = top.indices[:, 0], top.indices[:, 1]
    margin = top.values[:, 0] - top.values[:, 1]
    cand_margin = cand.gather(1, a[:, None])[:, 0] - cand.gather(1, b[:, None])[:, 0]
    drift_max = (cand - ref).abs().amax(dim=-1)
    flipped = cand.argmax(dim=-1) != a
    return [PositionDrift(prompt_index, k, float(margin[k]), float(drift_max[k]),
                          float((cand_margin[k] - margin[k]).abs()), bool(flipped[k]))
            for k in range(ref.shape[0])]


@dataclass
class BackendSummary:
    backend: str
    positions: int
    drift_max_median: float
    drift_max_p99: float
    drift_max_worst: float
    worst_drift_over_margin: float  # max over positions of drift_margin / margin
    flips: int
    flip_margins: list[float] = field(default_factory=list)  # the oracle's margin where it flipped
    rerun_unequal: int = 0  # reruns of the verify step not bitwise equal to the first
    reruns: int = 0
    worst: Optional[dict] = None  # the position with the largest drift_max


def summarise(name: str, drifts: list[PositionDrift], rerun_unequal: int = 0, reruns: int = 0) -> BackendSummary:
    """Drift statistics of one backend over every position of every prompt."""
    values = sorted(d.drift_max for d in drifts)
    worst = max(drifts, key=lambda d: d.drift_max)
    return BackendSummary(
        backend=name, positions=len(drifts), drift_max_median=statistics.median(values),
        drift_max_p99=values[min(len(values) - 1, int(0.99 * len(values)))], drift_max_worst=values[-1],
        worst_drift_over_margin=max(d.drift_margin / max(d.margin, 1e-30) for d in drifts),
        flips=sum(d.flipped for d in drifts), flip_margins=[d.margin for d in drifts if d.flipped],
        rerun_unequal=rerun_unequal, reruns=reruns, worst=asdict(worst))


def verdict(summaries: list[BackendSummary], band: float = 4.0) -> dict[str, str]:
    """Per backend: 'in band' when its p99 and worst drift are within `band` x the smallest of any
    backend's, 'outlier' otherwise; 'race' whenever a rerun differed. A flip inside the band at a
    margin below the band's worst drift is the near-tie case."""
    if not summaries:
        return {}
    p99_floor = min(s.drift_max_p99 for s in summaries)
    worst_floor = min(s.drift_max_worst for s in summaries)
    out = {}
    for s in summaries:
        if s.rerun_unequal:
            out[s.backend] = f"race: {s.rerun_unequal} of {s.reruns} reruns differ bitwise"
        elif s.drift_max_p99 > band * p99_floor or s.drift_max_worst > band * worst_floor:
            out[s.backend] = (f"outlier: p99 drift {s.drift_max_p99:.3g} (floor {p99_floor:.3g}), worst "
                              f"{s.drift_max_worst:.3g} (floor {worst_floor:.3g})")
        else:
            near = [m for m in s.flip_margins if m <= s.drift_max_worst]
            out[s.backend] = (f"in band ({s.flips} flips, {len(near)} at margins below its worst drift "
                              f"{s.drift_max_worst:.3g})")
    return out


def audit(model, prompts: Sequence[Sequence[int]], backends: dict[str, AttentionBackend], new_tokens: int,
          tree_nodes: int, seed: int, repeats: int = 0, progress: Callable[[str], None] = print) -> dict:
    """The oracle's greedy paths for `prompts`, then every backend's teacher-forced drift on them."""
    from kdtree.engine import generate  # noqa: PLC0415

    progress(f"oracle greedy decoding of {len(prompts)} prompts (longest {max(map(len, prompts))})")
    greedy = generate(prompts, model=model, drafter="none", backend="reference", max_new_tokens=new_tokens).tokens
    oracle = ReferenceBackend()
    built = [path_tree(path, max(0, tree_nodes - len(path)), model.config.vocab_size, seed + i)
             for i, path in enumerate(greedy)]
    trees, nodes = [t for t, _ in built], [n for _, n in built]
    progress(f"oracle: batched prefill and one verify step over {len(trees)} trees")
    refs, _ = teacher_forced_logits(model, oracle, prompts, greedy, trees, nodes)
    drifts: dict[str, list[PositionDrift]] = {name: [] for name in backends}
    reruns: dict[str, int] = {}
    for name, backend in backends.items():
        progress(f"{name}: the same, and {repeats} reruns of its verify step")
        cands, reruns[name] = teacher_forced_logits(model, backend, prompts, greedy, trees, nodes, repeats)
        for i, (ref, cand) in enumerate(zip(refs, cands)):
            drifts[name] += position_drifts(i, ref, cand)
    summaries = [summarise(name, drifts[name], reruns[name], repeats) for name in backends]
    return {"summaries": [asdict(s) for s in summaries], "verdict": verdict(summaries),
            "positions": {name: [asdict(d) for d in ds] for name, ds in drifts.items()}}
