"""Run-length KV metadata (`kdtree.kernels.runs`) and the kernel path that reads it.

On the CPU: the runs of a batch, built from slot lists or from kv_indices, expand back to exactly
those indices (property test); bad metadata gets a message naming what is wrong; the launch
arguments carry the run pointers. On a GPU: every variant, with one and three KV splits, gives
bit-for-bit the output of the same call with kv_indices, on defragmented, mixed and fully
fragmented layouts (the accuracy suite also runs the runs path against the fp64 oracle, as
``cuda-runs*``), and a run pointing one slot off changes the output.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kdtree.bench.cases import case_args, make_case
from kdtree.bench.forced import forced_kernel
from kdtree.kernels import cuda_op
from kdtree.kernels.contract import validate
from kdtree.kernels.runs import KVRuns, expand, runs_from_indices, runs_from_run_lists, runs_from_slot_lists
from kdtree.bench.host_path import fake_state

REQUESTS = [(5, 30), (1, 0), (40, 7), (33, 64)]
H = 3


def _layout(sizes: list[int], kind: str, rng: random.Random, pool: int) -> list[list[int]]:
    """Slot lists of the given sizes: one run each (defragmented), a few runs each (mixed: a
    contiguous prefix and scattered tree slots), or every slot scattered (fragmented)."""
    free = list(range(pool))
    rng.shuffle(free)
    out, base = [], 0
    for n in sizes:
        if kind == "defragmented":
            out.append(list(range(pool - base - n, pool - base)))
            base += n
        elif kind == "mixed":
            head = n - min(n, 20)
            start = pool - base - head
            base += head
            out.append(list(range(start, start + head)) + [free.pop() for _ in range(n - head)])
        else:
            out.append([free.pop() for _ in range(n)])
    return out


def _batch(slot_lists, device="cpu"):
    kv_indptr = torch.tensor([0] + list(torch.tensor([len(s) for s in slot_lists]).cumsum(0)), dtype=torch.int32)
    kv_indices = torch.tensor([s for slots in slot_lists for s in slots], dtype=torch.int32)
    return kv_indptr.to(device), kv_indices.to(device)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 60), min_size=0, max_size=40), min_size=1, max_size=6),
       st.integers(0, 2**31 - 1))
def test_runs_expand_back_to_the_indices(raw, seed):
    rng = random.Random(seed)
    slot_lists = []
    for slots in raw:  # runs of random length: start + a few consecutive slots
        seq = []
        for s in slots:
            seq.extend(range(s * 8, s * 8 + rng.randint(1, 5)))
        slot_lists.append(seq)
    kv_indptr, kv_indices = _batch(slot_lists)
    from_lists = runs_from_slot_lists(slot_lists)
    from_indices = runs_from_indices(kv_indptr, kv_indices)
    # the engine's (start, length) runs, cut at random points: adjacent pieces merge back
    run_lists = [[(s, 1) for s in seq] if rng.random() < 0.5 or not seq else
                 [(seq[a], b - a) for a, b in zip([0] + cuts, cuts + [len(seq)])]
                 for seq in slot_lists
                 for cuts in [[j for j in range(1, len(seq)) if seq[j] != seq[j - 1] + 1 or rng.random() < 0.2]]]
    from_runs = runs_from_run_lists(run_lists)
    for a, b, c in zip(from_lists[:3], from_indices[:3], from_runs[:3]):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert from_runs.num_kv == kv_indices.numel()
    assert from_lists.num_kv == from_indices.num_kv == kv_indices.numel()
    assert torch.equal(expand(from_lists, kv_indptr), kv_indices)
    ends = [0] + [len([1 for j, s in enumerate(seq) if j == 0 or s != seq[j - 1] + 1]) for seq in slot_lists]
    assert from_lists.num_runs == sum(ends)


def test_a_defragmented_request_is_one_run_and_its_metadata_shrinks():
    runs = runs_from_slot_lists([list(range(100, 32868)), [5, 6, 7, 9]])
    assert runs.indptr.tolist() == [0, 1, 3]
    assert runs.start.tolist() == [100, 5, 9] and runs.pos.tolist() == [0, 0, 3]
    assert runs.metadata_bytes() == 4 * (2 * 3 + 3)


def _runs_case():
    case = make_case(H, REQUESTS, "random", 7, device="cpu")
    runs = runs_from_indices(case["kv_indptr"], case["kv_indices"])
    return case, runs


def _args(case, runs):
    args = list(case_args(case))
    args[4] = None
    return args, dict(kv_runs=runs)


def _broken(runs: KVRuns, **tensors) -> KVRuns:
    return runs._replace(**{k: torch.tensor(v, dtype=torch.int32) if isinstance(v, list) else v
                            for k, v in tensors.items()})


def test_validation_accepts_good_runs_and_names_what_is_wrong():
    case, runs = _runs_case()
    args, kw = _args(case, runs)
    assert validate(*args, **kw) == validate(*case_args(case))
    first = runs.indptr[1].item()
    bad_pos = runs.pos.clone()
    bad_pos[0] = 1
    late = runs.pos.clone()
    late[first - 1] = 10_000
    outside = runs.start.clone()
    outside[0] = case["kv_cache"].shape[0]  # a one-key run one past the last slot
    cases = {
        "kv_indices: pass kv_indices or kv_runs, not both": dict(kv=case["kv_indices"]),
        "kv_runs.start: dtype must be one of": dict(runs=_broken(runs, start=runs.start.long())),
        "kv_runs: start has": dict(runs=_broken(runs, pos=runs.pos[:-1].contiguous())),
        "kv_runs: num_kv must be a non-negative int": dict(runs=runs._replace(num_kv=-1)),
        f"kv_indptr: ends at {runs.num_kv} but kv_runs.num_kv is {runs.num_kv - 1}":
            dict(runs=runs._replace(num_kv=runs.num_kv - 1)),
        "kv_runs: indptr has 3 entries": dict(runs=_broken(runs, indptr=runs.indptr[:3].contiguous())),
        "kv_runs: request 0's first run starts at key 1, not 0": dict(runs=_broken(runs, pos=bad_pos)),
        "kv_runs: request 0's run positions must increase": dict(runs=_broken(runs, pos=late)),
        "kv_runs: request 0 has a run outside the pool": dict(runs=_broken(runs, start=outside)),
    }
    for message, change in cases.items():
        a = list(args)
        if "kv" in change:
            a[4] = change["kv"]
        with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
            validate(*a, kv_runs=change.get("runs", runs))


def test_a_request_without_runs_is_refused():
    case, runs = _runs_case()
    args, _ = _args(case, runs)
    indptr = runs.indptr.clone()
    indptr[1] = 0  # request 0's runs handed to request 1
    with pytest.raises(ValueError, match=r"^kv_runs: request 0 has 35 keys but 0 runs"):
        validate(*args, kv_runs=_broken(runs, indptr=indptr))


def test_launch_args_carry_the_run_pointers_and_plan_from_num_kv(monkeypatch):
    case, runs = _runs_case()
    out = torch.empty(79, H, 512, dtype=torch.bfloat16)
    state = fake_state(sm_count=132, capability=(9, 0))
    args, kw = _args(case, runs)
    problem = validate(*args, **kw)
    got = cuda_op.launch_args(problem, *args, out, None, state, kv_runs=runs)
    plain = cuda_op.launch_args(problem, *case_args(case), out, None, state)
    assert len(plain) == len(got) == len(cuda_op.LaunchParams._fields)
    assert got.kv_indices == 0 and got[:4] == plain[:4] and got[5:19] == plain[5:19]
    assert (got.kv_run_indptr, got.kv_run_start, got.kv_run_pos) == \
        (runs.indptr.data_ptr(), runs.start.data_ptr(), runs.pos.data_ptr())
    assert plain.kv_indices == case["kv_indices"].data_ptr()
    assert (plain.kv_run_indptr, plain.kv_run_start, plain.kv_run_pos) == (0, 0, 0)
    calls = []
    ext = type("Ext", (), {"run": lambda self, params: calls.append(params)})()
    state = state._replace(ext=ext, index=0)
    monkeypatch.setattr(cuda_op, "_current_device", lambda: 0)
    cuda_op._run(state, plain)
    cuda_op._run(state, got)
    assert calls == [plain, got]  # one entry point: the parameters say which KV layout


# --- on a GPU: the runs path gives the indices path's output, bit for bit ----------------------

VARIANTS = ["base16", "base32", "ws", "wgmma"]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["defragmented", "mixed", "fragmented"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("splits", [1, 3])
def test_runs_path_matches_the_indices_path_bitwise(kind, variant, splits):
    from kdtree.kernels.launch_plan import runnable_variants  # noqa: PLC0415

    if variant not in runnable_variants(torch.cuda.get_device_capability()):
        pytest.skip(f"variant {variant} does not run on this GPU")
    rng = random.Random(f"{kind}/{variant}/{splits}")
    reqs = [(16, 3000), (64, 700), (1, 129), (33, 64)]
    slot_lists = _layout([t + ell for t, ell in reqs], kind, rng, pool=8192)
    case = make_case(16, reqs, "random", rng.randrange(2**31), pool_slots=8192, device="cuda")
    case["kv_indptr"], case["kv_indices"] = _batch(slot_lists, "cuda")
    runs = runs_from_slot_lists(slot_lists, "cuda")
    want = {"defragmented": len(reqs), "fragmented": None}.get(kind)
    if want is not None:
        assert runs.num_runs == want
    outs = []
    for kv_runs in (None, runs):
        out = torch.full((case["q"].shape[0], 16, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        lse = torch.full((case["q"].shape[0], 16), float("nan"), dtype=torch.float32, device="cuda")
        args = list(case_args(case))
        if kv_runs is not None:
            args[4] = None
        forced_kernel(variant, splits)(*args, out=out, lse=lse, kv_runs=kv_runs)
        outs.append((out, lse))
    assert not torch.isnan(outs[1][0]).any() and not torch.isnan(outs[1][1]).any()
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.gpu
def test_a_run_one_slot_off_changes_the_output():
    rng = random.Random(3)
    reqs = [(16, 2000)]
    slot_lists = _layout([2016], "defragmented", rng, pool=4096)
    case = make_case(8, reqs, "random", 5, pool_slots=4096, device="cuda")
    case["kv_indptr"], case["kv_indices"] = _batch(slot_lists, "cuda")
    runs = runs_from_slot_lists(slot_lists, "cuda")
    args = list(case_args(case))
    args[4] = None
    good = cuda_op.launch(*args, kv_runs=runs)
    shifted = cuda_op.launch(*args, kv_runs=runs._replace(start=runs.start - 1))
    assert torch.equal(good, cuda_op.launch(*case_args(case)))
    assert not torch.equal(good, shifted)
