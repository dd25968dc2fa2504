"""Bytes and FLOPs of one tree-verify call and the two floors they imply (docs/design.md section 3b).

Counts, per request: the latent rows once ((L+T) * 1152 bytes), q read and out written once
(T * H * (1152 + 1024)), the slot ids and mask words; FLOPs = 2 * H * T * (L+T) * (576 + 512)
(scores over 576 dims plus values over 512). `python -m kdtree.tools.roofline` prints them per
shape of the benchmark grid.
"""

from __future__ import annotations

from dataclasses import dataclass

ROW_BYTES = 576 * 2  # one bf16 latent row
Q_BYTES = 576 * 2
OUT_BYTES = 512 * 2
FLOPS_PER_SCORE = 2 * (576 + 512)

# The H200 figures docs/design.md section 3b was measured against.
H200_COPY_BYTES_PER_S = 4.244e12
H200_BF16_FLOPS_PER_S = 7.88e14


@dataclass(frozen=True)
class Shape:
    """B requests of T tree nodes over L prefix slots each, H heads."""

    H: int
    T: int
    B: int
    L: int

    @property
    def label(self) -> str:
        ell = f"{self.L // 1024}k" if self.L >= 1024 and self.L % 1024 == 0 else str(self.L)
        return f"H{self.H} T{self.T} B{self.B} L{ell}"


def bytes_moved(s: Shape) -> int:
    """Bytes a kernel that reads each latent row once must move for one call."""
    words = (s.T + 31) // 32
    per_request = ((s.L + s.T) * (ROW_BYTES + 4) + s.T * s.H * (Q_BYTES + OUT_BYTES)
                   + s.T * words * 4)
    return s.B * per_request + 2 * (s.B + 1) * 4


def flops(s: Shape) -> int:
    """Matmul FLOPs of one call, the count docs/design.md section 3b uses."""
    return s.B * s.H * s.T * (s.L + s.T) * FLOPS_PER_SCORE


def floors(s: Shape, bytes_per_s: float, flops_per_s: float) -> tuple[float, float]:
    """(bandwidth time, tensor-core time) in seconds."""
    return bytes_moved(s) / bytes_per_s, flops(s) / flops_per_s


def floor_seconds(s: Shape, bytes_per_s: float, flops_per_s: float) -> float:
    """The roofline floor: the larger of the two times."""
    return max(floors(s, bytes_per_s, flops_per_s))


def grid(quick: bool = False) -> list[Shape]:
    """The benchmark grid (the phase's speedup gate uses the quick subset)."""
    if quick:
        return [Shape(H, T, B, 32768) for H in (8, 64) for T in (16, 64) for B in (1, 8)]
    lengths = (4096, 32768, 131072)
    shapes = [Shape(H, T, B, L) for H in (8, 16, 64, 128) for T in (4, 16, 64, 256)
              for B in (1, 8) for L in lengths]
    shapes += [Shape(H, T, 1, L) for T in (512, 1024) for H in (8, 16) for L in lengths]
    return shapes


def markdown_table(shapes: list[Shape], bytes_per_s: float, flops_per_s: float) -> str:
    """One row per shape: bytes, FLOPs, both floors in ms and the bound."""
    lines = [f"Floors at {bytes_per_s / 1e9:.0f} GB/s and {flops_per_s / 1e12:.0f} TFLOP/s "
             f"(ridge {flops_per_s / bytes_per_s:.0f} FLOP/byte).", "",
             "| H | T | B | L | MB moved | GFLOP | FLOP/byte | bandwidth ms | tensor-core ms | floor ms | bound |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in shapes:
        t_bw, t_fl = floors(s, bytes_per_s, flops_per_s)
        lines.append(f"| {s.H} | {s.T} | {s.B} | {s.L} | {bytes_moved(s) / 1e6:.1f} | {flops(s) / 1e9:.1f} "
                     f"| {flops(s) / bytes_moved(s):.0f} | {t_bw * 1e3:.4f} | {t_fl * 1e3:.4f} "
                     f"| {max(t_bw, t_fl) * 1e3:.4f} | {'bandwidth' if t_bw >= t_fl else 'tensor core'} |")
    return "\n".join(lines)
