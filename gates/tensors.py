"""Tensor helpers shared by the gates: poison output buffers, and compare an output with its reference.

Poison is drawn fresh for every buffer (`poison_` returns the `Poison` it wrote): floats are
filled with NaNs whose sign and payload are random per element, never the payloads arithmetic
produces (the quiet-bit-only NaN of x86 and the all-ones NaN of CUDA), so an element whose bits
still equal the payload after the candidate ran was never written, and an element holding any
other NaN was written as NaN. No constant is shared between two poisonings, so a candidate cannot
recognise a gate's buffer by its content. Integer outputs are filled with the dtype's most
negative value (unsigned: its largest).

torch is imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Optional

# (integer view, mantissa bits) of each float dtype that gets a NaN payload.
_FLOAT_LAYOUT = {
    "torch.float64": ("int64", 52),
    "torch.float32": ("int32", 23),
    "torch.float16": ("int16", 10),
    "torch.bfloat16": ("int16", 7),
}


@dataclass
class Poison:
    """What `poison_` wrote into a buffer: the integer view of the payload (floats), or the
    integer sentinel. `poisoned_mask(t, poison)` finds the elements that still hold it."""

    bits: Any = None  # torch integer tensor, same shape as the buffer (floats with a payload)
    sentinel: Optional[int] = None  # integer dtypes
    nan_fill: bool = False  # float dtypes without a payload layout (fp8, ...): plain NaN


def poison_value(dtype) -> float | int:
    """The value an integer buffer is poisoned with (floats: NaN)."""
    import torch  # noqa: PLC0415

    if dtype.is_floating_point or dtype.is_complex:
        return math.nan
    if dtype == torch.bool:
        raise ValueError("bool outputs cannot be poisoned (every value is meaningful); use uint8")
    info = torch.iinfo(dtype)
    return info.min if info.min < 0 else info.max


def nan_payload_bits(shape, dtype, seed: int, device="cpu"):
    """Random NaN bit patterns for a float dtype, as its signed integer view: per element a random
    sign and a random non-zero mantissa other than the quiet bit alone or all ones (the NaNs
    arithmetic makes)."""
    import torch  # noqa: PLC0415

    view, m = _FLOAT_LAYOUT[str(dtype)]
    width = torch.iinfo(getattr(torch, view)).bits
    gen = torch.Generator(device=device).manual_seed(seed)
    quiet, top = 1 << (m - 1), (1 << m) - 1
    mant = torch.randint(1, top - 1, tuple(shape), generator=gen, device=device, dtype=torch.int64)
    mant = mant + (mant >= quiet).long()  # skips the quiet bit alone; the draw stops below all ones
    exp_ones = ((1 << (width - 1 - m)) - 1) << m
    sign = torch.randint(0, 2, tuple(shape), generator=gen, device=device, dtype=torch.int64)
    bits = (exp_ones | mant) + sign * torch.iinfo(torch.int64).min if width == 64 else \
        (exp_ones | mant) - sign * (1 << (width - 1))
    return bits.to(getattr(torch, view))


def poison_(t, seed: Optional[int] = None) -> Poison:
    """Fill ``t`` in place with a fresh poison (see the module docstring) and return it.

    ``seed`` picks the payload (default: drawn from os.urandom, so no two calls agree)."""
    import torch  # noqa: PLC0415

    layout = _FLOAT_LAYOUT.get(str(t.dtype))
    if layout is not None:
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "little")
        bits = nan_payload_bits(t.shape, t.dtype, seed, t.device)
        t.view(getattr(torch, layout[0])).copy_(bits)
        return Poison(bits=bits)
    if t.dtype.is_floating_point or t.dtype.is_complex:
        t.fill_(math.nan)
        return Poison(nan_fill=True)
    value = poison_value(t.dtype)
    t.fill_(value)
    return Poison(sentinel=value)


def poisoned_mask(t, poison: Poison):
    """Bool tensor: True where ``t`` still holds ``poison`` (what `poison_` returned for it).

    For float dtypes without a payload layout (fp8, ...), any NaN counts as poisoned.
    """
    import torch  # noqa: PLC0415

    if poison.bits is not None:
        layout = _FLOAT_LAYOUT.get(str(t.dtype))
        if layout is None or tuple(poison.bits.shape) != tuple(t.shape):
            raise ValueError(f"poison of shape {tuple(poison.bits.shape)} does not belong to a "
                             f"{t.dtype} tensor of shape {tuple(t.shape)}")
        return t.view(getattr(torch, layout[0])) == poison.bits.to(t.device)
    if poison.nan_fill:
        return torch.isnan(t)
    return t == poison.sentinel


def fill_stale_(t, scale: float, seed: int) -> None:
    """Fill ``t`` with finite values such as a previous call might have left: normal draws of
    standard deviation ``scale`` (integers: uniform in [0, 1000))."""
    import torch  # noqa: PLC0415

    gen = torch.Generator(device=t.device).manual_seed(seed)
    if t.dtype.is_floating_point:
        t.copy_(torch.randn(t.shape, generator=gen, device=t.device, dtype=torch.float32)
                * (scale if math.isfinite(scale) and scale > 0 else 1.0))
    else:
        t.copy_(torch.randint(0, 1000, t.shape, generator=gen, device=t.device))


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


def compare(name: str, out, ref, *, poison: Optional[Poison] = None) -> Comparison:
    """Compare ``out`` with ``ref`` (any dtypes; computed in float64 on ``out``'s device).

    Counts elements still holding ``poison`` (when given: what `poison_` wrote), elements that are NaN/Inf where the
    reference is finite (or a different infinity where it is not), and gives rel-L2
    ``||out - ref|| / ||ref||`` and max-abs over the rest. A NaN in the reference is a broken
    oracle and raises.
    """
    import torch  # noqa: PLC0415

    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"output {name!r}: shape {tuple(out.shape)} but the reference has {tuple(ref.shape)}")
    problems: list[str] = []
    numel = out.numel()
    unwritten_mask = poisoned_mask(out, poison) if poison is not None else torch.zeros(out.shape, dtype=torch.bool,
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
