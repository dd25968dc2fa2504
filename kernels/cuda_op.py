"""The owned CUDA kernel behind `kdtree.kernels.tree_verify_mla`: validation, launch plan, call.

The launch plan (how many KV splits, which row tile; `kdtree.kernels.launch_plan`) is chosen
from tensor *shapes* only, so a call never synchronises the device and can be captured in a CUDA
graph. `launch` is the internal entry point: the op contract plus ``plan`` (a `LaunchPlan` made
beforehand, e.g. a CUDA-graph bucket's, run as it is once it is checked against the call's shapes
and device); a forced variant or split count is a plan's (`kdtree.kernels.plan(..., variant=,
num_splits=)`, the tools' ``--variant`` / ``--splits``); nothing on the launch path reads the
process environment. When it loads the extension it holds the extension's launch fields, variant
table and limits to this package's (`check_extension`). The extension takes one `LaunchParams` (pointers, sizes, plan, stream).
Split partials go to a per-device workspace allocated once, on the first call for that device:
warm up before capture.
Pass `out` (and `lse`) to make a call allocation-free.

The host path is kept cheap (it is most of an eager call on small shapes): what a device offers
(`kdtree.kernels.device_facts`, extension, workspace) is looked up once per device index, plans
are memoised, and `launch_args` does the rest; `kdtree.tools.host_path_bench` times it on the CPU.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable, NamedTuple, Optional

import torch

from kdtree.kernels.contract import LATENT_DIM, Problem, validate
from kdtree.kernels.device_facts import DeviceFacts, device_facts
from kdtree.kernels.launch_plan import (  # noqa: F401
    BLOCK_M, BLOCK_N, MAX_SPLITS, VARIANTS, WORKSPACE_ROWS, LaunchPlan, plan, runnable_variants,
)
from kdtree.kernels.runs import KVRuns

_PLAN_CACHE_SIZE = 4096

_workspaces: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
_extensions: dict[tuple[int, int], ModuleType] = {}
_plans: dict[tuple, LaunchPlan] = {}


class DeviceState(NamedTuple):
    """What a launch needs of one CUDA device; built once per device index (`device_state`)."""

    index: int
    sm_count: int
    capability: tuple[int, int]
    ext: ModuleType  # the extension module: ext.run(launch_args(...))
    workspace_ptrs: tuple[int, int]  # split partials (out rows, lse), kept alive by _workspaces
    stream: Callable[[int], int]  # device index -> its current raw cudaStream_t
    shared_memory_per_block_optin: Optional[int] = None  # None: not known

    @property
    def facts(self) -> DeviceFacts:
        """The device's facts, as a `LaunchPlan` records the ones it was made for."""
        return DeviceFacts(self.sm_count, self.capability, self.shared_memory_per_block_optin)


class LaunchParams(NamedTuple):
    """The extension's one argument (``ext.run(params)``): the kernel's parameters packed in the
    order of the extension's ``launch_fields`` (csrc/bindings.cpp). Exactly one KV layout is set:
    ``kv_indices`` (one slot per key) with the run pointers 0, or the three run pointers
    (`kdtree.kernels.runs.KVRuns`) with ``kv_indices`` 0."""

    q: int
    kv: int
    qo_indptr: int
    kv_indptr: int
    kv_indices: int
    tree_mask: int
    out: int
    lse: int  # 0: no lse
    ws_o: int
    ws_lse: int
    total_rows: int
    num_heads: int
    batch: int
    mask_words: int
    num_splits: int
    grid_y: int
    variant: int
    sm_scale: float
    stream: int
    kv_run_indptr: int = 0
    kv_run_start: int = 0
    kv_run_pos: int = 0


_device_states: dict[int, DeviceState] = {}


def _raw_stream_getter() -> Callable[[int], int]:
    fast = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return fast if fast is not None else (lambda index: torch.cuda.current_stream(index).cuda_stream)


def _current_device_getter() -> Callable[[], int]:
    # torch.cuda.current_device() only adds a lazy-init check; a CUDA tensor already exists here.
    fast = getattr(torch._C, "_cuda_getDevice", None)
    return fast if fast is not None else torch.cuda.current_device


_current_device = _current_device_getter()


def _extension(device_index: int) -> ModuleType:
    cap = device_facts(device_index).capability
    if cap not in _extensions:
        if cap < (8, 0):
            raise RuntimeError(f"the tree-verify kernel needs sm_80 or newer (mma.sync bf16, cp.async); "
                               f"device {device_index} is sm_{cap[0]}{cap[1]}")
        from kdtree.kernels.jit import load_for_capability  # noqa: PLC0415

        ext = load_for_capability(cap)
        check_extension(ext, cap)
        _extensions[cap] = ext
    return _extensions[cap]


def extension_mismatch(ext: ModuleType, capability: tuple[int, int]) -> Optional[str]:
    """What the extension publishes that this package's copy disagrees with, or None: its launch
    fields (`LaunchParams`), its variant table (name, id, rows per CTA: `launch_plan.VARIANTS` /
    `BLOCK_M`, and every variant a device of `capability` runs) and its limits (`BLOCK_N`,
    `MAX_SPLITS`)."""
    fields = tuple(getattr(ext, "launch_fields", ()))
    if fields != LaunchParams._fields:
        return f"it takes launch fields {fields}, kdtree.kernels.cuda_op.LaunchParams has {LaunchParams._fields}"
    for name, mine in (("block_n", BLOCK_N), ("max_splits", MAX_SPLITS)):
        theirs = getattr(ext, name, None)
        if theirs != mine:
            return f"its {name} is {theirs!r}, kdtree.kernels.launch_plan's is {mine}"
    published = {}
    for row in getattr(ext, "variants", ()):
        name, variant_id, block_m = row[0], row[1], row[2]
        published[name] = (variant_id, block_m)
        if VARIANTS.get(name) != variant_id or BLOCK_M.get(variant_id) != block_m:
            return (f"its variant {name!r} is id {variant_id} with {block_m} rows per CTA, kdtree.kernels.launch_plan "
                    f"has id {VARIANTS.get(name)} with {BLOCK_M.get(VARIANTS.get(name))} rows")
    missing = [name for name in runnable_variants(capability) if name not in published]
    if missing:
        return f"it has no variant {', '.join(missing)} (it has {sorted(published)}), which compute capability " \
               f"{capability[0]}.{capability[1]} runs"
    return None


def check_extension(ext: ModuleType, capability: tuple[int, int]) -> None:
    """Raise RuntimeError when the extension and this package disagree (`extension_mismatch`):
    it was built from other sources than the ones beside this module."""
    why = extension_mismatch(ext, capability)
    if why is not None:
        raise RuntimeError(f"the loaded extension ({getattr(ext, '__file__', ext)}) does not match "
                           f"kdtree.kernels: {why}; it was built from other sources: clear the JIT cache "
                           "($KDTREE_CACHE_DIR) so that it is built again")


def _workspace(device_index: int, device: torch.device):
    if device_index not in _workspaces:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("tree_verify_mla: call it once before CUDA-graph capture so that its "
                               "split workspace exists (it is allocated on the first call per device)")
        _workspaces[device_index] = (
            torch.empty(WORKSPACE_ROWS, LATENT_DIM, dtype=torch.float32, device=device),
            torch.empty(WORKSPACE_ROWS, dtype=torch.float32, device=device),
        )
    return _workspaces[device_index]


def device_state(index: int) -> DeviceState:
    """The launch facts of CUDA device `index`: built (extension, workspace) on first use, then cached."""
    state = _device_states.get(index)
    if state is None:
        device = torch.device("cuda", index)
        facts = device_facts(index)
        ext = _extension(index)
        ws_o, ws_lse = _workspace(index, device)
        state = _device_states[index] = DeviceState(index, facts.sm_count, facts.capability, ext,
                                                    (ws_o.data_ptr(), ws_lse.data_ptr()), _raw_stream_getter(),
                                                    facts.shared_memory_per_block_optin)
    return state


def cached_plan(problem: Problem, num_kv: int, state: DeviceState) -> LaunchPlan:
    """`launch_plan.plan` for this call on ``state``'s device, memoised on all it reads: the shapes
    and the device's facts."""
    facts = state.facts
    key = (problem.num_rows, problem.num_heads, problem.batch, problem.mask_words, num_kv, facts)
    made = _plans.get(key)
    if made is None:
        made = plan(problem.num_rows, problem.num_heads, problem.batch, problem.mask_words, num_kv, facts)
        if len(_plans) >= _PLAN_CACHE_SIZE:
            _plans.clear()
        _plans[key] = made
    return made


def launch_args(problem: Problem, q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor,
                kv_indptr: torch.Tensor, kv_indices: Optional[torch.Tensor], tree_mask: torch.Tensor, sm_scale: float,
                out: torch.Tensor, lse: Optional[torch.Tensor], state: DeviceState,
                plan: Optional[LaunchPlan] = None, kv_runs: Optional[KVRuns] = None) -> LaunchParams:
    """The `LaunchParams` of `state.ext.run` for a validated call (pointers, sizes, plan, stream):
    the indices path, or with `kv_runs` the runs path (kv_indices unused, the run pointers set).
    ``plan`` (checked by the caller) is run as it is; None: the memoised plan of these shapes."""
    if kv_runs is None:
        kv_layout = (kv_indices.data_ptr(), 0, 0, 0)
        num_kv = kv_indices.numel()
    else:
        kv_layout = (0, kv_runs.indptr.data_ptr(), kv_runs.start.data_ptr(), kv_runs.pos.data_ptr())
        num_kv = kv_runs.num_kv
    if plan is None:
        plan = cached_plan(problem, num_kv, state)
    ws_o, ws_lse = state.workspace_ptrs
    # tuple.__new__: the named constructor's argument binding would cost more than the rest of this
    return _new_params(LaunchParams, (
        q.data_ptr(), kv_cache.data_ptr(), qo_indptr.data_ptr(), kv_indptr.data_ptr(), kv_layout[0],
        tree_mask.data_ptr(), out.data_ptr(), lse.data_ptr() if lse is not None else 0, ws_o, ws_lse,
        problem.num_rows * problem.num_heads, problem.num_heads, problem.batch, problem.mask_words,
        plan.num_splits, plan.grid_y, plan.variant, float(sm_scale), state.stream(state.index),
        kv_layout[1], kv_layout[2], kv_layout[3]))


_new_params = tuple.__new__


def _run(state: DeviceState, params: LaunchParams) -> None:
    if state.index == _current_device():
        state.ext.run(params)
    else:
        with torch.cuda.device(state.index):
            state.ext.run(params)


def check_plan(plan: LaunchPlan, problem: Problem, state: DeviceState) -> None:
    """Raise ValueError unless `plan` was made for this call's shapes and device (`LaunchPlan.mismatch`)."""
    if not isinstance(plan, LaunchPlan):
        raise ValueError(f"plan: expected a kdtree.kernels.LaunchPlan (kdtree.kernels.plan / plan_bucket), "
                         f"got {type(plan).__name__}")
    why = plan.mismatch(problem.num_rows, problem.num_heads, problem.batch, problem.mask_words, state.facts)
    if why is not None:
        raise ValueError(f"plan: {why} (device {state.index}); make the plan for this call's shapes on this "
                         f"device: {plan!r}")


def launch(q: torch.Tensor, kv_cache: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
           kv_indices: torch.Tensor, tree_mask: torch.Tensor, sm_scale: float, *,
           out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None,
           plan: Optional[LaunchPlan] = None, padded_rows: bool = False,
           kv_runs: Optional[KVRuns] = None) -> torch.Tensor:
    """The op contract with the launch plan open: ``plan`` (`kdtree.kernels.plan` /
    `plan_bucket`, where a variant or split count is forced) is run as it is, after a check that
    it was made for this call's shapes (q rows, heads, requests, mask words) and device (a
    ValueError naming what differs otherwise); without one, the plan is made from the shapes.

    ``padded_rows`` (CUDA-graph buckets, `launch_plan.plan_bucket`): q may have rows past
    ``qo_indptr[B]`` that no request owns. With several splits the combine pass would merge
    their never-written partials; their partial lse is cleared first, so those rows come out
    0 (lse -inf). With one split the kernel leaves them as the caller set them.

    ``kv_runs`` (`kdtree.kernels.runs.KVRuns`, with ``kv_indices=None``): the kernel reads each
    request's slots as (first slot, first key) runs instead of one id per key.

    Never synchronises the device; after the first call on a device it allocates nothing but
    `out`, and only when none is passed.
    """
    problem = validate(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, out, lse,
                       kv_runs=kv_runs)
    if not q.is_cuda:
        raise ValueError(f"q: the CUDA kernel needs CUDA tensors, got a tensor on {q.device} "
                         "(use kdtree.kernels.reference or .naive on the CPU)")
    state = device_state(q.get_device())
    if plan is None:
        num_kv = kv_indices.numel() if kv_runs is None else kv_runs.num_kv
        plan = cached_plan(problem, num_kv, state)
    else:
        check_plan(plan, problem, state)
    if out is None:
        out = torch.empty(problem.num_rows, problem.num_heads, LATENT_DIM, dtype=q.dtype, device=q.device)
    if padded_rows and plan.num_splits > 1:
        _workspaces[state.index][1][: plan.num_splits * problem.num_rows * problem.num_heads].fill_(float("-inf"))
    _run(state, launch_args(problem, q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale,
                            out, lse, state, plan, kv_runs))
    return out
