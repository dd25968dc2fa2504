"""Synthetic `nvcc -Xptxas -v` logs for the build gate's tests (no nvcc needed)."""

from __future__ import annotations


def ptxas_log(arch: str, *functions: tuple[str, int, int, int]) -> str:
    """A ptxas log for `arch` with one entry per (name, registers, spill bytes, barriers)."""
    lines = ["ptxas info    : 0 bytes gmem"]
    for name, registers, spill, barriers in functions:
        lines += [f"ptxas info    : Compiling entry function '{name}' for '{arch}'",
                  f"ptxas info    : Function properties for {name}",
                  f"    0 bytes stack frame, {spill} bytes spill stores, {spill} bytes spill loads",
                  f"ptxas info    : Used {registers} registers, used {barriers} barriers"]
    return "\n".join(lines) + "\n"
