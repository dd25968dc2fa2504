"""What a CUDA graph capture forbids, found on the CPU: a graph body run on storage-less tensors.

A capture fails (or silently freezes a value) when its body copies pageable host memory to the
device, reads a device value back on the host (``.item()``, ``.tolist()``, a Python ``if`` on a
tensor, a device-to-host copy) or runs an operation whose output shape depends on device data
(``nonzero``, boolean-mask indexing). A plain Python scalar written into a CUDA tensor by index
(``t[i] = False``) is the first kind: torch makes a host tensor of it and copies it over.

`capture_hazards(body)` runs ``body`` under torch's `FakeTensorMode` (tensors with shapes and
dtypes but no storage) and records every such operation with the line of project code that
issued it. `fake_device` enters the fake mode and gives the device the body's inputs go to
(``model.to(dev)``, ``torch.empty(..., device=dev)``): the ``meta`` device stands in for the GPU,
because a torch built without CUDA (the CPU wheel CI installs) cannot fake CUDA tensors' views.
Every copy between the host and that device, every value read back and every data-dependent
shape is recorded from torch's dispatcher; the two host-side entries that bypass it, a Python
scalar written by index and ``torch.tensor(data, device=...)``, are checked where they are called.
Kernels that need real device pointers (the CUDA extension, Triton launches) have to be stubbed by
the caller: the check covers the torch code around them, which is where host copies and syncs hide.
"""

from __future__ import annotations

import numbers
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
HOST_TO_DEVICE = "host-to-device copy"


class CaptureHazard(NamedTuple):
    """One forbidden operation: what it is, the op, the project line that issued it."""

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


def _on_device(t: torch.Tensor) -> bool:
    return t.device.type != "cpu"


def _copy_direction(func, args, kwargs) -> str:
    if func is _ATEN.copy_.default:
        dst, src = args[0].device.type, args[1].device.type
    else:
        src = args[0].device.type
        dst = torch.device(kwargs["device"]).type if kwargs.get("device") is not None else src
    if src == "cpu" and dst != "cpu":
        return HOST_TO_DEVICE
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
            self.note(_copy_direction(func, args, kwargs), func.overloadpacket.__name__)
        try:
            return func(*args, **kwargs)
        except DynamicOutputShapeException:
            self.note_if_on_device("data-dependent shape", func, args, kwargs)
            raise
        except DataDependentOutputException:
            self.note_if_on_device("host sync", func, args, kwargs)
            raise

    def note(self, kind: str, op: str) -> None:
        if kind:
            self.hazards.append(CaptureHazard(kind, op, _caller()))

    def note_if_on_device(self, kind: str, func, args, kwargs) -> None:
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if not tensors or any(map(_on_device, tensors)):
            self.note(kind, func.overloadpacket.__name__)


@contextmanager
def _host_entries_checked(detector: _HazardMode) -> Iterator[None]:
    """Tensor.__setitem__ with a Python scalar and torch.tensor onto a device, noted as copies."""
    setitem, tensor = torch.Tensor.__setitem__, torch.tensor

    def checked_setitem(self, index, value):
        if isinstance(value, numbers.Number) and _on_device(self):  # bool is a Number too
            detector.note(HOST_TO_DEVICE, "setitem of a Python scalar")
        return setitem(self, index, value)

    def checked_tensor(data, *args, **kwargs):
        device = kwargs.get("device")
        if device is not None and torch.device(device).type != "cpu":
            detector.note(HOST_TO_DEVICE, "torch.tensor onto a device")
        return tensor(data, *args, **kwargs)

    torch.Tensor.__setitem__, torch.tensor = checked_setitem, checked_tensor
    try:
        yield
    finally:
        torch.Tensor.__setitem__, torch.tensor = setitem, tensor


@contextmanager
def fake_device() -> Iterator[torch.device]:
    """Enter the fake mode; yields the device standing in for the GPU (module docstring)."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        yield torch.device("meta")


def capture_hazards(body: Callable[[], object]) -> list[CaptureHazard]:
    """Every operation ``body`` issues that a CUDA graph capture forbids (module docstring), in
    order; ``body`` runs inside `fake_device` (enter it first to build the inputs). A value the
    body reads back ends the walk there (a fake tensor has none to give): that read is the last
    hazard. Any other exception of the body propagates."""
    detector = _HazardMode()
    try:
        with _host_entries_checked(detector), detector:
            body()
    except (DataDependentOutputException, DynamicOutputShapeException):
        if not detector.hazards:
            raise
    return detector.hazards
