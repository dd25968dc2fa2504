"""The host path of `cuda_op.launch`: validation messages, the launch-parameter builder, the
memoised plan (keyed on the shapes and the device's facts), a held plan's checks, the per-device
state and the multi-device branch. CPU tensors and a fake extension stand in for the GPU, except where marked."""

from __future__ import annotations

import pytest
import torch

from kdtree.bench.cases import case_args, make_case
from kdtree.kernels import cuda_op, launch_plan
from kdtree.kernels.contract import validate
from kdtree.kernels.device_facts import DeviceFacts
from kdtree.bench.host_path import FakeExtension, fake_state, host_call

REQUESTS = [(5, 30), (1, 0), (40, 7), (33, 64)]  # Nq = 79, B = 4, W = 2
NQ, H = 79, 3


@pytest.fixture(autouse=True)
def _clean_plans(monkeypatch):
    monkeypatch.setattr(cuda_op, "_plans", {})


def _case(device="cpu"):
    return make_case(H, REQUESTS, "random", 7, device=device)


def _outputs(device="cpu"):
    return (torch.empty(NQ, H, 512, dtype=torch.bfloat16, device=device),
            torch.empty(NQ, H, dtype=torch.float32, device=device))


def _drop_own_bit(mask):
    mask = mask.clone()
    mask[3, 0] &= ~(1 << 3)  # row 3 is node 3 of request 0
    return mask


def _expected_plan(case, sm_count=132, capability=(9, 0)):
    return launch_plan.plan(NQ, H, len(REQUESTS), 2, case["kv_indices"].numel(), DeviceFacts(sm_count, capability))


# --- validation: the same messages, shape checks free of value checks on request ---------------

MESSAGES = {
    "q fp16": ({"q": lambda c: c["q"].half()}, "q: dtype must be one of ['torch.bfloat16'], got torch.float16"),
    "q a list": ({"q": lambda c: [1.0]}, "q: expected a torch.Tensor, got list"),
    "q 2-dim": ({"q": lambda c: c["q"][:, 0]}, "q: expected 3 dimensions, got shape (79, 576)"),
    "q 575 wide": ({"q": lambda c: c["q"][..., :575].contiguous()},
                   "q: last dimension must be 576 (512 latent + 64 rope), got 575"),
    "q 129 heads": ({"q": lambda c: c["q"][:, :1].expand(-1, 129, -1).contiguous()},
                    "q: number of heads must be in [1, 128], got 129"),
    "q strided": ({"q": lambda c: c["q"].repeat(1, 2, 1)[:, ::2]}, "q: must be contiguous (call .contiguous())"),
    "kv_cache on meta": ({"kv_cache": lambda c: c["kv_cache"].to("meta")}, "kv_cache: is on meta, but q is on cpu"),
    "kv_cache fp32": ({"kv_cache": lambda c: c["kv_cache"].float()},
                      "kv_cache: dtype must be one of ['torch.bfloat16'], got torch.float32"),
    "kv_cache 512 wide": ({"kv_cache": lambda c: c["kv_cache"][:, :512].contiguous()},
                          "kv_cache: rows must be 576 wide, got 512"),
    "qo_indptr int64": ({"qo_indptr": lambda c: c["qo_indptr"].long()},
                        "qo_indptr: dtype must be one of ['torch.int32'], got torch.int64"),
    "qo_indptr one entry": ({"qo_indptr": lambda c: c["qo_indptr"][:1].contiguous()},
                            "qo_indptr: needs B+1 >= 2 entries"),
    "kv_indptr short": ({"kv_indptr": lambda c: c["kv_indptr"][:-1].contiguous()},
                        "kv_indptr: has 4 entries but qo_indptr has 5 (both B+1)"),
    "tree_mask rows": ({"tree_mask": lambda c: c["tree_mask"][:-1].contiguous()}, "tree_mask: has 78 rows, q has 79"),
    "tree_mask 33 words": ({"tree_mask": lambda c: torch.zeros(NQ, 33, dtype=torch.int32)},
                           "tree_mask: needs 1..32 words per row, got 33"),
    "sm_scale zero": ({"sm_scale": lambda c: 0.0}, "sm_scale: must be a positive float, got 0.0"),
    "out 576 wide": ({"out": lambda c: torch.empty(NQ, H, 576, dtype=torch.bfloat16)},
                     "out: expected shape (79, 3, 512), got (79, 3, 576)"),
    "lse bf16": ({"lse": lambda c: torch.empty(NQ, H, dtype=torch.bfloat16)},
                 "lse: dtype must be one of ['torch.float32'], got torch.bfloat16"),
    "lse shape": ({"lse": lambda c: torch.empty(NQ, H + 1)}, "lse: expected shape (79, 3), got (79, 4)"),
    "kv_indptr decreasing": ({"kv_indptr": lambda c: c["kv_indptr"][[0, 2, 1, 3, 4]].contiguous()},
                             "kv_indptr: must be non-decreasing"),
    "own bit missing": ({"tree_mask": lambda c: _drop_own_bit(c["tree_mask"])},
                        "tree_mask: row 3 does not include its own node (bit t of node t must be set)"),
}


@pytest.mark.parametrize("what", list(MESSAGES))
def test_breach_messages_are_unchanged(what):
    override, message = MESSAGES[what]
    args = dict(_case(), out=None, lse=None)
    args.update({k: fn(args) for k, fn in override.items()})
    with pytest.raises(ValueError) as err:
        validate(**args)
    assert str(err.value) == message


def test_value_checks_follow_check_values():
    case = dict(_case(), tree_mask=_drop_own_bit(_case()["tree_mask"]))
    for check in (None, True):
        with pytest.raises(ValueError, match=r"^tree_mask:"):
            validate(*case_args(case), check_values=check)
    assert validate(*case_args(case), check_values=False) == (NQ, H, len(REQUESTS), 2, case["kv_cache"].shape[0])


def test_cpu_tensors_are_refused_after_validation(monkeypatch):
    monkeypatch.setattr(cuda_op, "device_state", lambda index: pytest.fail("looked up a device for CPU tensors"))
    case = _case()
    with pytest.raises(ValueError, match=r"^q: the CUDA kernel needs CUDA tensors, got a tensor on cpu"):
        cuda_op.launch(*case_args(case))
    case["tree_mask"] = _drop_own_bit(case["tree_mask"])
    with pytest.raises(ValueError, match=r"^tree_mask:"):
        cuda_op.launch(*case_args(case))


# --- the launch arguments ------------------------------------------------------------------------

def test_launch_args_hold_pointers_sizes_plan_and_stream():
    case = _case()
    out, lse = _outputs()
    state = fake_state(sm_count=132, capability=(9, 0))._replace(stream=lambda index: 0xABC + index)
    problem = validate(*case_args(case), out, lse)
    args = cuda_op.launch_args(problem, *case_args(case), out, lse, state)
    plan = _expected_plan(case)
    pointers = tuple(t.data_ptr() for t in (case["q"], case["kv_cache"], case["qo_indptr"], case["kv_indptr"],
                                           case["kv_indices"], case["tree_mask"], out, lse))
    assert isinstance(args, cuda_op.LaunchParams)
    assert args == pointers + (0x1000, 0x2000, NQ * H, H, len(REQUESTS), 2, plan.num_splits, plan.grid_y,
                               plan.variant, case["sm_scale"], 0xABC, 0, 0, 0)  # the indices path: no runs
    assert (args.num_splits, args.grid_y, args.variant, args.stream) == (plan.num_splits, plan.grid_y,
                                                                         plan.variant, 0xABC)
    assert type(args.sm_scale) is float


def test_launch_args_pass_null_lse_and_read_the_stream_every_call():
    case = _case()
    out, _ = _outputs()
    streams = iter(range(100, 200))
    state = fake_state()._replace(index=3, stream=lambda index: (index, next(streams)))
    problem = validate(*case_args(case), out)
    first = cuda_op.launch_args(problem, *case_args(case), out, None, state)
    second = cuda_op.launch_args(problem, *case_args(case), out, None, state)
    assert first.lse == 0 and first.stream == (3, 100) and second.stream == (3, 101)


def test_host_call_allocates_out_only_when_missing():
    case = _case()
    out, lse = _outputs()
    calls = []
    state = fake_state()._replace(ext=type("Ext", (), {"run": lambda self, params: calls.append(tuple(params))})())
    assert host_call(case, state, out, lse) is out
    fresh = host_call(case, state)
    assert fresh.shape == (NQ, H, 512) and fresh.dtype == torch.bfloat16
    assert calls[0][6] == out.data_ptr() and calls[1][6] == fresh.data_ptr() and calls[1][7] == 0


# --- the memoised plan ---------------------------------------------------------------------------

DEVICES = [(132, (9, 0)), (84, (12, 0)), (108, (8, 0))]


def test_cached_plan_is_the_plan_of_the_calls_shapes_on_the_device():
    case = _case()
    problem = validate(*case_args(case))
    num_kv = case["kv_indices"].numel()
    for sms, cap in DEVICES * 2:
        plan = cuda_op.cached_plan(problem, num_kv, fake_state(sms, cap))
        assert plan == launch_plan.plan(NQ, H, len(REQUESTS), 2, num_kv, DeviceFacts(sms, cap))


def test_launch_args_carry_the_forced_plan():
    case = _case()
    out, lse = _outputs()
    problem = validate(*case_args(case), out, lse)
    plan = launch_plan.plan(NQ, H, len(REQUESTS), 2, case["kv_indices"].numel(), DeviceFacts(132, (9, 0)),
                            variant="base16", num_splits=5)
    args = cuda_op.launch_args(problem, *case_args(case), out, lse, fake_state(), plan)
    assert (args.num_splits, args.variant) == (5, launch_plan.VARIANTS["base16"])


def test_launch_args_carry_a_held_plan_as_it_is():
    case = _case()
    out, lse = _outputs()
    problem = validate(*case_args(case), out, lse)
    held = launch_plan.plan(NQ, H, len(REQUESTS), 2, 10 ** 6, DeviceFacts(132, (9, 0)), variant="base32", num_splits=9)
    args = cuda_op.launch_args(problem, *case_args(case), out, lse, fake_state(), held)
    assert (args.num_splits, args.grid_y, args.variant) == (9, held.grid_y, launch_plan.VARIANTS["base32"])
    assert cuda_op._plans == {}  # nothing planned again


def test_cached_plan_is_reused_and_keyed_on_every_argument():
    case = _case()
    problem = validate(*case_args(case))
    n = case["kv_indices"].numel()
    plan = cuda_op.cached_plan(problem, n, fake_state(132, (9, 0)))
    assert cuda_op.cached_plan(problem, n, fake_state(132, (9, 0))) is plan
    for p, kv, sms, cap in [(problem._replace(num_heads=64), n, 132, (9, 0)), (problem, 40 * n, 132, (9, 0)),
                            (problem, n, 16, (9, 0)), (problem, n, 132, (8, 6))]:
        expected = launch_plan.plan(p.num_rows, p.num_heads, p.batch, p.mask_words, kv, DeviceFacts(sms, cap))
        assert cuda_op.cached_plan(p, kv, fake_state(sms, cap)) == expected


def test_plan_cache_stays_bounded(monkeypatch):
    monkeypatch.setattr(cuda_op, "_PLAN_CACHE_SIZE", 4)
    problem = validate(*case_args(_case()))
    for num_kv in range(100, 110):
        cuda_op.cached_plan(problem, num_kv, fake_state())
    assert 1 <= len(cuda_op._plans) <= 4


# --- a held plan: checked against the call, never planned again ------------------------------------

def test_a_held_plan_of_the_calls_shapes_and_device_passes():
    problem = validate(*case_args(_case()))
    state = fake_state(sm_count=132, capability=(9, 0))
    for held in (launch_plan.plan(NQ, H, len(REQUESTS), 2, 5, DeviceFacts(132, (9, 0))),
                 launch_plan.plan(NQ, H, len(REQUESTS), 2, 10 ** 6, DeviceFacts(132, (9, 0), 232448), num_splits=4)):
        cuda_op.check_plan(held, problem, state)
        cuda_op.check_plan(held, problem, state._replace(shared_memory_per_block_optin=232448))


@pytest.mark.parametrize("change,message", [
    (dict(num_rows=NQ + 1), f"made for {NQ + 1} q rows, the call has {NQ}"),
    (dict(num_heads=H + 1), f"made for {H + 1} heads, the call has {H}"),
    (dict(batch=1), "made for 1 requests, the call has 4"),
    (dict(mask_words=1), "made for 1 mask words per row, the call has 2"),
    (dict(device=DeviceFacts(78, (9, 0))),
     "made for sm_90 with 78 SMs, the device is sm_90 with 132 SMs, 232448 B shared memory per block"),
    (dict(device=DeviceFacts(132, (12, 0))),
     "made for sm_120 with 132 SMs, the device is sm_90 with 132 SMs, 232448 B shared memory per block"),
    (dict(device=DeviceFacts(132, (9, 0), 101376)),
     "made for 101376 B shared memory per block, the device offers 232448 B"),
])
def test_a_held_plan_for_other_shapes_or_another_device_is_refused(change, message):
    import dataclasses

    problem = validate(*case_args(_case()))
    state = fake_state(sm_count=132, capability=(9, 0))._replace(index=2, shared_memory_per_block_optin=232448)
    held = dataclasses.replace(launch_plan.plan(NQ, H, len(REQUESTS), 2, 5, DeviceFacts(132, (9, 0))), **change)
    with pytest.raises(ValueError) as err:
        cuda_op.check_plan(held, problem, state)
    assert str(err.value).startswith(f"plan: {message} (device 2); make the plan for this call's shapes")
    assert repr(held) in str(err.value)


def test_a_plan_is_a_launch_plan_and_the_only_way_to_force_choices():
    problem = validate(*case_args(_case()))
    with pytest.raises(ValueError, match=r"^plan: expected a kdtree.kernels.LaunchPlan .*got tuple"):
        cuda_op.check_plan(("ws", 4), problem, fake_state())
    for forced in (dict(variant="ws"), dict(num_splits=2)):
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            cuda_op.launch(*case_args(_case()), **forced)


# --- per-device state and the multi-device branch -------------------------------------------------

def _fake_devices(monkeypatch):
    built = []

    def facts(index):
        built.append(index)
        return DeviceFacts(100 + index, (9, 0), 232448)

    monkeypatch.setattr(cuda_op, "_device_states", {})
    monkeypatch.setattr(cuda_op, "device_facts", facts)
    monkeypatch.setattr(cuda_op, "_extension", lambda index: FakeExtension())
    monkeypatch.setattr(cuda_op, "_workspace", lambda index, device: (torch.empty(2), torch.empty(1)))
    return built


def test_device_state_is_built_once_per_index(monkeypatch):
    built = _fake_devices(monkeypatch)
    first = cuda_op.device_state(1)
    assert cuda_op.device_state(1) is first and (first.index, first.sm_count) == (1, 101)
    assert cuda_op.device_state(0).sm_count == 100 and built == [1, 0]
    assert first.facts == DeviceFacts(101, (9, 0), 232448)


class _RecordingDevice:
    """Stands in for torch.cuda.device: records which device a block switched to."""

    entered: list = []
    current = None

    def __init__(self, index):
        self.index = index

    def __enter__(self):
        _RecordingDevice.entered.append(self.index)
        _RecordingDevice.current = self.index

    def __exit__(self, *exc):
        _RecordingDevice.current = None


@pytest.mark.parametrize("current,index,switched", [(0, 0, []), (0, 1, [1]), (1, 1, []), (1, 0, [0])])
def test_run_switches_device_only_when_needed(monkeypatch, current, index, switched):
    ran_on = []
    ext = type("Ext", (), {"run": lambda self, *a: ran_on.append((_RecordingDevice.current, a))})()
    monkeypatch.setattr(cuda_op, "_current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "device", _RecordingDevice)
    monkeypatch.setattr(_RecordingDevice, "entered", [])
    params = cuda_op.LaunchParams(*range(1, 20))
    cuda_op._run(fake_state()._replace(index=index, ext=ext), params)
    assert _RecordingDevice.entered == switched
    assert ran_on == [(switched[0] if switched else None, (params,))]  # one argument: the parameters struct


def test_raw_stream_getter_prefers_the_fast_form(monkeypatch):
    fast = lambda index: 42  # noqa: E731
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", fast, raising=False)
    assert cuda_op._raw_stream_getter() is fast
    monkeypatch.delattr(torch._C, "_cuda_getCurrentRawStream")
    asked = []
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda index: asked.append(index) or type("S", (), {"cuda_stream": 77})())
    assert cuda_op._raw_stream_getter()(2) == 77 and asked == [2]


# --- on a GPU: the real stream, no allocation, no synchronisation ----------------------------------

@pytest.mark.gpu
def test_gpu_stream_and_device_match_torch():
    case = _case("cuda")
    out, lse = _outputs("cuda")
    state = cuda_op.device_state(torch.cuda.current_device())
    problem = validate(*case_args(case), out, lse)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        args = cuda_op.launch_args(problem, *case_args(case), out, lse, state)
    assert args[-1] == side.cuda_stream != torch.cuda.current_stream().cuda_stream
    assert cuda_op._current_device() == torch.cuda.current_device()
    props = torch.cuda.get_device_properties(state.index)
    assert (state.sm_count, state.capability) == (props.multi_processor_count, (props.major, props.minor))
    assert state.shared_memory_per_block_optin == props.shared_memory_per_block_optin


@pytest.mark.gpu
def test_gpu_held_plan_runs_as_the_public_call_with_it_and_a_foreign_plan_is_refused():
    from kdtree.kernels import tree_verify_mla

    case = _case("cuda")
    out, held_out = _outputs("cuda")[0], torch.empty(NQ, H, 512, dtype=torch.bfloat16, device="cuda")
    held = launch_plan.plan(NQ, H, len(REQUESTS), 2, case["kv_indices"].numel(), num_splits=3)
    tree_verify_mla(*case_args(case), out=out, plan=held)
    cuda_op.launch(*case_args(case), out=held_out, plan=held)
    assert torch.equal(out, held_out)
    other = launch_plan.plan(NQ, H + 1, len(REQUESTS), 2, case["kv_indices"].numel())
    with pytest.raises(ValueError, match=rf"^plan: made for {H + 1} heads, the call has {H}"):
        cuda_op.launch(*case_args(case), plan=other)


@pytest.mark.gpu
def test_gpu_call_with_out_neither_allocates_nor_syncs():
    case = _case("cuda")
    out, lse = _outputs("cuda")
    cuda_op.launch(*case_args(case), out=out, lse=lse)  # warm-up: extension, workspace
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        result = cuda_op.launch(*case_args(case), out=out, lse=lse)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    assert result is out and torch.cuda.memory_allocated() == before
