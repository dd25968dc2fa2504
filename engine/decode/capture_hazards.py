"""What a CUDA graph capture forbids, found on the CPU: a graph body run on fake CUDA tensors.

A capture fails (or silently freezes a value) when its body copies pageable host memory to the
device, reads a device value back on the host (``.item()``, ``.tolist()``, a Python ``if`` on a
tensor, a device-to-host copy) or runs an operation whose output shape depends on device data
(``nonzero``, boolean-mask indexing). A plain Python scalar written into a device tensor
(``t[i] = False``) is the first kind: torch makes a host tensor of it and copies it over.

`capture_hazards(body)` runs ``body`` under torch's `FakeTensorMode` (tensors with shapes,
dtypes and devices but no storage, so "cuda" tensors exist on a machine without a GPU) and a
dispatch mode that records every such operation with the line of project code that issued it.
`fake_cuda` is the fake mode the body's inputs are made under (``model.to("cuda")``,
``torch.empty(..., device="cuda")``). Kernels that need real device pointers (the CUDA
extension, Triton launches) have to be stubbed by the caller: the check covers the torch code
around them, which is where host copies and syncs hide.
"""

from __future__ import annotations

import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_ROOT = str(Path(__file__).resolve().parents[2])
_ATEN = torch.ops.aten
_COPIES = (_ATEN.copy_.default, _ATEN._to_copy.default)


class CaptureHazard(NamedTuple):
    """One forbidden operation: what it is, the aten op, the project line that issued it."""

    kind: str  # "host-to-device copy", "device-to-host copy", "host sync", "data-dependent shape"
    op: str
    where: str

    def __str__(self) -> str:
        return f"{self.kind} ({self.op}) at {self.where}"


def _caller() -> str:
    frames = [f for f in traceback.extract_stack()
              if f.filename.startswith(_ROOT) and "site-packages" not in f.filename
              and f.filename != __file__]
    if not frames:
        return "<outside the project>"
    f = frames[-1]
    return f"{Path(f.filename).relative_to(_ROOT)}:{f.lineno}: {f.line}"


def _copy_direction(func, args, kwargs) -> str:
    if func is _ATEN.copy_.default:
        dst, src = args[0].device.type, args[1].device.type
    else:
        src = args[0].device.type
        dst = torch.device(kwargs["device"]).type if kwargs.get("device") is not None else src
    if src == "cpu" and dst != "cpu":
        return "host-to-device copy"
    if src != "cpu" and dst == "cpu":
        return "device-to-host copy"
    return ""


class _HazardMode(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.hazards: list[CaptureHazard] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _COPIES:
            self._note(_copy_direction(func, args, kwargs), func)
        try:
            return func(*args, **kwargs)
        except DynamicOutputShapeException:
            self._note("data-dependent shape", func, args, kwargs)
            raise
        except DataDependentOutputException:
            self._note("host sync", func, args, kwargs)
            raise

    def _note(self, kind: str, func, args=(), kwargs=None) -> None:
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if kind and (not tensors or any(t.device.type != "cpu" for t in tensors)):
            self.hazards.append(CaptureHazard(kind, str(func.overloadpacket.__name__), _caller()))


@contextmanager
def fake_cuda() -> Iterator[FakeTensorMode]:
    """The fake mode a body's inputs are built under: ``torch.empty(..., device="cuda")`` and
    ``module.to("cuda")`` give storage-less CUDA tensors, on any machine."""
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        yield mode


def capture_hazards(body: Callable[[], object]) -> list[CaptureHazard]:
    """Every operation ``body`` issues that a CUDA graph capture forbids (module docstring), in
    order; ``body`` runs under `fake_cuda` (enter it first to build the inputs). A value the body
    reads back ends the walk there (a fake tensor has none to give): that read is the last hazard.
    Any other exception of the body propagates."""
    detector = _HazardMode()
    try:
        with detector:
            body()
    except (DataDependentOutputException, DynamicOutputShapeException):
        if not detector.hazards:
            raise
    return detector.hazards
