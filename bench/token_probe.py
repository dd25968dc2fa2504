"""The token-exact runs (phase 1's and phase 2's token gates): counted op calls, speculative runs against greedy, decoy verify steps,
screened verify steps.

Built on the engine's own seams: `kdtree.engine.register_backend` (the gate registers the
candidate backend wrapped by `CountedBackend` under a name of its own), `generate` (its
``on_step`` marks step boundaries), and `kdtree.engine.decode.speculative.Runner` (prefill and one
verify step on trees the gate builds, `kdtree.bench.decoy_trees.decoy_tree`).

`screened_step` is the run that makes small softmax-scale errors visible in tokens: on a model
with a scale probe (`probe_model`, `kdtree.bench.scale_probe.add_scale_probe`) it keeps the verify
nodes whose reference decision stands clear of rounding noise (`DitheredAttention`) and counts
those that the reference itself, with its scale off by a few percent (`ScaledAttention`),
decides otherwise. Only the reference is perturbed; the candidate is run once per round, on
trees and prompts that are fresh every trial, like any verify step.

`CountedBackend` wraps a backend instance: the op under test is wrapped to count its calls, and
a verify forward's op calls count only when what the forward returns is what the op returned
in it (a backend that calls the op and then answers from elsewhere counts zero).
"""

from __future__ import annotations

import copy
import itertools
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from kdtree.engine import KVPool, get_backend
from kdtree.engine.decode import backends
from kdtree.engine.api import default_dtype
from kdtree.engine.model.config import preset
from kdtree.engine.decode.metadata import verify_metadata
from kdtree.engine.model.model import MLAModel
from kdtree.engine.decode.speculative import Request, Runner
from kdtree.engine.decode.tree import TokenTree
from kdtree.bench.scale_probe import add_scale_probe
from kdtree.engine.model.weights import init_weights
from kdtree.bench.decoy_trees import decoy_tree

_names = itertools.count()


@dataclass
class CallLog:
    """Op calls inside verify forwards, per step (a step ends at each `mark_step`)."""

    steps: list[int] = field(default_factory=list)
    current: int = 0
    op_calls: int = 0  # all calls of the op, verify or not

    def mark_step(self) -> None:
        self.steps.append(self.current)
        self.current = 0


class CountedBackend:
    """Wraps an engine backend instance so that the op under test counts its calls (module docstring)."""

    def __init__(self, inner, op_under_test: Callable, log: CallLog):
        self._inner, self._log, self._torch = inner, log, torch
        self._in_verify: Optional[list] = None
        self.name = getattr(inner, "name", "?")
        resolved = getattr(inner, "op", None) if hasattr(type(inner), "op") else None
        if resolved is op_under_test:
            resolve, counted = inner._op, self._counting(op_under_test)
            # OpBackend resolves each mode's op through _op(which): count where it is the op under test
            inner._op = lambda which: counted if resolve(which) is op_under_test else resolve(which)
        forward_verify = inner.forward_verify

        def counted_verify(q, kv_cache, meta, sm_scale):
            self._in_verify = []
            try:
                out = forward_verify(q, kv_cache, meta, sm_scale)
            finally:
                outs, self._in_verify = self._in_verify, None
            if any(o is out or (o.shape == out.shape and bool(self._torch.equal(o, out))) for o in outs):
                log.current += len(outs)
            return out

        inner.forward_verify = counted_verify

    def _counting(self, op: Callable) -> Callable:
        def counted(*args, **kwargs):
            out = op(*args, **kwargs)
            self._log.op_calls += 1
            if self._in_verify is not None:
                self._in_verify.append(out)
            return out

        return counted

    def __getattr__(self, item):
        return getattr(self._inner, item)

    def forward(self, q, kv_cache, meta, sm_scale):
        return self._inner.forward(q, kv_cache, meta, sm_scale)


def counted_backend(backend: str, op_under_test: Callable) -> tuple[str, CallLog]:
    """Register a fresh `CountedBackend` around ``get_backend(backend)`` under a new name; returns
    (that name, its call log)."""

    log = CallLog()
    inst = CountedBackend(backends.get_backend(backend), op_under_test, log)
    name = f"{backend}+counted-{next(_names)}"
    backends.register_backend(name, lambda: inst)
    return name, log


def same_length(what: str, a: list, b: list) -> None:
    """A run that returns another number of streams than its reference is an error, never zipped short."""
    if len(a) != len(b):
        raise ValueError(f"{what}: the candidate run returned {len(a)} token streams and the reference "
                         f"{len(b)}, for the same prompts")


@dataclass
class DecoyResult:
    tokens: list[list[int]]  # per prompt: the prefill token, then what the verify step emitted
    emitted: list[int]
    logits: Any  # fp32 [sum(P_b + 1), V]: root and path nodes, in request order


def decoy_step(model, backend: str, prompts: list[list[int]], greedy: list[list[int]], path_len: int,
               tree_seed: int, pool=None) -> tuple[DecoyResult, Any]:
    """Prefill `prompts` (unless a prefilled ``pool`` is given: then a copy of it is used) and run
    one verify step on decoy trees whose paths are the greedy continuations; returns the result and
    the pool as it was after prefill (to share with another backend)."""


    vocab = model.config.vocab_size
    trees = [decoy_tree(g[0], g[1: path_len + 1], vocab, random.Random(tree_seed + i)) for i, g in enumerate(greedy)]
    requests = [Request(i, list(p), 10 ** 9) for i, p in enumerate(prompts)]
    if pool is None:
        slots = sum(len(p) + 1 for p in prompts) + sum(len(t.tokens) for t in trees) + 16
        pool = KVPool(model.config.num_layers, slots, dtype=model.dtype, device=model.device)
        Runner(model, pool, get_backend(backend)).prefill(requests)
        prefilled = copy.deepcopy(pool)
    else:
        prefilled, pool = pool, copy.deepcopy(pool)
        for r, g in zip(requests, greedy):
            r.output.append(g[0])
    runner = Runner(model, pool, get_backend(backend))
    sizes = [len(t.tokens) for t in trees]
    starts = [sum(sizes[:b]) for b in range(len(trees))]
    # the logits of root and path nodes, from a forward identical to verify_step's
    slots = pool.alloc(sum(sizes)).tolist()
    prefix = [pool.slots(r.rid) for r in requests]
    meta = verify_metadata(prefix, [slots[s: s + n] for s, n in zip(starts, sizes)],
                           [t.parents for t in trees], model.device)
    positions = []
    for p, t in zip(prefix, trees):
        depth = [0] * len(t.parents)
        for i in range(1, len(depth)):
            depth[i] = depth[t.parents[i]] + 1
        positions += [len(p) + d for d in depth]
    logits = runner.forward([tok for t in trees for tok in t.tokens], positions, slots, meta)
    rows = torch.tensor([s + n for s, t in zip(starts, trees) for n in [0] + t.path_nodes], device=logits.device)
    path_logits = logits[rows].float().cpu()
    pool.free(slots)
    emitted = runner.verify_step(requests, [TokenTree(t.tokens, t.parents) for t in trees])
    return DecoyResult([list(r.output) for r in requests], emitted, path_logits), prefilled


def margin_report(candidate_logits, reference_logits, tie_margin: float | None = None) -> dict:
    """The largest |candidate - reference| logit of a row as a fraction of the reference's top-1 /
    top-2 margin in that row (``fraction``: how close the candidate came to changing a token), over
    the rows whose margin is at least `tie_margin` (near-ties, `TokenExactGateSpec.tie_margin`, are
    left out; 0.0 when every row is one); with what explains it: the worst row's margin and drift,
    the narrowest margin and its drift, and how many rows were near-ties."""

    top2 = reference_logits.float().topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1]).clamp_min(1e-12)
    drift = (candidate_logits.float() - reference_logits.float()).abs().amax(dim=-1)
    counted = margin >= tie_margin if tie_margin is not None else torch.ones_like(margin, dtype=torch.bool)
    ratio = torch.where(counted, drift / margin, torch.zeros_like(margin))
    worst = int(ratio.argmax())
    narrow = int(margin.argmin())
    return {"fraction": float(ratio[worst]), "worst_row_margin": float(margin[worst]),
            "worst_row_drift": float(drift[worst]), "narrowest_margin": float(margin[narrow]),
            "narrowest_margin_drift": float(drift[narrow]), "near_tie_rows": int((~counted).sum()),
            "rows": int(margin.numel()), "median_drift": float(drift.median())}


# -- screened decisions: verify nodes a small softmax-scale error flips, bf16 noise does not ------
class ScaledAttention:
    """A backend that passes ``sm_scale * factor`` to `inner` (the gate's perturbed reference)."""

    def __init__(self, inner, factor: float):
        self._inner, self.factor = inner, float(factor)

    def __getattr__(self, item):
        return getattr(self._inner, item)

    def forward(self, q, kv_cache, meta, sm_scale):
        return self._inner.forward(q, kv_cache, meta, sm_scale * self.factor)


class DitheredAttention:
    """A backend whose outputs are `inner`'s moved by uniform noise of ``ulps`` bf16 ulps per
    element (then cast to the model's dtype): a kernel at least as noisy as bf16 rounding allows.

    With ``softmax_ulps`` > 0 the attention itself is computed here in fp32 (the torch backend's
    math), every softmax weight multiplied by ``1 + u * softmax_ulps * 2**-8`` (u uniform in
    [-1, 1]) before PV, then dithered by ``ulps`` as above. That is the rounding a correct flash
    kernel adds: it rounds the weights to bf16 for the PV MMA, an error coherent over the 512
    output columns of a row, which per-element dither of the same size does not model.
    """

    def __init__(self, inner, ulps: float, generator, softmax_ulps: float = 0.0):
        self._inner, self.ulps, self._gen = inner, float(ulps), generator
        self.softmax_ulps = float(softmax_ulps)

    def __getattr__(self, item):
        return getattr(self._inner, item)

    def _uniform(self, shape, device):
        return (torch.rand(shape, generator=self._gen, device=self._gen.device) * 2 - 1).to(device)

    def forward(self, q, kv_cache, meta, sm_scale):
        if self.softmax_ulps > 0:
            amp = self.softmax_ulps * 2.0 ** -8
            out = backends.dense_attention(q, kv_cache, meta, sm_scale,
                                  probs_hook=lambda p: p * (1 + amp * self._uniform(p.shape, p.device)))
        else:
            out = self._inner.forward(q, kv_cache, meta, sm_scale)
        x = out.float()
        ulp = torch.exp2(torch.floor(torch.log2(x.abs().clamp_min(1e-30))) - 7)  # bf16: 8 significant bits
        return (x + self._uniform(x.shape, x.device) * self.ulps * ulp).to(out.dtype)


def random_tree(root: int, nodes: int, vocab: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """(tokens, parents) of a random tree of `nodes` nodes: each node's parent drawn from the
    last few nodes (deep, bushy trees), tokens uniform over the vocabulary."""
    tokens, parents = [int(root)], [-1]
    for t in range(1, nodes):
        parents.append(rng.randrange(max(0, t - 4), t))
        tokens.append(rng.randrange(vocab))
    return tokens, parents


def tree_logits(model, backend, pool, prefix: list[list[int]], trees: list[tuple[list[int], list[int]]], slots):
    """fp32 logits [sum T_b, V] of one verify forward over `trees` (after `prefix` slots) through `backend`."""

    sizes = [len(t[0]) for t in trees]
    starts = [sum(sizes[:b]) for b in range(len(trees))]
    per_tree = [slots[s: s + n] for s, n in zip(starts, sizes)]
    meta = verify_metadata(prefix, per_tree, [t[1] for t in trees], model.device)
    positions = []
    for p, (_, parents) in zip(prefix, trees):
        depth = [0] * len(parents)
        for i in range(1, len(depth)):
            depth[i] = depth[parents[i]] + 1
        positions += [len(p) + d for d in depth]
    runner = Runner(model, pool, backend)
    return runner.forward([tok for t in trees for tok in t[0]], positions, slots, meta).float()


def margins_against(logits, winners):
    """Per row: logit of `winners[row]` minus the best other logit (< 0 where another token wins)."""

    rows = torch.arange(logits.shape[0])
    win = logits[rows, winners]
    others = logits.clone()
    others[rows, winners] = float("-inf")
    return win - others.amax(-1)


def probe_model(device, probe_seed: int):
    """The gate's model for screened decisions: the engine's tiny circuit model (seed 0) with a
    softmax-scale probe drawn from `probe_seed` (`kdtree.bench.scale_probe.add_scale_probe`), in the
    device's dtype (bf16 on CUDA)."""

    model = MLAModel(preset("tiny"))
    init_weights(model, 0)
    add_scale_probe(model, probe_seed)
    return model.to(device=device, dtype=default_dtype(device)).eval().requires_grad_(False)


@dataclass
class ScreenResult:
    candidate: list[list[int]]  # per prompt: the candidate's greedy token at each kept node
    reference: list[list[int]]  # the reference's there
    sensitive: dict[str, int]  # per drift ("+2%", "-2%"): kept nodes whose token it flips
    details: dict[str, Any]


def screened_step(model, reference: str, candidate: str, prompts: list[list[int]], screen, rng: random.Random,
                  on_round: Optional[Callable[[], None]] = None) -> ScreenResult:
    """Prefill `prompts` with `reference`, then verify forwards over fresh random trees (3/4 to
    all of `screen.tree_nodes` nodes per prompt) through the reference, the reference with the softmax
    scale off by ``1 +- screen.scale_drift``, ``screen.noise_draws`` dithered references
    (`DitheredAttention`, ``screen.noise_ulps``) and the candidate (`gates.spec.DecisionScreenSpec`),
    one round after another until every drift has ``screen.min_sensitive`` sensitive nodes or
    ``screen.max_rounds`` rounds ran (`on_round` after each: a step boundary for the call log).

    A node is kept when its reference margin exceeds ``screen.noise_multiple`` times its noise
    (the largest margin change over the dithered draws, and never less than the median of that
    over all nodes of the round); a kept node is sensitive to a drift when the drifted
    reference's token there differs from the reference's by a margin beyond the same multiple
    of the noise."""

    nodes = screen.tree_nodes
    requests = [Request(i, list(p), 10 ** 9) for i, p in enumerate(prompts)]
    pool = KVPool(model.config.num_layers, sum(len(p) + 1 for p in prompts) + nodes * len(prompts) + 16,
                  dtype=model.dtype, device=model.device)
    Runner(model, pool, get_backend(reference)).prefill(requests)
    prefix = [pool.slots(r.rid) for r in requests]
    slots = pool.alloc(nodes * len(prompts)).tolist()
    labels = [f"{sign * screen.scale_drift:+.0%}" for sign in (1, -1)]
    result = ScreenResult([[] for _ in prompts], [[] for _ in prompts], dict.fromkeys(labels, 0), {"rounds": []})
    for _ in range(screen.max_rounds):
        # sizes vary per request and round (3/4 to all of tree_nodes): no fixed shape marks the gate
        trees = [random_tree(r.output[0], rng.randint(max(2, 3 * nodes // 4), nodes), model.config.vocab_size, rng)
                 for r in requests]
        used = slots[: sum(len(t[0]) for t in trees)]
        row = _screen_round(model, get_backend(reference), get_backend(candidate), pool, prefix, trees, used,
                            screen, rng, labels, result)
        result.details["rounds"].append(row)
        if on_round is not None:
            on_round()
        if min(result.sensitive.values()) >= screen.min_sensitive:
            break
    rounds = result.details["rounds"]
    totals = [key for key in rounds[0] if not key.endswith(("median", "max"))]
    result.details.update({key: sum(r[key] for r in rounds) for key in totals})
    result.details["candidate_moved_max"] = max(r["candidate_moved_max"] for r in rounds)
    return result


def _screen_round(model, ref, cand_backend, pool, prefix, trees, slots, screen, rng, labels, result) -> dict:
    """One screened verify forward set (see `screened_step`); adds its kept tokens and sensitive
    counts to `result`, returns the round's figures."""

    def logits(backend):
        return tree_logits(model, backend, pool, prefix, trees, slots).cpu()

    base = logits(ref)
    winners = base.argmax(-1)
    margin = margins_against(base, winners)
    gen = torch.Generator(device=model.device).manual_seed(rng.getrandbits(63))
    dithered = DitheredAttention(ref, screen.noise_ulps, gen, screen.softmax_ulps)
    noise = torch.stack([(margins_against(logits(dithered), winners) - margin).abs()
                         for _ in range(screen.noise_draws)]).amax(0)
    noise = torch.maximum(noise, noise.median())
    kept = margin > screen.noise_multiple * noise
    drifted = {label: logits(ScaledAttention(ref, 1 + sign * screen.scale_drift))
               for label, sign in zip(labels, (1, -1))}
    cand_logits = logits(cand_backend)
    cand = cand_logits.argmax(-1)
    moved = (margins_against(cand_logits, winners) - margin).abs() / noise  # in units of the noise
    row = {"nodes": int(winners.numel()), "kept": int(kept.sum()), "noise_median": float(noise.median()),
           "noise_max": float(noise.max()), "margin_median": float(margin.median()),
           "candidate_moved_max": float(moved[kept].max()) if bool(kept.any()) else 0.0,
           "candidate_moved_median": float(moved[kept].median()) if bool(kept.any()) else 0.0,
           "kept nodes the candidate changed": int((kept & (cand != winners)).sum())}
    for label, lg in drifted.items():
        flips = kept & (margins_against(lg, winners) < -screen.noise_multiple * noise)
        row[f"sensitive {label}"] = int(flips.sum())
        row[f"candidate took the {label} token"] = int((flips & (cand == lg.argmax(-1))).sum())
        result.sensitive[label] += int(flips.sum())
    start, keep, cand_l, ref_l = 0, kept.tolist(), cand.tolist(), winners.tolist()
    for b, (tokens, _) in enumerate(trees):
        rows = [i for i in range(start, start + len(tokens)) if keep[i]]
        start += len(tokens)
        result.candidate[b] += [cand_l[i] for i in rows]
        result.reference[b] += [ref_l[i] for i in rows]
    return row
