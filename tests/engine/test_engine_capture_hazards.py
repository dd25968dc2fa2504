"""`kdtree.engine.decode.capture_hazards` on the CPU: each kind of operation a CUDA graph capture
forbids is found with the line that issued it, and the graph bodies the decode benchmark captures
(verify and draft decode passes, on the kernel's bucket backend and on SGLang's Triton backend)
issue none. Phase 2's first H100 run of the graph decode failed in capture on a Python scalar
written into the Triton backend's verify mask: the Triton case here is that run, without the GPU."""

from __future__ import annotations

import pytest
import torch

from kdtree.bench.decode_triton import SGLangTritonBackend
from kdtree.engine import build_model, preset
from kdtree.engine.decode.capture_hazards import capture_hazards, fake_device
from kdtree.engine.decode.graph_capture import BucketKernelBackend, Bucket, stage_values, verify_body


def kinds(hazards):
    return [(h.kind, h.op) for h in hazards]


def test_each_forbidden_operation_is_found_with_its_line():
    with fake_device() as dev:
        mask = torch.ones(10, dtype=torch.bool, device=dev)
        x = torch.arange(5, device=dev)

        def body():
            mask[9] = False
            x.cpu()
            torch.tensor([1, 2]).to(dev)
            torch.tensor([3], device=dev)
            x.copy_(torch.arange(5))
            if mask.any():
                pass

        hazards = capture_hazards(body)
    assert kinds(hazards) == [("host-to-device copy", "setitem of a Python scalar"),
                              ("device-to-host copy", "_to_copy"), ("host-to-device copy", "_to_copy"),
                              ("host-to-device copy", "torch.tensor onto a device"),
                              ("host-to-device copy", "copy_"), ("host sync", "_local_scalar_dense")]
    assert "test_engine_capture_hazards.py" in hazards[0].where and "mask[9] = False" in hazards[0].where
    assert "if mask.any()" in str(hazards[-1])


def test_a_data_dependent_shape_ends_the_walk_as_its_last_hazard():
    with fake_device() as dev:
        mask = torch.ones(10, dtype=torch.bool, device=dev)
        hazards = capture_hazards(lambda: (mask[mask], mask.cpu()))
    assert kinds(hazards) == [("data-dependent shape", "index")]


def test_device_only_work_has_no_hazard_and_other_errors_propagate():
    with fake_device() as dev:
        mask = torch.ones(10, dtype=torch.bool, device=dev)
        x = torch.arange(5, device=dev)
        host = torch.ones(3)
        host[0] = 2.0  # host tensors are the host's business
        assert capture_hazards(lambda: (mask[9:].zero_(), torch.searchsorted(x, x), x + 1, mask.sum(),
                                        host.__setitem__(1, 3.0), torch.tensor([1.0]))) == []
        with pytest.raises(ZeroDivisionError):
            capture_hazards(lambda: 1 / 0)


def _no_op_kernel(*args, **kwargs):
    return None


def _kernel_launch_stub(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, *, out, **kwargs):
    return out


def graph_body_hazards(bucket: Bucket, attention, mode: str = "verify"):
    """`capture_hazards` of `verify_body` over a bucket's static buffers, the tiny model on the fake
    device (built on the CPU first: its initialisation reads values a fake tensor does not have)."""
    model = build_model(preset("tiny"), seed=0)
    slots = 512
    with fake_device() as dev:
        model = model.to(dev)
        cfg = model.config
        kv = [torch.empty(slots, 576, device=dev, dtype=model.dtype) for _ in range(cfg.num_layers)]
        stage = torch.tensor(stage_values(bucket, [], [], [], slots - 1)[0], dtype=torch.int64).to(dev)
        kv_indices = torch.zeros(bucket.kv_capacity, dtype=torch.int32, device=dev)
        logits = torch.empty(bucket.rows, cfg.vocab_size, device=dev)
        layers = 2 if mode == "decode" else None
        return capture_hazards(lambda: verify_body(model, kv, bucket, attention, stage, kv_indices, logits,
                                                   num_layers=layers, mode=mode))


@pytest.mark.parametrize("mode", ["verify", "decode"])
@pytest.mark.parametrize("backend", ["kernel", "sglang-triton"])
def test_the_decode_benchmarks_graph_bodies_are_capturable(monkeypatch, backend, mode):
    monkeypatch.setattr("kdtree.kernels.cuda_op.launch", _kernel_launch_stub)
    attention = (BucketKernelBackend(plan=None) if backend == "kernel"
                 else SGLangTritonBackend(kernels=(_no_op_kernel, _no_op_kernel)))
    hazards = graph_body_hazards(Bucket(4, 8 if mode == "verify" else 1, 64), attention, mode)
    assert hazards == [], "\n".join(map(str, hazards))


def test_the_triton_verify_mask_written_by_a_python_scalar_is_found(monkeypatch):
    """The bug phase 2's first graph run hit, put back: the detector names its line."""
    import kdtree.bench.decode_triton as dt

    real_layout = dt.sglang_verify_layout

    def layout_with_scalar_write(meta, rows, with_mask=True):
        lay = real_layout(meta, rows, with_mask)
        lay.custom_mask[lay.custom_mask.numel() - 1] = False
        return lay

    monkeypatch.setattr(dt, "sglang_verify_layout", layout_with_scalar_write)
    hazards = graph_body_hazards(Bucket(2, 4, 32), SGLangTritonBackend(kernels=(_no_op_kernel, _no_op_kernel)))
    assert kinds(hazards) == [("host-to-device copy", "setitem of a Python scalar")]
    assert "lay.custom_mask[lay.custom_mask.numel() - 1] = False" in hazards[0].where


class _HostSlots:
    """A pool's slot bookkeeping, on the host as the real one is (numpy: a fake mode has no CPU values)."""

    def __init__(self):
        self.next, self.freed = 0, []

    def alloc(self, n):
        import numpy as np

        self.next += n
        return np.arange(self.next - n, self.next)

    def free(self, slots):
        self.freed.extend(slots)


class _FakeDeviceDraftRunner:
    """What `SelfDraftDrafter.depth_logprobs` uses of a runner, its tensors on the fake device: a
    pass's logits are a lookup of its tokens, so nothing but the drafter's loop issues host work."""

    def __init__(self, config, dev):
        from types import SimpleNamespace

        self.model, self.pool, self.dev = SimpleNamespace(config=config, device=dev), _HostSlots(), dev
        self.table = torch.randn(config.vocab_size, config.vocab_size, device=dev)

    def prefix(self, rid):
        return torch.zeros(100 + rid, dtype=torch.int32, device=self.dev)

    def draft_logits(self, contexts, tokens, slots, num_layers):
        if not isinstance(tokens, torch.Tensor):
            tokens = torch.tensor(tokens).to(self.dev)
        return self.table[tokens]


@pytest.mark.parametrize("drafter_name", ["ddtree", "selfdraft"])
def test_the_draft_passes_never_wait_for_the_device(drafter_name, tiny_model):
    """Between a step's first draft pass and the tree built from all of them the host reads
    nothing back, so it queues every pass while the GPU runs the first (graph decode's host time)."""
    from kdtree.engine.decode.drafters import get_drafter
    from kdtree.engine.decode.speculative import Request
    drafter = get_drafter(drafter_name)
    requests = [Request(b, [1], 10, output=[3 + b]) for b in range(2)]
    with fake_device() as dev:
        runner = _FakeDeviceDraftRunner(tiny_model.config, dev)
        hazards = capture_hazards(lambda: drafter.depth_logprobs(requests, drafter.passes(16), runner))
    waits = [h for h in hazards if h.kind != "host-to-device copy"]
    assert drafter.passes(16) > 1 and waits == [], "\n".join(map(str, waits))
    assert len(runner.pool.freed) == 2 * drafter.passes(16)  # it ran every pass
