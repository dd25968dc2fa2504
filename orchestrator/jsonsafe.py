"""Make what a check returned storable as JSON, without losing the measurement.

A check's ``details`` may hold anything, and a figure's value may be a numpy scalar. Before a
record is built, `plain_result` converts numpy scalars and arrays (anything with ``item()`` /
``tolist()``) to numbers and lists, tuples and sets to lists, mapping keys to strings, and
everything else JSON does not know (bytes, arbitrary objects) to its ``repr``, with one warning
per gate naming where it was.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from kdtree.gates.base import Figure, GateResult

_SCALARS = (str, int, float, bool, type(None))


def plain(value: Any, where: str, lossy: list[str]) -> Any:
    """``value`` as JSON-able data; ``lossy`` collects where something was turned into text."""
    if isinstance(value, _SCALARS):
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            return None
        return value if type(value) in _SCALARS else _builtin(value)
    if isinstance(value, dict):
        return {str(k): plain(v, f"{where}.{k}", lossy) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [plain(v, f"{where}[{i}]", lossy) for i, v in enumerate(items)]
    for attr in ("tolist", "item"):  # numpy arrays and scalars, torch tensors
        method = getattr(value, attr, None)
        if callable(method):
            try:
                return plain(method(), where, lossy)
            except Exception:  # noqa: BLE001 - fall back to text below
                break
    lossy.append(f"{where} ({type(value).__name__})")
    return repr(value)


def _builtin(value: Any) -> Any:
    """A subclass of a JSON scalar (an enum member, numpy.float64) as the plain scalar."""
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return value


def _figure_value(fig: Figure, lossy: list[str], gate: str) -> Figure:
    value = fig.value
    if value is None or type(value) is float:
        return fig
    converted = plain(value, f"{gate}.figures.{fig.name}", lossy)
    if isinstance(converted, bool) or not isinstance(converted, (int, float)):
        lossy.append(f"{gate}.figures.{fig.name} (not a number: recorded as NaN)")
        converted = None
    return fig.model_copy(update={"value": None if converted is None else float(converted)})


def plain_result(result: GateResult, warn: Callable[[str], None]) -> GateResult:
    """``result`` with its details and figure values JSON-able (see module docstring)."""
    lossy: list[str] = []
    details = plain(dict(result.details), f"{result.gate}.details", lossy)
    figures = [_figure_value(f, lossy, result.gate) for f in result.figures]
    if lossy:
        more = f" and {len(lossy) - 5} more" if len(lossy) > 5 else ""
        warn(f"gate {result.gate!r} returned values JSON cannot hold; they are recorded as text: "
             + ", ".join(lossy[:5]) + more)
    return result.model_copy(update={"details": details, "figures": figures})
