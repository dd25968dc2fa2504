"""Tensor helpers shared by the gates: poison output buffers, and compare an output with its reference.

Poison is a bit pattern, not just "NaN": floats are filled with a NaN whose payload no arithmetic
produces (arithmetic yields the canonical quiet NaN), so an element still holding the poison after
the candidate ran was never written, and an element holding any other NaN was written as NaN.
Integer outputs are filled with the dtype's most negative value (unsigned: its largest).

torch is imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

# NaN bit patterns with a non-canonical payload, as the signed integer of the same width.
_FLOAT_POISON_BITS = {
    "torch.float64": 0x7FF4DEADBEEF0BAD,
    "torch.float32": 0x7FB0DEAD,
    "torch.float16": 0x7D5A,
    "torch.bfloat16": 0x7FA5,
}
_INT_VIEW = {8: "int64", 4: "int32", 2: "int16"}


def _poison_view(t):
    """(integer view of ``t``, poison value in that view) or (None, None) for a plain NaN fill."""
    import torch  # noqa: PLC0415

    bits = _FLOAT_POISON_BITS.get(str(t.dtype))
    if bits is None:
        return None, None
    return t.view(getattr(torch, _INT_VIEW[t.element_size()])), bits


def poison_value(dtype) -> float | int:
    """The value an integer buffer is poisoned with (floats: NaN)."""
    import torch  # noqa: PLC0415

    if dtype.is_floating_point or dtype.is_complex:
        return math.nan
    if dtype == torch.bool:
        raise ValueError("bool outputs cannot be poisoned (every value is meaningful); use uint8")
    info = torch.iinfo(dtype)
    return info.min if info.min < 0 else info.max


def poison_(t) -> None:
    """Fill ``t`` in place with its dtype's poison (see the module docstring)."""
    view, bits = _poison_view(t)
    if view is not None:
        view.fill_(bits)
    else:
        t.fill_(poison_value(t.dtype))


def poisoned_mask(t):
    """Bool tensor: True where ``t`` still holds the poison pattern.

    For float dtypes without a payload pattern (fp8, ...), any NaN counts as poisoned.
    """
    import torch  # noqa: PLC0415

    view, bits = _poison_view(t)
    if view is not None:
        return view == bits
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return torch.isnan(t)
    return t == poison_value(t.dtype)


def _first_index(mask) -> tuple[int, ...]:
    flat = int(mask.reshape(-1).nonzero()[0, 0])
    idx = []
    for size in reversed(mask.shape):
        idx.append(flat % size)
        flat //= size
    return tuple(reversed(idx))


@dataclass
class Comparison:
    """How one output compares with its reference. ``problems`` is empty iff nothing is wrong
    beyond the numbers (which the caller holds against its tolerances)."""

    name: str
    numel: int
    rel_l2: float  # NaN when some element is unwritten or non-finite
    max_abs: float
    unwritten: int = 0
    first_unwritten: Optional[tuple[int, ...]] = None
    non_finite: int = 0
    first_non_finite: Optional[tuple[int, ...]] = None
    problems: tuple[str, ...] = ()

    def as_row(self) -> dict[str, Any]:
        return {"output": self.name, "rel_l2": _jsonable(self.rel_l2), "max_abs": _jsonable(self.max_abs),
                "unwritten": self.unwritten, "non_finite": self.non_finite,
                "problems": list(self.problems)}


def _jsonable(x: float) -> Optional[float]:
    return None if (x is None or math.isnan(x) or math.isinf(x)) else float(x)


def compare(name: str, out, ref, *, poisoned: bool = True) -> Comparison:
    """Compare ``out`` with ``ref`` (any dtypes; computed in float64 on ``out``'s device).

    Counts elements left poisoned (when ``poisoned``), elements that are NaN/Inf where the
    reference is finite (or a different infinity where it is not), and gives rel-L2
    ``||out - ref|| / ||ref||`` and max-abs over the rest. A NaN in the reference is a broken
    oracle and raises.
    """
    import torch  # noqa: PLC0415

    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"output {name!r}: shape {tuple(out.shape)} but the reference has {tuple(ref.shape)}")
    problems: list[str] = []
    numel = out.numel()
    unwritten_mask = poisoned_mask(out) if poisoned else torch.zeros(out.shape, dtype=torch.bool,
                                                                     device=out.device)
    o = out.detach().to(torch.float64)
    r = ref.detach().to(device=out.device, dtype=torch.float64)
    if bool(torch.isnan(r).any()):
        raise ValueError(f"output {name!r}: the reference (oracle) contains NaN")
    ref_finite = torch.isfinite(r)
    bad = ~unwritten_mask & ((ref_finite & ~torch.isfinite(o)) | (~ref_finite & (o != r)))
    cmp = Comparison(name=name, numel=numel, rel_l2=math.nan, max_abs=math.nan)
    cmp.unwritten = int(unwritten_mask.sum())
    if cmp.unwritten:
        cmp.first_unwritten = _first_index(unwritten_mask)
        problems.append(f"{name}: {cmp.unwritten} of {numel} elements unwritten "
                        f"(still poisoned), first at index {cmp.first_unwritten}")
    cmp.non_finite = int(bad.sum())
    if cmp.non_finite:
        cmp.first_non_finite = _first_index(bad)
        problems.append(f"{name}: {cmp.non_finite} of {numel} elements NaN/Inf where the reference "
                        f"is finite, first at index {cmp.first_non_finite}")
    cmp.problems = tuple(problems)
    if problems:
        return cmp
    diff = torch.where(ref_finite, o - r, torch.zeros_like(o))
    rf = torch.where(ref_finite, r, torch.zeros_like(r))
    num, den = float(torch.linalg.vector_norm(diff)), float(torch.linalg.vector_norm(rf))
    cmp.max_abs = float(diff.abs().max()) if numel else 0.0
    if den == 0.0:
        cmp.rel_l2 = 0.0 if num == 0.0 else math.inf
    else:
        cmp.rel_l2 = num / den
    return cmp


def flatten_tensors(obj: Any) -> list:
    """The tensors in a tensor, or a (nested) dict / list / tuple of them, in a stable order."""
    import torch  # noqa: PLC0415

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for k in sorted(obj) for t in flatten_tensors(obj[k])]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in flatten_tensors(item)]
    return []


def clone_tensors(obj: Any) -> Any:
    """A copy of ``obj`` with every tensor in it (nested in dicts / lists / tuples) cloned."""
    import torch  # noqa: PLC0415

    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: clone_tensors(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(clone_tensors(v) for v in obj)
    return obj
