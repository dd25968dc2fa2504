"""The engine's public entry points: `build_model` and `generate`."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, NamedTuple, Optional, Sequence

import torch

from kdtree.engine.decode.backends import get_backend
from kdtree.engine.model.config import ModelConfig, preset
from kdtree.engine.decode.drafters import get_drafter
from kdtree.engine.kv.kv_pool import KVPool
from kdtree.engine.model.model import MLAModel
from kdtree.engine.decode.speculative import Request, Runner
from kdtree.engine.model.weights import init_weights
from kdtree.kernels.contract import MAX_TREE_NODES


@dataclass
class GenerationResult:
    """What `generate` returns; `to_dict()` is the demo's --json object."""

    tokens: list[list[int]]  # new tokens per request, in prompt order
    accepted_per_step: list[float]  # per decode/verify step: tokens emitted per active request, mean
    mean_accepted: float  # tokens emitted per request-step over the whole run
    tokens_per_s: float  # new tokens of all requests / wall time (prefill included)
    steps: int  # decode/verify steps after prefill
    wall_s: float
    prefill_s: float  # of wall_s: prefill (the first token of every request)
    decode_tokens_per_s: float  # tokens after each request's first / the time after prefill
    drafter: str
    budget: int
    backend: str
    device: str
    dtype: str
    cuda_graph: bool = False  # verify steps replayed CUDA graphs (kdtree.engine.decode.graph_capture)
    graph_replays: int = 0  # verify steps served by a graph replay (the rest ran eagerly)
    draft_graph_replays: int = 0  # the self-draft model's decode passes served by a graph replay
    # With record_margins (plain greedy only): per request and token, the top-1 minus top-2 logit
    # and the runner-up token behind it.
    margins: Optional[list[list[float]]] = None
    runner_up: Optional[list[list[int]]] = None

    def to_dict(self) -> dict:
        return asdict(self)


def default_dtype(device: str | torch.device) -> torch.dtype:
    """fp32 on CPU, bf16 on CUDA."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def check_device(device) -> torch.device:
    """`device` as a torch.device this process can use; ValueError saying what is wrong otherwise."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {device!r} is not a device name torch knows (use 'cpu', 'cuda' or "
                         f"'cuda:N')") from err
    if dev.type == "cuda":
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            raise ValueError(f"device {device!r}: this torch build ({torch.__version__}) has no CUDA "
                             "support; install a CUDA build of torch or use --device cpu")
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: no CUDA GPU is visible (torch.cuda.is_available() is "
                             "False); use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    elif dev.type != "cpu":
        raise ValueError(f"device {device!r}: the engine runs on 'cpu' or 'cuda' devices only")
    return dev


def build_model(config: Optional[ModelConfig] = None, seed: int = 0, device: str | torch.device = "cpu",
                dtype: Optional[torch.dtype] = None) -> MLAModel:
    """The seeded MLA model (config defaults to the 'tiny' preset), in eval mode on `device`."""
    device = check_device(device)
    config = preset("tiny") if config is None else config
    model = MLAModel(config)
    init_weights(model, seed)
    return model.to(device=device, dtype=dtype or default_dtype(device)).eval().requires_grad_(False)


def _check_prompts(prompts, vocab_size: int) -> list[list[int]]:
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts: need a non-empty list of token-id lists")
    checked = []
    for i, p in enumerate(prompts):
        if not isinstance(p, (list, tuple)) or not p:
            raise ValueError(f"prompts[{i}]: need a non-empty list of token ids")
        ids = [int(t) for t in p]
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompts[{i}]: token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
        checked.append(ids)
    return checked


def decode_loop(runner: Runner, requests: list[Request], spec, budget: int,
                on_step: Optional[Callable[[int], None]] = None, release: bool = True) -> "DecodeStats":
    """Decode every request to its max_new_tokens: plain greedy (spec None) or tree-speculative
    with drafter `spec`. release: free each request's slots when it is done (False keeps them,
    e.g. to fork a state)."""
    accepted_per_step: list[float] = []
    emitted_total = request_steps = 0
    active = [r for r in requests if not r.done]
    while active:
        if spec is None:
            emitted = runner.decode_step(active)
        else:
            trees = spec.propose(active, budget, runner)
            for r, tree in zip(active, trees):
                if len(tree) > budget:
                    raise ValueError(f"drafter {spec.name!r} proposed a tree of {len(tree)} nodes for request "
                                     f"{r.rid}, over the budget of {budget}")
            emitted = runner.verify_step(active, trees)
        accepted_per_step.append(sum(emitted) / len(emitted))
        emitted_total += sum(emitted)
        request_steps += len(emitted)
        kept = 0
        for r, n in zip(active, emitted):
            over = max(0, len(r.output) - r.max_new_tokens)
            kept += n - over
            if r.done:
                del r.output[r.max_new_tokens:]
                if release:
                    runner.release(r.rid)
        if on_step:
            on_step(kept)
        active = [r for r in active if not r.done]
    return DecodeStats(accepted_per_step, emitted_total, request_steps)


class DecodeStats(NamedTuple):
    accepted_per_step: list[float]  # tokens emitted per active request, per step
    emitted: int  # tokens emitted over all steps and requests
    request_steps: int  # sum over steps of the requests active in it

    @property
    def mean_accepted(self) -> float:
        return self.emitted / self.request_steps if self.request_steps else 1.0


def generate(prompts: Sequence[Sequence[int]], *, model: Optional[MLAModel] = None,
             config: Optional[ModelConfig] = None, drafter: str = "none", budget: int = 16,
             backend: str = "torch", device: str = "cpu", dtype: Optional[torch.dtype] = None,
             max_new_tokens: int = 32, seed: int = 0, pool_slots: Optional[int] = None,
             on_step: Optional[Callable[[int], None]] = None, prefill_chunk: int = 8192,
             cuda_graph: Optional[bool] = False, record_margins: bool = False) -> GenerationResult:
    """Greedy generation for a batch of prompts, plain (drafter='none') or tree-speculative.

    model: a built `MLAModel` (its device and dtype win); else one is built from `config`
    (default 'tiny') and `seed` on `device` in `dtype` (default fp32 on CPU, bf16 on CUDA).
    drafter: 'none' | 'ngram' | 'selfdraft' | 'ddtree'; budget: tree nodes per request per step,
    root included (1..1024). backend: an attention backend name (`kdtree.engine.decode.backends`).
    pool_slots: KV pool size (default: enough for every request's prompt, output and one tree).
    on_step(n): called after prefill and each step with the number of new tokens kept.
    prefill_chunk: prompt tokens per request per prefill forward (bounds prefill memory).
    cuda_graph: capture and replay verify steps, and the self-draft model's decode passes, in CUDA
    graphs (`kdtree.engine.decode.graph_capture`, `kdtree.engine.decode.draft_graphs`):
    False (default) off; True on (a ValueError where it cannot apply: it needs the kernel backend
    on CUDA and a drafter); None on where it applies (the CLI's default). Speculative decoding emits exactly the tokens plain greedy decoding would.
    record_margins: keep each greedy token's top-1 minus top-2 logit and runner-up (``margins``,
    ``runner_up``); plain greedy decoding (drafter 'none') only.
    """
    spec = get_drafter(drafter)
    attention = get_backend(backend)
    if record_margins and spec is not None:
        raise ValueError(f"record_margins needs plain greedy decoding (drafter 'none'), got drafter {drafter!r}")
    if not isinstance(budget, int) or not 1 <= budget <= MAX_TREE_NODES:
        raise ValueError(f"budget must be an int in [1, {MAX_TREE_NODES}], got {budget!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    target = model.device if model is not None else check_device(device)
    if attention.requires_cuda and target.type != "cuda":
        raise ValueError(f"attention backend {backend!r} runs on CUDA devices only, but the model is on "
                         f"{target}; use --device cuda, or --backend torch / reference on the CPU")
    if model is None:
        model = build_model(config, seed, device, dtype)
    elif config is not None and config != model.config:
        raise ValueError("config does not match the model's config; pass one or the other")
    cfg = model.config
    graphs_ok = attention.name in ("kernel", "cuda") and model.device.type == "cuda" and spec is not None
    if cuda_graph and not graphs_ok:
        raise ValueError(f"cuda_graph needs the kernel backend on a CUDA device and a drafter (verify steps); "
                         f"got backend {backend!r} on {model.device}, drafter {drafter!r}: use --no-cuda-graph")
    use_graphs = graphs_ok if cuda_graph is None else bool(cuda_graph)
    prompts = _check_prompts(prompts, cfg.vocab_size)
    depth = spec.max_depth if spec else 0  # deepest draft node past the pending token
    reach = max(map(len, prompts)) + max_new_tokens + depth
    if reach > cfg.max_position_embeddings:
        raise ValueError(f"longest prompt + max_new_tokens + draft depth reaches position {reach}, beyond "
                         f"max_position_embeddings = {cfg.max_position_embeddings}")
    per_request = [len(p) + max_new_tokens + depth + budget + 1 for p in prompts]  # kept KV + one tree
    if pool_slots is None:
        pool_slots = sum(per_request) + (2 if use_graphs else 0)  # + the graphs' scratch slots
    longest = max(map(len, prompts))
    if longest >= pool_slots:
        raise ValueError(f"a prompt of {longest} tokens is longer than the KV pool allows "
                         f"({pool_slots} slots, and generating needs at least one more)")
    pool = KVPool(cfg.num_layers, pool_slots, dtype=model.dtype, device=model.device)
    graphs = draft_graphs = None
    if use_graphs:
        from kdtree.engine.decode.draft_graphs import DraftGraphs  # noqa: PLC0415
        from kdtree.engine.decode.drafters import SelfDraftDrafter  # noqa: PLC0415
        from kdtree.engine.decode.graph_capture import VerifyGraphs  # noqa: PLC0415

        graphs = VerifyGraphs(model, pool)
        if isinstance(spec, SelfDraftDrafter):
            draft_graphs = DraftGraphs(model, pool, spec.layers_for(cfg.num_layers))
    runner = Runner(model, pool, attention, prefill_chunk=prefill_chunk, graphs=graphs, draft_graphs=draft_graphs)
    if record_margins:
        runner.decisions = {}
    requests = [Request(rid, p, max_new_tokens) for rid, p in enumerate(prompts)]
    start = time.perf_counter()
    runner.prefill(requests)  # its argmax reads the logits on the host: the device is done here
    prefill_s = time.perf_counter() - start
    if on_step:
        on_step(len(requests))
    for r in requests:
        if r.done:
            runner.release(r.rid)
    stats = decode_loop(runner, [r for r in requests if not r.done], spec, budget, on_step, release=True)
    accepted_per_step = stats.accepted_per_step
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
    wall = time.perf_counter() - start

    tokens = [r.output for r in requests]
    decode_s = wall - prefill_s
    later = sum(map(len, tokens)) - len(tokens)
    return GenerationResult(
        tokens=tokens, accepted_per_step=accepted_per_step,
        mean_accepted=stats.mean_accepted,
        tokens_per_s=sum(map(len, tokens)) / wall if wall > 0 else float("inf"),
        steps=len(accepted_per_step), wall_s=wall, prefill_s=prefill_s,
        decode_tokens_per_s=later / decode_s if decode_s > 0 and later else float("nan"),
        drafter=drafter, budget=budget, backend=backend,
        device=str(model.device), dtype=str(model.dtype).removeprefix("torch."),
        cuda_graph=use_graphs, graph_replays=graphs.replays if graphs is not None else 0,
        draft_graph_replays=draft_graphs.graphs.replays if draft_graphs is not None else 0,
        margins=_decided(runner, requests, 0) if record_margins else None,
        runner_up=_decided(runner, requests, 1) if record_margins else None)


def _decided(runner: Runner, requests: Sequence[Request], field_index: int) -> list[list]:
    """One field of the runner's recorded decisions per request, cut to the tokens it kept."""
    return [[d[field_index] for d in runner.decisions.get(r.rid, [])][: len(r.output)] for r in requests]
