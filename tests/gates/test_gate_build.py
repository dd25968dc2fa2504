"""Build gate: ptxas report and SASS parsing, and real nvcc builds for sm_90 and sm_120."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kdtree.gates.base import GateContext, Outcome, run_check
from kdtree.gates.build import (
    BuildOutput, check_build, find_cuobjdump, nvcc_compiler, parse_ptxas, scan_sass, undefined_descriptors,
)
from kdtree.gates.spec import BuildGateSpec
from ptxas_logs import ptxas_log

DATA = Path(__file__).parent / "data"
SPEC = BuildGateSpec(name="toy-build", archs=["sm_90", "sm_120"])
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

# Captured from nvcc 13.0 (-arch=sm_90 -Xptxas -v -maxrregcount=32) on tests/gates/data/spilly.cu.
PTXAS_SPILL = """\
ptxas info    : Overriding maximum register limit 256 for 'spilly' with  32 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'spilly' for 'sm_90'
ptxas info    : Function properties for spilly
    1160 bytes stack frame, 2636 bytes spill stores, 2848 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 1160 bytes cumulative stack size
ptxas info    : Compile time = 113.041 ms
ptxas info    : Compiling entry function 'stacky' for 'sm_90'
ptxas info    : Function properties for stacky
    1024 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 1024 bytes cumulative stack size
ptxas info    : Compile time = 32.345 ms
"""
# Captured from nvcc 13.0 with -rdc=true: a non-inlined device function reported before its caller.
PTXAS_RDC = """\
ptxas info    : 0 bytes gmem
ptxas info    : Function properties for _Z6helperPKfi$1
    136 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z7callsitPfPKf' for 'sm_120'
ptxas info    : Function properties for _Z7callsitPfPKf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 24 registers, used 1 barriers, 1024 bytes smem
"""
# The older report line (CUDA 11/12) carries constant banks.
PTXAS_OLD = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z4tileILi64EEvPf' for 'sm_80'
ptxas info    : Function properties for _Z4tileILi64EEvPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, 16384 bytes smem, 368 bytes cmem[0], 8 bytes cmem[2]
"""
SASS = """
	code for sm_90
		Function : mma_kernel
        /*0000*/                   LDC R1, c[0x0][0x28] ;                          /* 0x00000a00ff017b82 */
        /*0010*/              @!P0 HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;  /* 0x000000001818799f */
        /*0020*/                   HGMMAX R1, R2 ;                                 /* 0x0000000000007918 */
        /*0030*/                   EXIT ;                                          /* 0x000000000000794d */
"""


def test_parse_ptxas_spills_and_stack():
    spilly, stacky = parse_ptxas(PTXAS_SPILL)
    assert (spilly.function, spilly.arch, spilly.registers) == ("spilly", "sm_90", 32)
    assert (spilly.spill_store_bytes, spilly.spill_load_bytes, spilly.stack_frame_bytes) == (2636, 2848, 1160)
    assert spilly.spill_bytes == 2848 and spilly.stack_bytes == 1160
    assert stacky.spill_bytes == 0 and stacky.stack_bytes == 1024


def test_parse_ptxas_non_entry_function_takes_the_blocks_arch():
    helper, entry = parse_ptxas(PTXAS_RDC)
    assert not helper.entry and helper.function == "_Z6helperPKfi$1" and helper.arch == "sm_120"
    assert helper.stack_frame_bytes == 136
    assert entry.entry and entry.smem_bytes == 1024 and entry.barriers == 1 and entry.registers == 24


def test_parse_ptxas_cmem_in_older_reports():
    (k,) = parse_ptxas(PTXAS_OLD)
    assert (k.registers, k.smem_bytes, k.cmem_bytes) == (40, 16384, 376)


def test_scan_sass_matches_whole_opcodes_with_predicates():
    hits = scan_sass(SASS, ["HGMMA"])
    assert hits == ["sm_90 mma_kernel /*0010*/ @!P0 HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24"]
    assert scan_sass(SASS, ["UTCHMMA"]) == []


def fake_compiler(logs: dict[str, BuildOutput]):
    return lambda arch: logs[arch]


def fig(result, name):
    return next(f for f in result.figures if f.name == name)


def test_gate_on_captured_spill_log_fails():
    spec = SPEC.model_copy(update={"archs": ["sm_90"], "forbidden_sass": []})
    r = check_build(spec, fake_compiler({"sm_90": BuildOutput(PTXAS_SPILL)}), GateContext())
    assert r.outcome is Outcome.FAILED
    assert fig(r, "kernels_over_limits").value == 2
    assert fig(r, "sm_90 max_spill_bytes").value == 2848 and fig(r, "sm_90 max_stack_bytes").value == 1160
    assert "spilly" in r.summary and "stacky" in r.summary


def test_missing_sass_cannot_pass_the_forbidden_opcode_check():
    spec = SPEC.model_copy(update={"archs": ["sm_120"]})
    r = check_build(spec, fake_compiler({"sm_120": BuildOutput(PTXAS_RDC.replace("136 bytes", "0 bytes"))}),
                    GateContext())
    assert r.outcome is Outcome.FAILED and fig(r, "forbidden_sass").value is None
    assert "no SASS" in r.summary


def test_a_log_without_a_resource_report_measured_nothing():
    spec = SPEC.model_copy(update={"archs": ["sm_90"], "forbidden_sass": []})
    r = check_build(spec, fake_compiler({"sm_90": BuildOutput("")}), GateContext())
    assert r.outcome is Outcome.FAILED and "no kernel" in r.summary


SASS_TWO = """
	code for sm_90a
		Function : wide_kernel
        /*0000*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;  /* 0x000000001818799f */
        /*0010*/                   EXIT ;                                          /* 0x000000000000794d */
		Function : plain_kernel
        /*0000*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;           /* 0x000000000804723c */
        /*0010*/                   EXIT ;                                          /* 0x000000000000794d */
"""
PTXAS_TWO = ptxas_log("sm_90a", ("wide_kernel", 168, 0, 5), ("plain_kernel", 255, 8, 1))


def _two(**update):
    spec = SPEC.model_copy(update={"archs": ["sm_90a"], "forbidden_sass": [], "max_shared_bytes": 232448, **update})
    out = BuildOutput(PTXAS_TWO, sass=SASS_TWO, dynamic_smem_bytes={"wide_kernel": 231200})
    return check_build(spec, fake_compiler({"sm_90a": out}), GateContext())


def test_only_kernels_holds_the_named_kernels_alone():
    assert _two().outcome is Outcome.FAILED  # plain_kernel spills
    r = _two(only_kernels=["wide_"], required_sass=["HGMMA"])
    assert r.outcome is Outcome.PASSED, r.summary
    assert fig(r, "sm_90a kernels").value == 1 and fig(r, "sm_90a max_smem_bytes").value == 231200
    assert fig(r, "sm_90a required_sass_missing").value == 0 and fig(r, "sm_90a max_registers").value == 168
    rows = {row["function"]: row for row in r.details["kernels"]}
    assert rows["plain_kernel"]["checked"] is False and "checked" not in rows["wide_kernel"]
    assert r.details["required_sass_counts"] == {"sm_90a": {"HGMMA": 1}}


def test_required_sass_must_be_in_the_checked_kernels():
    r = _two(only_kernels=["plain_"], required_sass=["HGMMA"], max_spill_bytes=8)
    assert r.outcome is Outcome.FAILED and "required SASS ['HGMMA'] not found" in r.summary
    assert fig(r, "sm_90a required_sass_missing").value == 1


def test_required_sass_without_sass_is_unknown_and_fails():
    spec = SPEC.model_copy(update={"archs": ["sm_90a"], "forbidden_sass": [], "required_sass": ["HGMMA"],
                                   "only_kernels": ["wide_"]})
    r = check_build(spec, fake_compiler({"sm_90a": BuildOutput(PTXAS_TWO)}), GateContext())
    assert r.outcome is Outcome.FAILED and fig(r, "sm_90a required_sass_missing").value is None


def test_only_kernels_naming_nothing_fails():
    r = _two(only_kernels=["missing_kernel"])
    assert r.outcome is Outcome.FAILED and "no kernel named like ['missing_kernel']" in r.summary


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    out = tmp_path_factory.mktemp("cubins")
    return {
        "good": nvcc_compiler(DATA / "good.cu", out / "good"),
        "spilly": nvcc_compiler(DATA / "spilly.cu", out / "spilly", flags=["-maxrregcount=32"]),
        "broken": nvcc_compiler(DATA / "broken.cu", out / "broken"),
    }


@needs_nvcc
def test_good_kernels_pass_for_sm90_and_sm120(builds):
    spec = SPEC if find_cuobjdump() else SPEC.model_copy(update={"forbidden_sass": []})
    r = check_build(spec, builds["good"], GateContext())
    assert r.outcome is Outcome.PASSED, r.summary
    assert {row["arch"] for row in r.details["kernels"]} == {"sm_90", "sm_120"}
    assert fig(r, "sm_120 max_smem_bytes").value == 1024
    assert fig(r, "archs_built").value == 2


@pytest.mark.slow
@needs_nvcc
def test_spilling_and_stack_kernels_fail_on_real_ptxas_output(builds):
    r = check_build(SPEC.model_copy(update={"forbidden_sass": []}), builds["spilly"], GateContext())
    assert r.outcome is Outcome.FAILED
    rows = {(row["arch"], row["function"]): row for row in r.details["kernels"]}
    for arch in ("sm_90", "sm_120"):
        assert rows[(arch, "spilly")]["spill_stores"] > 0
        assert rows[(arch, "stacky")]["stack"] > 0 and rows[(arch, "stacky")]["spill_stores"] == 0
        assert fig(r, f"{arch} max_stack_bytes").ok is False
    assert fig(r, "kernels_over_limits").value == 4


@pytest.mark.slow
@needs_nvcc
@pytest.mark.skipif(find_cuobjdump() is None, reason="no cuobjdump (PATH, CUDA_HOME or triton's copy)")
def test_forbidden_opcode_found_in_real_sass(builds):
    spec = SPEC.model_copy(update={"forbidden_sass": ["STL"], "max_spill_bytes": 10 ** 6,
                                   "max_stack_bytes": 10 ** 6})
    r = check_build(spec, builds["spilly"], GateContext())
    assert r.outcome is Outcome.FAILED
    assert fig(r, "forbidden_sass").value > 0 and fig(r, "kernels_over_limits").value == 0
    assert any(" spilly " in h and "STL" in h for h in r.details["forbidden_hits"])
    assert set(r.details["forbidden_counts"]) == {"sm_90", "sm_120"}
    assert all(n > 0 for n in r.details["forbidden_counts"].values())


@needs_nvcc
def test_declared_dynamic_smem_counts_against_the_limit(builds, tmp_path):
    # 1024 B static + 100864 B dynamic = 101888 B > sm_120's 101376 B per block
    compile_arch = nvcc_compiler(DATA / "good.cu", tmp_path, dynamic_smem_bytes={"scale_rows": 100864,
                                                                                 "dyn_copy": 101376})
    spec = SPEC.model_copy(update={"archs": ["sm_120"], "forbidden_sass": []})
    r = check_build(spec, compile_arch, GateContext())
    assert r.outcome is Outcome.FAILED and "scale_rows" in r.summary and "dynamic" in r.summary
    assert "dyn_copy" not in r.summary  # exactly at the limit is within it
    assert fig(r, "sm_120 max_smem_bytes").value == 101888


@needs_nvcc
def test_dynamic_smem_for_an_unknown_kernel_is_an_error(tmp_path):
    compile_arch = nvcc_compiler(DATA / "good.cu", tmp_path, dynamic_smem_bytes={"dyn_cpy": 4096})
    spec = SPEC.model_copy(update={"archs": ["sm_90"], "forbidden_sass": []})
    r = run_check(spec, lambda s, ctx: check_build(s, compile_arch, ctx), GateContext())
    assert r.outcome is Outcome.ERROR and "dyn_cpy" in r.summary


@needs_nvcc
def test_a_compile_error_fails_with_the_log_tail(builds):
    r = check_build(SPEC, builds["broken"], GateContext())
    assert r.outcome is Outcome.FAILED
    assert "compile failed" in r.summary and "undeclared_name" in r.summary
    assert fig(r, "archs_built").value == 0


# The shape ptxas 13.0 gave cache-hinted cp.async copies (the descriptor's uniform registers never
# written, so the copy traps on the device), beside the same copies reading the kernel's own descriptor.
SASS_DESC_BROKEN = """
	code for sm_90a
		Function : hinted_copy_kernel
        /*0000*/                   ULDC.64 UR34, c[0x0][0x208] ;                   /* 0x0000820000227ab9 */
        /*0010*/                   UMOV UR16, UR19 ;                               /* 0x0000001300107c82 */
        /*0020*/                   LDGSTS.E.BYPASS.LTC256B.128 [R13+UR0], desc[UR1][R10.64], P3 ;  /* 0x000000000a0d7dae */
        /*0030*/                   LDG.E R4, desc[UR34][R2.64] ;                   /* 0x0000002202047981 */
        /*0040*/                   EXIT ;                                          /* 0x000000000000794d */
"""
SASS_DESC_GOOD = SASS_DESC_BROKEN.replace("desc[UR1]", "desc[UR34]")


def test_undefined_descriptors_names_the_copy_that_reads_one():
    assert undefined_descriptors(SASS_DESC_BROKEN) == [
        "sm_90a hinted_copy_kernel /*0020*/ LDGSTS.E.BYPASS.LTC256B.128 [R13+UR0], desc[UR1][R10.64], P3"]
    assert undefined_descriptors(SASS_DESC_GOOD) == []


def test_a_kernel_reading_an_undefined_descriptor_fails_the_build_gate():
    spec = SPEC.model_copy(update={"archs": ["sm_90a"], "forbidden_sass": []})
    log = ptxas_log("sm_90a", ("hinted_copy_kernel", 168, 0, 0))
    bad = check_build(spec, fake_compiler({"sm_90a": BuildOutput(log, sass=SASS_DESC_BROKEN)}), GateContext())
    assert bad.outcome is Outcome.FAILED
    assert fig(bad, "sm_90a undefined_descriptors").value == 1
    assert "memory descriptor" in bad.summary and "desc[UR1]" in bad.summary
    good = check_build(spec, fake_compiler({"sm_90a": BuildOutput(log, sass=SASS_DESC_GOOD)}), GateContext())
    assert good.outcome is Outcome.PASSED, good.summary
    assert fig(good, "sm_90a undefined_descriptors").value == 0
