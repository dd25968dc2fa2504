"""Compile the tree-verify kernel for one or more archs without a GPU and print ptxas' report.

    python -m kdtree.kernels.build --arch sm_90 --arch sm_120 [--sass] [--extension]

For each arch: registers, spills, stack frame and static shared memory per kernel (from
``nvcc -Xptxas -v``), the dynamic shared memory each kernel is launched with (read from the
compiled object's records), and, where cuobjdump is available, the tensor-core instructions
found in the SASS (HMMA expected; HGMMA / UTC* would break sm_120 portability). ``--extension``
also builds the loadable extension into the JIT cache. Exit status 1 when any compile fails,
2 when the arguments or the toolchain are wrong.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

from kdtree.kernels import cli
from kdtree.kernels.jit import JitError, build_extension, compile_arch, normalize_arch

_OPCODES = ("HMMA", "HGMMA", "UTCHMMA", "UTCQMMA", "LDGSTS", "LDSM", "LDL", "STL")


def summarize_sass(sass: str) -> dict[str, int]:
    """Count the opcodes that tell the story (tensor-core flavour, async copies, local memory)."""
    counts = Counter(re.findall(r"\b(" + "|".join(_OPCODES) + r")\b", sass))
    return {op: counts.get(op, 0) for op in _OPCODES}


def _arch(text: str) -> str:
    try:
        return normalize_arch(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kdtree.kernels.build", description=__doc__.split("\n")[0])
    ap.add_argument("--arch", action="append", type=_arch, default=None, help="sm_90, sm_120, ... (repeatable)")
    ap.add_argument("--sass", action="store_true", help="also print the opcode summary of the SASS")
    ap.add_argument("--extension", action="store_true", help="also build the loadable extension (JIT cache)")
    args = ap.parse_args(argv)
    archs = args.arch or ["sm_90", "sm_120"]
    status = 0
    try:
        for arch in archs:
            result = compile_arch(arch, sass=args.sass)
            print(f"== {result.arch}: {'ok' if result.returncode == 0 else 'FAILED'}")
            for line in result.ptxas_log.splitlines():
                if result.returncode != 0 or "ptxas" in line or "error" in line or "spill" in line:
                    print("  " + line.strip())
            for record in result.smem_records:
                print(f"  dynamic shared memory {record.kernel}: {record.dynamic_smem_bytes} bytes "
                      f"({record.threads} threads)")
            if args.sass:
                print("  SASS:", summarize_sass(result.sass) if result.sass else "cuobjdump not found")
            status |= result.returncode != 0
        if args.extension:
            print("extension:", build_extension(archs))
    except JitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return int(status)


if __name__ == "__main__":
    sys.exit(cli.run(main))
