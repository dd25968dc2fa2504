"""Build gate: compile for every arch, hold ptxas' resource report and the SASS against the spec.

Protocol: ``compile_arch(arch) -> BuildOutput`` compiles the project's CUDA code for one arch
(``"sm_90"``, ``"sm_120"``, ...) with ``-Xptxas -v`` and returns ptxas' report, the SASS
(``cuobjdump --dump-sass``; empty when it could not be dumped), the return code and the command.
`nvcc_compiler` builds such a callable for one .cu file. Dynamic shared memory is not in ptxas'
report: the project gives it per kernel (mangled name, as ptxas prints it) in
``BuildOutput.dynamic_smem_bytes`` and it is added to the kernel's static smem. A project that
reads these figures from the compiled binary says so (``dynamic_smem_source``) and sets
``dynamic_smem_required``: then an entry kernel without a figure fails the gate instead of
counting as 0 bytes, so a kernel the figures do not know cannot slip past the limit.

Limits per kernel: registers, spill bytes (the larger of spill stores and loads), stack (the
larger of the frame and the cumulative stack size), shared memory (static + dynamic). Functions
that are not entries (non-inlined device functions) are held to the spill and stack limits too.
``only_kernels`` narrows the check to the entry functions whose names contain one of its strings
(the rest are listed as unchecked; a non-entry function is checked when the arch has a checked
entry), and ``required_sass`` names opcodes each arch's checked kernels must contain (a build for
a specialised arch that lost its instructions fails).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from kdtree import cuda_toolkit
from kdtree.gates.base import Figure, GateContext, GateResult, Outcome, verdict
from kdtree.gates.spec import BuildGateSpec


@dataclass
class KernelResources:
    """One function in ptxas' ``-v`` report."""

    function: str
    arch: str
    entry: bool = True  # False: a device function ptxas kept out of line
    registers: int = 0
    barriers: int = 0
    stack_frame_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    cumulative_stack_bytes: int = 0
    smem_bytes: int = 0  # static shared memory
    cmem_bytes: int = 0  # all constant banks together
    dynamic_smem_bytes: int = 0  # declared by the project, not from ptxas

    @property
    def spill_bytes(self) -> int:
        return max(self.spill_store_bytes, self.spill_load_bytes)

    @property
    def stack_bytes(self) -> int:
        return max(self.stack_frame_bytes, self.cumulative_stack_bytes)

    @property
    def total_smem_bytes(self) -> int:
        return self.smem_bytes + self.dynamic_smem_bytes


@dataclass
class BuildOutput:
    """What compiling one arch produced."""

    ptxas_log: str
    sass: str = ""
    returncode: int = 0
    command: str | list[str] = ""
    dynamic_smem_bytes: dict[str, int] = field(default_factory=dict)
    dynamic_smem_required: bool = False  # every entry kernel must have a figure (0 for none)
    dynamic_smem_source: str = ""  # where the figures come from, for the record


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[\d+\]")
_CUMSTACK = re.compile(r"(\d+) bytes cumulative stack size")


def parse_ptxas(text: str, default_arch: str = "") -> list[KernelResources]:
    """Every function in an ``nvcc -Xptxas -v`` log, in order of appearance.

    A non-entry function takes the arch of the entries compiled with it (ptxas does not name it
    for them), or ``default_arch`` when the log has none.
    """
    out: list[KernelResources] = []
    block: list[KernelResources] = []  # functions of one ptxas invocation ("... bytes gmem" starts one)
    block_arch: Optional[str] = None
    entry: Optional[KernelResources] = None
    props: Optional[KernelResources] = None

    def close_block() -> None:
        for k in block:
            if not k.arch:
                k.arch = block_arch or default_arch
        block.clear()

    for line in text.splitlines():
        if "bytes gmem" in line:
            close_block()
            block_arch, entry, props = None, None, None
        m = _ENTRY.search(line)
        if m:
            entry = KernelResources(function=m.group(1), arch=m.group(2), entry=True)
            block_arch = m.group(2)
            out.append(entry)
            block.append(entry)
            props = None
            continue
        m = _PROPS.search(line)
        if m:
            name = m.group(1)
            if entry is not None and entry.function == name:
                props = entry
            else:
                props = KernelResources(function=name, arch=block_arch or "", entry=False)
                out.append(props)
                block.append(props)
            continue
        m = _FRAME.search(line)
        if m and props is not None:
            props.stack_frame_bytes, props.spill_store_bytes, props.spill_load_bytes = map(int, m.groups())
            props = None
            continue
        m = _USED.search(line)
        if m and entry is not None:
            entry.registers = int(m.group(1))
            if (b := _BARRIERS.search(line)):
                entry.barriers = int(b.group(1))
            if (s := _SMEM.search(line)):
                entry.smem_bytes = int(s.group(1))
            entry.cmem_bytes = sum(int(c) for c in _CMEM.findall(line))
            if (c := _CUMSTACK.search(line)):
                entry.cumulative_stack_bytes = int(c.group(1))
    close_block()
    return out


_SASS_CODE_FOR = re.compile(r"^\s*code for (\S+)")
_SASS_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
_SASS_INSTR = re.compile(r"/\*([0-9a-fA-F]{4,})\*/\s+((?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)[^;]*);")


def sass_instructions(text: str) -> Iterator[tuple[str, str, str, str, str]]:
    """``(arch, function, address, opcode, instruction)`` for each instruction of a SASS dump."""
    arch = function = ""
    for line in text.splitlines():
        if (m := _SASS_CODE_FOR.match(line)):
            arch = m.group(1)
            continue
        if (m := _SASS_FUNCTION.match(line)):
            function = m.group(1)
            continue
        if (m := _SASS_INSTR.search(line)):
            yield arch, function, m.group(1), m.group(3), " ".join(m.group(2).split())


def _opcode_matches(opcode: str, forbidden: str) -> bool:
    return opcode == forbidden or opcode.startswith(forbidden + ".")


def scan_sass(text: str, forbidden: Sequence[str]) -> list[str]:
    """One line ``"ARCH FUNCTION /*ADDR*/ INSTRUCTION"`` per instruction whose opcode is forbidden.

    ``"HGMMA"`` matches ``HGMMA`` and ``HGMMA.64x128x16.F32.BF16``, never ``HGMMAX``.
    """
    hits = []
    for arch, function, addr, opcode, instr in sass_instructions(text):
        if any(_opcode_matches(opcode, f) for f in forbidden):
            hits.append(f"{arch} {function} /*{addr}*/ {instr}")
    return hits


_DESC = re.compile(r"(?<![A-Za-z])desc\[UR(\d+)\]")
_UNIFORM_DEST = re.compile(r"^(?:@!?U?P[T0-9]+\s+)?\S+\s+UR(\d+)\b")


def undefined_descriptors(text: str) -> list[str]:
    """One line ``"ARCH FUNCTION /*ADDR*/ INSTRUCTION"`` per instruction that reads a memory
    descriptor ``desc[URn]`` whose register pair (URn, URn+1) no instruction of its function writes.

    Such code reads an undefined descriptor and traps on the device ("an illegal instruction was
    encountered"); ptxas has emitted it for cache-hinted ``cp.async`` copies. A write is an
    instruction whose destination is ``URn`` (with ``URn+1`` too for a 64-bit one: ``.64``, ``WIDE``).
    """
    written: dict[tuple[str, str], set[int]] = {}
    reads: list[tuple[str, str, str, str, int]] = []
    for arch, function, addr, opcode, instr in sass_instructions(text):
        regs = written.setdefault((arch, function), set())
        if (m := _UNIFORM_DEST.match(instr)):
            n = int(m.group(1))
            regs.add(n)
            if ".64" in opcode or "WIDE" in opcode:
                regs.add(n + 1)
        reads += [(arch, function, addr, instr, int(n)) for n in _DESC.findall(instr)]
    return [f"{arch} {function} /*{addr}*/ {instr}" for arch, function, addr, instr, n in reads
            if not {n, n + 1} <= written.get((arch, function), set())]


def find_cuobjdump() -> Optional[str]:
    """cuobjdump from the CUDA toolkit (`kdtree.cuda_toolkit`) or the copy triton ships; None if none."""
    return cuda_toolkit.find_cuobjdump()


def nvcc_compiler(source: Path, out_dir: Path, *, flags: Sequence[str] = (), nvcc: str = "nvcc",
                  dynamic_smem_bytes: Optional[dict[str, int]] = None,
                  timeout_s: float = 600) -> Callable[[str], BuildOutput]:
    """A ``compile_arch`` for one .cu file: ``nvcc -arch=ARCH -cubin -Xptxas -v FLAGS``, then
    ``cuobjdump --dump-sass`` of the cubin when a cuobjdump is found."""

    def compile_arch(arch: str) -> BuildOutput:
        out_dir.mkdir(parents=True, exist_ok=True)
        cubin = out_dir / f"{Path(source).stem}.{arch}.cubin"
        cmd = [nvcc, f"-arch={arch}", "-cubin", "-Xptxas", "-v", *flags, "-o", str(cubin), str(source)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        sass = ""
        tool = find_cuobjdump()
        if proc.returncode == 0 and tool:
            dump = subprocess.run([tool, "--dump-sass", str(cubin)], capture_output=True, text=True,
                                  timeout=timeout_s)
            sass = dump.stdout if dump.returncode == 0 else ""
        return BuildOutput(ptxas_log=proc.stdout + proc.stderr, sass=sass, returncode=proc.returncode,
                           command=cmd, dynamic_smem_bytes=dict(dynamic_smem_bytes or {}))

    return compile_arch


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _violations(spec: BuildGateSpec, k: KernelResources) -> list[str]:
    v = []
    if k.entry and k.registers > spec.max_registers:
        v.append(f"{k.registers} registers > {spec.max_registers}")
    if k.spill_bytes > spec.max_spill_bytes:
        v.append(f"spills {k.spill_store_bytes} B stores / {k.spill_load_bytes} B loads > {spec.max_spill_bytes} B")
    if k.stack_bytes > spec.max_stack_bytes:
        v.append(f"stack {k.stack_bytes} B > {spec.max_stack_bytes} B")
    if k.total_smem_bytes > spec.max_shared_bytes:
        v.append(f"smem {k.smem_bytes} B static + {k.dynamic_smem_bytes} B dynamic > {spec.max_shared_bytes} B")
    return v


def _checked(spec: BuildGateSpec, function: str) -> bool:
    return not spec.only_kernels or any(name in function for name in spec.only_kernels)


def _max(values: list[int]) -> Optional[int]:
    return max(values) if values else 0


def check_build(spec: BuildGateSpec, compile_arch: Callable[[str], BuildOutput], ctx: GateContext) -> GateResult:
    """Compile every ``spec.archs`` and hold each kernel to the spec's limits.

    Figures, per arch: ``ARCH kernels`` (>= 1: a log without a resource report measured nothing),
    ``ARCH max_registers``, ``ARCH max_spill_bytes``, ``ARCH max_stack_bytes``,
    ``ARCH max_smem_bytes``; overall ``archs_built``, ``forbidden_sass`` (count of forbidden
    opcodes; unknown, so failing, when an arch's SASS is missing) and ``kernels_over_limits``
    (key). A failed compile gives the arch's figures no value, and its log tail in the summary.
    Details: ``kernels`` (a row per function), ``forbidden_hits`` (the first 100),
    ``forbidden_counts`` (per arch), ``commands``, ``compile_errors``, ``sass_missing``,
    ``dynamic_smem_sources`` (per arch, where given); with ``required_sass``, ``ARCH
    required_sass_missing`` per arch (unknown, so failing, without SASS) and
    ``required_sass_counts`` in the details. Where an arch's SASS was dumped, ``ARCH
    undefined_descriptors`` (<= 0: instructions reading a ``desc[URn]`` their kernel never writes,
    `undefined_descriptors`; the first 100 in the details). Rows of functions ``only_kernels``
    leaves out carry ``checked: False``.
    """
    figures: list[Figure] = []
    rows: list[dict] = []
    messages: list[str] = []
    hits: list[str] = []
    hit_counts: dict[str, int] = {}
    commands: dict[str, object] = {}
    errors: dict[str, str] = {}
    over = 0
    built = 0
    sass_missing: list[str] = []
    smem_sources: dict[str, str] = {}
    required_counts: dict[str, dict[str, int]] = {}
    undefined_desc: list[str] = []
    for i, arch in enumerate(spec.archs):
        ctx.progress(f"build {arch}", i / len(spec.archs))
        out = compile_arch(arch)
        commands[arch] = out.command
        if out.returncode != 0:
            errors[arch] = _tail(out.ptxas_log)
            messages.append(f"{arch}: compile failed (rc {out.returncode}):\n{_tail(out.ptxas_log, 12)}")
            for what, limit in (("kernels", None), ("max_registers", spec.max_registers),
                                ("max_spill_bytes", spec.max_spill_bytes),
                                ("max_stack_bytes", spec.max_stack_bytes),
                                ("max_smem_bytes", spec.max_shared_bytes)):
                figures.append(Figure(name=f"{arch} {what}", value=None, op=">=" if limit is None else "<=",
                                      threshold=1 if limit is None else limit))
            continue
        built += 1
        kernels = parse_ptxas(out.ptxas_log, default_arch=arch)
        names = {k.function for k in kernels if k.entry}
        unknown = sorted(set(out.dynamic_smem_bytes) - names)
        if unknown:
            raise ValueError(f"{arch}: dynamic smem declared for {unknown}, which ptxas did not report; "
                             f"its kernels are {sorted(names)}")
        if out.dynamic_smem_source:
            smem_sources[arch] = out.dynamic_smem_source
        checked_names = {k.function for k in kernels if k.entry and _checked(spec, k.function)}
        checked = [k for k in kernels if k.function in checked_names or (not k.entry and checked_names)]
        checked_ids = {id(k) for k in checked}
        for k in kernels:
            if k.entry:
                k.dynamic_smem_bytes = int(out.dynamic_smem_bytes.get(k.function, 0))
            if id(k) not in checked_ids:
                rows.append({"arch": k.arch, "function": k.function, "entry": k.entry, "registers": k.registers,
                             "spill_stores": k.spill_store_bytes, "spill_loads": k.spill_load_bytes,
                             "stack": k.stack_bytes, "smem_static": k.smem_bytes,
                             "smem_dynamic": k.dynamic_smem_bytes, "cmem": k.cmem_bytes, "barriers": k.barriers,
                             "violations": [], "checked": False})
                continue
            v = _violations(spec, k)
            if k.entry and out.dynamic_smem_required and k.function not in out.dynamic_smem_bytes:
                v.append("no dynamic shared-memory figure for this kernel "
                         f"({out.dynamic_smem_source or 'the declared figures'} do not name it)")
            over += bool(v)
            if v:
                messages.append(f"{arch} {k.function}: " + ", ".join(v))
            rows.append({"arch": k.arch, "function": k.function, "entry": k.entry, "registers": k.registers,
                         "spill_stores": k.spill_store_bytes, "spill_loads": k.spill_load_bytes,
                         "stack": k.stack_bytes, "smem_static": k.smem_bytes, "smem_dynamic": k.dynamic_smem_bytes,
                         "cmem": k.cmem_bytes, "barriers": k.barriers, "violations": v})
        entries = [k for k in checked if k.entry]
        if not entries:
            messages.append(f"{arch}: ptxas reported no kernel (was -Xptxas -v passed?)" if not spec.only_kernels
                            else f"{arch}: no kernel named like {spec.only_kernels} was compiled")
        figures += [
            Figure(name=f"{arch} kernels", value=len(entries), op=">=", threshold=1),
            Figure(name=f"{arch} max_registers", value=_max([k.registers for k in entries]), op="<=",
                   threshold=spec.max_registers),
            Figure(name=f"{arch} max_spill_bytes", value=_max([k.spill_bytes for k in checked]), unit=" B",
                   op="<=", threshold=spec.max_spill_bytes),
            Figure(name=f"{arch} max_stack_bytes", value=_max([k.stack_bytes for k in checked]), unit=" B",
                   op="<=", threshold=spec.max_stack_bytes),
            Figure(name=f"{arch} max_smem_bytes", value=_max([k.total_smem_bytes for k in entries]), unit=" B",
                   op="<=", threshold=spec.max_shared_bytes),
        ]
        if spec.required_sass:
            present = {op: 0 for op in spec.required_sass}
            for _, function, _, opcode, _ in sass_instructions(out.sass):
                if function in checked_names:
                    for op in spec.required_sass:
                        present[op] += _opcode_matches(opcode, op)
            required_counts[arch] = present
            absent = sorted(op for op, n in present.items() if n == 0)
            has_sass = bool(out.sass.strip())
            figures.append(Figure(name=f"{arch} required_sass_missing", value=len(absent) if has_sass else None,
                                  op="<=", threshold=0))
            if not has_sass:
                messages.append(f"{arch}: no SASS to look for {spec.required_sass} in (is cuobjdump available?)")
            elif absent:
                messages.append(f"{arch}: required SASS {absent} not found in {sorted(checked_names)}")
        if next(sass_instructions(out.sass), None) is not None:
            undefined = undefined_descriptors(out.sass)
            undefined_desc += undefined[:100 - len(undefined_desc)]
            figures.append(Figure(name=f"{arch} undefined_descriptors", value=len(undefined), op="<=", threshold=0))
            if undefined:
                messages.append(f"{arch}: {len(undefined)} instructions read a memory descriptor no instruction "
                                f"of their kernel writes (traps on the device), first: {undefined[0]}")
        if spec.forbidden_sass:
            if not out.sass.strip() or next(sass_instructions(out.sass), None) is None:
                sass_missing.append(arch)
            else:
                found = scan_sass(out.sass, spec.forbidden_sass)
                hits += found
                hit_counts[arch] = len(found)
                if found:
                    messages.append(f"{arch}: {len(found)} forbidden SASS instructions, first: {found[0]}")
    if sass_missing:
        messages.append(f"no SASS to scan for forbidden opcodes for {sass_missing} (is cuobjdump available?)")
    figures.insert(0, Figure(name="kernels_over_limits", value=over, op="<=", threshold=0, key=True))
    figures.append(Figure(name="archs_built", value=built, op=">=", threshold=len(spec.archs)))
    if spec.forbidden_sass:
        figures.append(Figure(name="forbidden_sass", value=None if sass_missing else len(hits), op="<=",
                              threshold=0))
    summary = "; ".join(messages[:4]) if messages else (
        f"{built} archs built, {sum(1 for r in rows if r.get('checked', True))} functions within limits, "
        f"no forbidden SASS")
    result = verdict(spec.name, spec.kind, figures, summary, kernels=rows, forbidden_hits=hits[:100],
                     forbidden_counts=hit_counts,
                     commands=commands, compile_errors=errors, sass_missing=sass_missing,
                     dynamic_smem_sources=smem_sources, required_sass_counts=required_counts,
                     undefined_descriptors=undefined_desc)
    if messages and result.outcome is Outcome.PASSED:
        result.outcome = Outcome.FAILED
    return result
