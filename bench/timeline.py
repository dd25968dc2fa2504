"""The kernel's timeline: clock stamps per lane, stage and tile, from a ``-DKD_TIMELINE=1`` build.

A timeline build (``KDTREE_NVCC_FLAGS=-DKD_TIMELINE=1``; ``kernels/csrc/timeline.cuh``) has the
leader of each lane of a CTA (thread 0 of every 128: warpgroup 0, warpgroup 1 and the producer
of the wgmma variant; the two consumer groups and the producer warp of ws; two halves of base)
write the SM's clock (``clock64``) at each stage boundary of each tile, for the launch's first
CTAs (by linear block index), with each CTA's SM id and global start time. `collect` runs one
launch of a case and reads the buffers back (GPU); everything else works on the CPU: a
`Timeline` is saved and loaded as ``.npz`` or ``.json`` (`save`, `load`), cut into what each lane
was doing between consecutive stamps (`lane_spans`), the intervals in which a lane had MMAs in
flight (`mma_spans`: from the start of an issue to the stamp after the wait that saw it done, an
upper bound), and summed up per CTA (`summarize`: the figures that test the kernel's three suspected
costs: the softmax between S and P, the tensor pipe's idle gaps, and the waits for tiles).
``kdtree.tools.timeline`` draws it.
"""

from __future__ import annotations

import io
import json
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from kdtree.fsutil import atomic_write_bytes

__all__ = ["EVENTS", "HEADER_FIELDS", "LANE_NAMES", "STATE_OF", "Span", "Timeline", "TimelineError", "collect",
           "lane_spans", "load", "merge", "mma_spans", "one_cta_per_sm", "save", "summarize", "tile_mma_clocks"]

# Event ids of kernels/csrc/timeline.cuh, in order.
EVENTS = ("load_wait_free", "load_free", "load_issued", "tile_wait", "tile_ready", "s_issued", "s_done",
          "softmax_done", "p_stored", "pv_issued", "pv_done", "stage_freed",
          "bar0_wait", "bar0_done", "bar1_wait", "bar1_done", "bar2_wait", "bar2_done", "bar3_wait", "bar3_done")
LANE_EVENTS = ("lane_begin", "lane_end")  # the lane row's events
HEADER_FIELDS = ("smid", "block_x", "block_y", "block_z", "grid_x", "grid_y", "grid_z", "tiles", "globaltimer_begin",
                 "clock_begin", "clock_end", "globaltimer_end")
EV = {name: i for i, name in enumerate(EVENTS)}
HF = {name: i for i, name in enumerate(HEADER_FIELDS)}

# What a lane was doing up to each stamp (the state the stamp ends).
STATE_OF = {
    "load_wait_free": "producer work", "load_free": "wait free stage", "load_issued": "issue copies",
    "tile_wait": "other", "tile_ready": "wait tile", "s_issued": "issue S", "s_done": "wait S",
    "softmax_done": "softmax", "p_stored": "store P", "pv_issued": "issue PV", "pv_done": "wait PV",
    "stage_freed": "free stage", "lane_end": "other",
    **{f"bar{k}_wait": "other" for k in range(4)}, **{f"bar{k}_done": "wait barrier" for k in range(4)},
}

LANE_NAMES = {
    "wgmma": ("warpgroup 0", "warpgroup 1", "producer"),
    "ws": ("consumers 0", "consumers 1", "producer warp"),
    "base16": ("threads 0-127", "threads 128-255"),
    "base32": ("threads 0-127", "threads 128-255"),
}

# Rows per CTA and keys per tile of each variant (launch_plan.VARIANTS names).
_TILE_SHAPE = {"wgmma": (64, 64), "ws": (32, 32), "base16": (16, 32), "base32": (32, 32)}


class TimelineError(ValueError):
    """A dump or an extension that is not what a timeline needs (the message says what to do)."""


@dataclass
class Timeline:
    """Stamps of one launch: ``header[cta, HEADER_FIELDS]`` and ``stamps[cta, lane, tile, event]``
    (uint64 clocks, 0 = not recorded; tile row ``tiles`` holds each lane's begin and end, event ids
    as LANE_EVENTS), tile t meaning the CTA's tile ``tile0 + t``. ``meta``: what was run (variant,
    config, device, flags, ...), free-form."""

    header: np.ndarray
    stamps: np.ndarray
    tile0: int = 0
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.header = np.asarray(self.header, dtype=np.uint64)
        self.stamps = np.asarray(self.stamps, dtype=np.uint64)
        if self.header.ndim != 2 or self.header.shape[1] != len(HEADER_FIELDS):
            raise TimelineError(f"header: expected shape [ctas, {len(HEADER_FIELDS)}], got {list(self.header.shape)}")
        if self.stamps.ndim != 4 or self.stamps.shape[0] != self.header.shape[0] or self.stamps.shape[3] < len(EVENTS):
            raise TimelineError(f"stamps: expected shape [{self.header.shape[0]}, lanes, tiles + 1, >= {len(EVENTS)}], "
                                f"got {list(self.stamps.shape)}")

    @property
    def tiles(self) -> int:
        """Tiles recorded per lane."""
        return self.stamps.shape[2] - 1

    @property
    def variant(self) -> str:
        return str(self.meta.get("variant", "?"))

    def recorded(self) -> list[int]:
        """CTAs whose header was written (they ran), in index order."""
        return [int(c) for c in np.nonzero(self.header[:, HF["clock_begin"]])[0]]

    def field(self, cta: int, name: str) -> int:
        """One header field of a CTA."""
        return int(self.header[cta, HF[name]])

    def lane_names(self) -> tuple[str, ...]:
        """Names of the lanes that stamped anything (by the variant's roles where known)."""
        used = [lane for lane in range(self.stamps.shape[1]) if self.stamps[:, lane].any()]
        names = LANE_NAMES.get(self.variant, ())
        return tuple(names[lane] if lane < len(names) else f"lane {lane}" for lane in range(max(used, default=-1) + 1))

    def clock(self, cta: int, lane: int, tile: int, event: str) -> Optional[int]:
        """The clock of `event` of the CTA's tile `tile` (its own count) on `lane`, relative to the
        CTA's start, or None when not recorded."""
        t = tile - self.tile0
        if not 0 <= t < self.tiles:
            return None
        v = int(self.stamps[cta, lane, t, EV[event]])
        return None if v == 0 else v - self.field(cta, "clock_begin")


@dataclass(frozen=True)
class Span:
    """What one lane did from `start` to `end` (clocks from the CTA's start): `state` (STATE_OF's
    values, or "MMA" for `mma_spans`), up to the stamp `event` of tile `tile`."""

    lane: int
    state: str
    start: int
    end: int
    tile: int
    event: str


def _lane_stamps(tl: Timeline, cta: int, lane: int) -> list[tuple[int, int, str]]:
    """(clock from the CTA's start, tile, event) of every stamp of a lane, in clock order."""
    base = tl.field(cta, "clock_begin")
    out = []
    arr = tl.stamps[cta, lane]
    for t, e in zip(*np.nonzero(arr[: tl.tiles, : len(EVENTS)])):
        out.append((int(arr[t, e]) - base, int(t) + tl.tile0, EVENTS[e]))
    for e, name in enumerate(LANE_EVENTS):
        if arr[tl.tiles, e]:
            out.append((int(arr[tl.tiles, e]) - base, -1, name))
    tiles = tl.field(cta, "tiles")
    out = [s for s in out if s[1] < tiles]  # stamps of tiles past the CTA's last (a pair's missing b) say nothing
    out.sort(key=lambda s: (s[0], EVENTS.index(s[2]) if s[2] in EVENTS else -1))
    return out


def lane_spans(tl: Timeline, cta: int) -> list[Span]:
    """Each lane's time cut at its stamps: the span up to a stamp is in the state that stamp ends
    (STATE_OF), so the spans of a lane cover it from its first stamp to its last without gaps."""
    spans = []
    for lane in range(tl.stamps.shape[1]):
        st = _lane_stamps(tl, cta, lane)
        for (t0, _, _), (t1, tile, ev) in zip(st, st[1:]):
            spans.append(Span(lane, STATE_OF.get(ev, "other"), t0, t1, tile, ev))
    return spans


def mma_spans(tl: Timeline, cta: int) -> list[Span]:
    """Per lane and tile, S's and PV's time on the tensor pipe, at most: from the start of their
    issue (the lane's stamp before ``s_issued`` / ``pv_issued``: a warpgroup's wgmma instructions
    stall at issue while the pipe works through those before them, so the issue span is mostly
    execution) to the stamp after the wait that saw them done (``s_done`` / ``pv_done``)."""
    out = []
    last = tl.field(cta, "tiles")
    for lane in range(tl.stamps.shape[1]):
        stamps = _lane_stamps(tl, cta, lane)
        before = {(tile, ev): stamps[i - 1][0] for i, (_, tile, ev) in enumerate(stamps) if i > 0}
        for t in range(tl.tiles):
            tile = t + tl.tile0
            if tile >= last:
                break
            for a, b in (("s_issued", "s_done"), ("pv_issued", "pv_done")):
                t0, t1 = tl.clock(cta, lane, tile, a), tl.clock(cta, lane, tile, b)
                if t0 is not None and t1 is not None and t1 >= t0:
                    out.append(Span(lane, "MMA", before.get((tile, a), t0), t1, tile, b))
    return out


def merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of [start, end) intervals as sorted, disjoint intervals."""
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def one_cta_per_sm(tl: Timeline) -> dict[int, int]:
    """SM id -> the first recorded CTA that started on it (by global time)."""
    first: dict[int, int] = {}
    for c in tl.recorded():
        sm = tl.field(c, "smid")
        if sm not in first or tl.field(c, "globaltimer_begin") < tl.field(first[sm], "globaltimer_begin"):
            first[sm] = c
    return dict(sorted(first.items()))


def tile_mma_clocks(variant: str, flop_per_clock_per_sm: float = 4096.0) -> Optional[float]:
    """Clocks one SM's tensor pipe needs for one tile's QK and PV (2 x rows x keys x (576 + 512)
    FLOPs) at `flop_per_clock_per_sm` (4096: Hopper's dense bf16 wgmma rate), or None for an
    unknown variant."""
    shape = _TILE_SHAPE.get(variant)
    if shape is None:
        return None
    rows, keys = shape
    return 2 * rows * keys * (576 + 512) / flop_per_clock_per_sm


def _median(xs: list[float]) -> Optional[float]:
    return float(statistics.median(xs)) if xs else None


def summarize(tl: Timeline, cta: int, *, skip_tiles: int = 2) -> dict[str, Any]:
    """The figures of one CTA that test the suspected costs, over its recorded tiles from
    `skip_tiles` on (the ring's start-up left out):

    - ``clocks_per_tile``: the mean distance between successive tiles' readiness on the consumers;
      ``mma_clocks_per_tile``: the tensor pipe's need for one tile (`tile_mma_clocks`), and their
      ratio ``pipe_fraction`` (1: the pipe never waits);
    - ``softmax_clocks``, ``store_p_clocks``: median clocks from S's completion to P in registers
      and from there to P stored (the inner loop between S and P);
    - ``mma_in_flight_fraction``: the share of the window (the first counted tile's readiness to
      the last PV's completion) with an MMA of some lane in flight (an upper bound), and
      ``idle_gaps_per_tile``: gaps of that union per tile;
    - ``wait_tile_clocks``: median consumer wait for a tile's bytes, ``wait_free_clocks``: median
      producer wait for a free stage; ``wait_barrier_clocks``: median hand-off barrier wait.
    """
    tiles = min(tl.field(cta, "tiles") - tl.tile0, tl.tiles)
    counted = range(tl.tile0 + skip_tiles, tl.tile0 + tiles)
    lanes = range(tl.stamps.shape[1])

    def diffs(a: str, b: str, lanes_=lanes) -> list[float]:
        out = []
        for lane in lanes_:
            for tile in counted:
                t0, t1 = tl.clock(cta, lane, tile, a), tl.clock(cta, lane, tile, b)
                if t0 is not None and t1 is not None and t1 >= t0:
                    out.append(float(t1 - t0))
        return out

    ready = sorted(t for tile in counted for lane in lanes
                   if (t := tl.clock(cta, lane, tile, "tile_ready")) is not None)
    # the mean period: the wgmma variant's lanes take alternate tiles (in pairs, unevenly spaced);
    # the others' lanes each see every tile, so their stamps of one tile coincide
    firsts = sorted({min(ts) for tile in counted
                     if (ts := [t for lane in lanes if (t := tl.clock(cta, lane, tile, "tile_ready")) is not None])})
    per_tile = (firsts[-1] - firsts[0]) / (len(firsts) - 1) if len(firsts) > 1 else None
    mma = tile_mma_clocks(tl.variant)
    busy = merge([(s.start, s.end) for s in mma_spans(tl, cta) if s.tile in counted])
    pv_done = [t for tile in counted for lane in lanes if (t := tl.clock(cta, lane, tile, "pv_done")) is not None]
    window = (ready[0], max(pv_done)) if ready and pv_done and max(pv_done) > ready[0] else None
    in_flight = gaps = None
    if window is not None:
        clipped = [(max(a, window[0]), min(b, window[1])) for a, b in busy if b > window[0] and a < window[1]]
        in_flight = sum(b - a for a, b in clipped) / (window[1] - window[0])
        gaps = max(len(clipped) - 1, 0) / max(len(counted), 1)
    bar = []
    for k in range(4):
        bar += diffs(f"bar{k}_wait", f"bar{k}_done")
    return {
        "cta": cta, "smid": tl.field(cta, "smid"), "tiles": tl.field(cta, "tiles"), "counted_tiles": len(counted),
        "clocks_per_tile": per_tile, "mma_clocks_per_tile": mma,
        "pipe_fraction": (mma / per_tile) if (mma and per_tile) else None,
        "softmax_clocks": _median(diffs("s_done", "softmax_done")),
        "store_p_clocks": _median([d for d in diffs("softmax_done", "p_stored") if d < 4 * (per_tile or 1e18)]),
        "mma_in_flight_fraction": in_flight, "idle_gaps_per_tile": gaps,
        "wait_tile_clocks": _median(diffs("tile_wait", "tile_ready")),
        "wait_free_clocks": _median(diffs("load_wait_free", "load_free")),
        "wait_barrier_clocks": _median(bar),
    }


# ---------------- dumps ----------------

def save(tl: Timeline, path: str | Path) -> Path:
    """Write `tl` atomically as ``.npz`` (all stamps) or ``.json`` (the recorded stamps as
    [cta, lane, tile row, event, clock] rows); the suffix picks the format."""
    path = Path(path)
    if path.suffix == ".npz":
        buf = io.BytesIO()
        np.savez_compressed(buf, header=tl.header, stamps=tl.stamps, tile0=np.int64(tl.tile0),
                            meta=np.array(json.dumps(tl.meta, sort_keys=True)))
        data = buf.getvalue()
    elif path.suffix == ".json":
        nz = np.nonzero(tl.stamps)
        doc = {"format": "kdtree-timeline-v1", "shape": list(tl.stamps.shape), "tile0": tl.tile0, "meta": tl.meta,
               "header": tl.header.tolist(),
               "stamps": [[int(c), int(lane), int(t), int(e), int(tl.stamps[c, lane, t, e])] for c, lane, t, e in zip(*nz)]}
        data = json.dumps(doc, sort_keys=True).encode()
    else:
        raise TimelineError(f"{path}: a timeline dump is .npz or .json")
    atomic_write_bytes(path, data)
    return path


def load(path: str | Path) -> Timeline:
    """A dump written by `save` (.npz or .json)."""
    path = Path(path)
    if not path.is_file():
        raise TimelineError(f"{path}: no such file (a dump from `python -m kdtree.tools.timeline run`)")
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                return Timeline(z["header"], z["stamps"], int(z["tile0"]), json.loads(str(z["meta"])))
        if path.suffix == ".json":
            doc = json.loads(path.read_text())
            if doc.get("format") != "kdtree-timeline-v1":
                raise TimelineError(f"{path}: not a timeline dump (format {doc.get('format')!r})")
            stamps = np.zeros(doc["shape"], dtype=np.uint64)
            for c, lane, t, e, v in doc["stamps"]:
                stamps[c, lane, t, e] = v
            return Timeline(np.array(doc["header"], dtype=np.uint64), stamps, int(doc["tile0"]), doc.get("meta", {}))
    except (KeyError, ValueError, OSError) as exc:
        if isinstance(exc, TimelineError):
            raise
        raise TimelineError(f"{path}: not a readable timeline dump ({exc})") from exc
    raise TimelineError(f"{path}: a timeline dump is .npz or .json")


def decode(header: bytes, stamps: bytes, shape: tuple[int, ...], meta: Optional[dict] = None) -> Timeline:
    """A Timeline from the extension's raw buffers (``timeline_read()``) and ``timeline_shape``
    (ctas, lanes, tiles, events, header fields, tile0)."""
    ctas, lanes, tiles, events, fields, tile0 = shape
    h = np.frombuffer(header, dtype=np.uint64)
    s = np.frombuffer(stamps, dtype=np.uint64)
    if h.size != ctas * fields or s.size != ctas * lanes * (tiles + 1) * events:
        raise TimelineError(f"timeline buffers of {h.size} + {s.size} words do not match the shape {shape}")
    return Timeline(h.reshape(ctas, fields).copy(), s.reshape(ctas, lanes, tiles + 1, events).copy(), tile0, meta or {})


def collect(case: dict, *, variant: Optional[str] = None, num_splits: Optional[int] = None,
            meta: Optional[dict] = None) -> Timeline:
    """One launch of `case` (kdtree.bench.cases) on the current GPU with the timeline build
    loaded, its stamps read back. The extension must be a timeline build: set
    ``KDTREE_NVCC_FLAGS=-DKD_TIMELINE=1`` before the process's first kernel call."""
    import torch  # noqa: PLC0415

    from kdtree.bench.cases import case_args  # noqa: PLC0415
    from kdtree.kernels import cuda_op  # noqa: PLC0415
    from kdtree.kernels.launch_plan import plan as make_plan  # noqa: PLC0415

    q = case["q"]
    state = cuda_op.device_state(q.get_device())
    ext = state.ext
    if not (hasattr(ext, "timeline_enabled") and ext.timeline_enabled()):
        raise TimelineError(f"the loaded extension ({getattr(ext, '__file__', ext)}) is not a timeline build: run with "
                            "KDTREE_NVCC_FLAGS=-DKD_TIMELINE=1 set before the first kernel call")
    args = case_args(case)
    lp = make_plan(q.shape[0], q.shape[1], case["qo_indptr"].numel() - 1, case["tree_mask"].shape[1],
                   case["kv_indices"].numel(), q.device, variant=variant, num_splits=num_splits)
    out = cuda_op.launch(*args, plan=lp)  # warm-up: module load, attributes
    torch.cuda.synchronize()
    ext.timeline_reset()
    cuda_op.launch(*args, out=out, plan=lp)
    torch.cuda.synchronize()
    header, stamps = ext.timeline_read()
    info = {"variant": lp.variant_name, "num_splits": lp.num_splits, "grid": [lp.num_splits, lp.grid_y, lp.batch],
            "device": torch.cuda.get_device_name(q.device), "sm_count": state.sm_count,
            "capability": list(state.capability), "nvcc_flags": os.environ.get("KDTREE_NVCC_FLAGS", "")}
    info.update(meta or {})
    return decode(header, stamps, tuple(ext.timeline_shape), info)
