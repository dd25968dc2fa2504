"""Phase 1's second dispatch: the path a compute capability 12.0 device takes, forced on this GPU.

The Hopper wgmma variant is the default dispatch on 9.0, so a record's default figures are the
Hopper kernel's. The product exists for sm_120 (RTX PRO 6000: no wgmma, 101376 bytes of
shared memory per block), so the speed gate also times **the sm_120 path**: for each call, the
variant `launch_plan.choose_variant` picks for capability 12.0 from the same shapes (base16 up to
16 rows per request, ws above), launched with the plan ``plan(..., variant=...)`` makes on this
device (`kdtree.bench.forced`), so with this device's split count. Every variant it launches is held to sm_120's shared-memory limit, read
from the loaded extension's own records (`SM120_MAX_SHARED_BYTES`), so what is timed is the
code an sm_120 card runs, under its limits, on this card's memory system and tensor cores.

Its figures are named ``sm120_path_*``. Besides the speedups, the gate records its fraction of
the **mma.sync ceiling** measured in the same run (`kdtree.bench.mma_ceiling`: the bf16
m16n8k16 rate with operands in registers): per config, max(bytes / copy bandwidth, FLOPs /
that rate) over the sm_120 path's median time.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Optional

from kdtree.bench import mma_ceiling
from kdtree.bench.flashinfer_peer import SM120_SMEM_PER_BLOCK as SM120_MAX_SHARED_BYTES
from kdtree.bench.forced import SM120_CAPABILITY, sm120_path, sm120_variant  # noqa: F401 - the phase's dispatch
from kdtree.bench.roofline import Shape, bytes_moved, flops
from kdtree.gates.base import Figure, GateResult, Outcome
from kdtree.kernels.jit import arch_for_capability, build_extension, smem_records
from kdtree.kernels.launch_plan import VARIANT_NAMES

PREFIX = "sm120_path"  # the figure prefix of this dispatch


def variants_by_config(configs: list) -> dict[str, str]:
    """Config name -> the variant the sm_120 path runs for it (configs carry H, T, B in params)."""
    return {c.name: sm120_variant(c.params["T"] * c.params["B"], c.params["H"], c.params["B"]) for c in configs}


def extension_smem_bytes(capability: tuple[int, int]) -> dict[str, int]:
    """Variant name -> the dynamic shared memory it is launched with, as the extension this device
    loads records it (`kdtree.kernels.jit.smem_records`)."""

    path = build_extension([arch_for_capability(tuple(capability))])
    return {VARIANT_NAMES[r.variant]: r.dynamic_smem_bytes for r in smem_records(path.read_bytes())
            if r.variant in VARIANT_NAMES}


def hold_smem(result: GateResult, variants: dict[str, str], smem_of: dict[str, int]) -> None:
    """Add ``sm120_path_smem_bytes`` (the most shared memory any launched variant takes, must be
    <= sm_120's limit); a path over the limit (or a variant the extension does not record) fails
    the gate: it would not be the path an sm_120 card runs."""
    used = sorted(set(variants.values()))
    missing = [v for v in used if v not in smem_of]
    worst = max((smem_of[v] for v in used if v in smem_of), default=None)
    figure = Figure(name=f"{PREFIX}_smem_bytes", value=None if missing else worst, unit="B", op="<=",
                    threshold=SM120_MAX_SHARED_BYTES)
    result.figures.append(figure)
    result.details[PREFIX] = {**result.details.get(PREFIX, {}), "capability": list(SM120_CAPABILITY),
                              "variants": variants, "smem_bytes": {v: smem_of.get(v) for v in used}}
    if figure.ok is False or missing:
        why = (f"the extension records no shared memory for {missing}" if missing else
               f"a variant it launches takes {worst} B of shared memory, over sm_120's {SM120_MAX_SHARED_BYTES}")
        if result.outcome is not Outcome.ERROR:
            result.outcome = Outcome.FAILED
        result.summary = f"the sm_120 path is not sm_120's: {why}; " + result.summary


def mma_sync_peak_flops(rows: list[dict[str, Any]]) -> float:
    """The best bf16 mma.sync rate (FLOP/s) with operands in registers among `mma_ceiling` rows."""
    rates = [r["tflops"] * 1e12 for r in rows[1:] if r.get("mma") and r.get("ldsm_bytes_per_mma") == 0]
    if not rates:
        raise ValueError("the mma.sync ceiling measurement holds no MMA rate with operands in registers")
    return max(rates)


def add_mma_ceiling_figures(result: GateResult, configs: list, bytes_per_s: float,
                            measure: Optional[Callable[[], list[dict[str, Any]]]] = None) -> None:
    """Measure the mma.sync ceiling now and add ``sm120_path_median_mma_ceiling`` /
    ``sm120_path_min_mma_ceiling`` (reported): per config the mma.sync floor over the sm_120
    path's median time. Where it cannot be measured the details say why (figures None)."""

    if measure is None:
        measure = mma_ceiling.measure
    info: dict[str, Any] = {}
    fractions: list[float] = []
    try:
        rows = measure()
        peak = mma_sync_peak_flops(rows)
    except Exception as exc:  # a missing nvcc or GPU leaves the figures unmeasured, never the gate broken
        info["mma_ceiling"] = f"not measured: {type(exc).__name__}: {exc}"[:400]
    else:
        info["mma_ceiling"] = {"device": rows[0] if rows else None, "mma_sync_flops_per_s": peak}
        by_name = {c.name: c for c in configs}
        per_config = {}
        for row in result.details.get("configs") or []:
            side = (row.get("others") or {}).get(PREFIX) or {}
            cfg = by_name.get(row.get("config"))
            if cfg is None or side.get("status") != "ok" or not side.get("ms"):
                continue
            shape = Shape(**{k: cfg.params[k] for k in ("H", "T", "B", "L")})
            floor = max(bytes_moved(shape) / bytes_per_s, flops(shape) / peak)
            per_config[cfg.name] = floor / (side["ms"]["median_ms"] * 1e-3)
        fractions = list(per_config.values())
        info["mma_ceiling"]["fraction_by_config"] = per_config
    result.figures += [
        Figure(name=f"{PREFIX}_median_mma_ceiling", value=statistics.median(fractions) if fractions else None),
        Figure(name=f"{PREFIX}_min_mma_ceiling", value=min(fractions) if fractions else None)]
    result.details[PREFIX] = {**result.details.get(PREFIX, {}), **info}
