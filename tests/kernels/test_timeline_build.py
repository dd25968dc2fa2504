"""The timeline build (kernels/csrc/timeline.cuh): its event ids are the decoder's, every stamp in
the kernels names one of them, a default build's stamps are empty, and (GPU) a recorded launch
decodes into ordered stamps of real SMs."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kdtree.bench import timeline as tlm
from kdtree.kernels.jit import CSRC, find_cuobjdump, find_nvcc

HEADER = (CSRC / "timeline.cuh").read_text()
KERNELS = ("tree_verify_mla_base.cuh", "tree_verify_mla_ws.cuh", "tree_verify_mla_sm90a.cuh")


def _enum_names() -> list[str]:
    body = HEADER[HEADER.index("enum Event"): HEADER.index("kLaneBegin")]
    return re.findall(r"^\s+(k[A-Za-z0-9]+)", body, flags=re.M)


def _snake(name: str) -> str:
    m = re.fullmatch(r"kBar(Wait|Done)(\d)", name)
    if m:
        return f"bar{m.group(2)}_{m.group(1).lower()}"
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name[1:].replace("PV", "Pv")).lower()


def test_event_ids_are_the_decoders():
    names = _enum_names()
    assert [_snake(n) for n in names] == list(tlm.EVENTS)
    knobs = (CSRC / "knobs.cuh").read_text()
    assert int(re.search(r"kTimelineEvents = (\d+)", knobs).group(1)) >= len(tlm.EVENTS)
    assert int(re.search(r"kTimelineHeaderFields = (\d+)", knobs).group(1)) == len(tlm.HEADER_FIELDS)


def test_every_stamp_in_the_kernels_names_an_event():
    known = set(_enum_names()) | {"kLaneBegin", "kLaneEnd"}
    used = set()
    for f in KERNELS:
        used |= set(re.findall(r"KD_STAMP(?:_LANE)?\((k\w+)", (CSRC / f).read_text()))
    assert used and used <= known, used - known
    assert {"kTileReady", "kSIssued", "kSDone", "kSoftmaxDone", "kPVIssued", "kPVDone", "kLoadIssued"} <= used


def _sass(tmp_path, body: str, flags: list[str]) -> tuple[list[str], str]:
    """(instructions without addresses, ELF listing) of a small kernel that includes timeline.cuh."""
    src = tmp_path / "k.cu"
    src.write_text('#include "timeline.cuh"\n__global__ void k(float* o) { ' + body + ' o[threadIdx.x] = 1.f; }\n')
    cubin = tmp_path / "k.cubin"
    subprocess.run([find_nvcc(), "-cubin", "-gencode=arch=compute_90a,code=sm_90a", *flags, f"-I{CSRC}", str(src),
                    "-o", str(cubin)], check=True, capture_output=True, text=True)
    dump = subprocess.run([find_cuobjdump(), "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
    elf = subprocess.run([find_cuobjdump(), "-elf", str(cubin)], check=True, capture_output=True, text=True).stdout
    return re.findall(r"/\*[0-9a-f]{4}\*/\s+([^;]*;)", dump), elf


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None or find_cuobjdump() is None, reason="needs nvcc and cuobjdump")
def test_default_build_stamps_compile_to_nothing(tmp_path):
    stamps = "KD_STAMP_CTA_BEGIN(3); KD_STAMP(kSDone, 1); KD_STAMP_LANE(kLaneEnd); KD_STAMP_CTA_END();"
    plain, plain_elf = _sass(tmp_path, "", [])
    stamped, stamped_elf = _sass(tmp_path, stamps, [])
    assert stamped == plain and "timeline_" not in stamped_elf
    timed, timed_elf = _sass(tmp_path, stamps, ["-DKD_TIMELINE=1"])
    assert any(i.startswith("CS2R") and "SR_CLOCK" in i for i in timed) and "timeline_stamps_buf" in timed_elf


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU to record a launch")
def test_a_recorded_launch_decodes_into_ordered_stamps(tmp_path):
    env = dict(os.environ, KDTREE_NVCC_FLAGS="-DKD_TIMELINE=1")
    subprocess.run([sys.executable, "-m", "kdtree.tools.timeline", "run", "--configs", "16,64,1,4096", "--out",
                    str(tmp_path)], check=True, env=env, timeout=900)
    tl = tlm.load(Path(tmp_path) / "timeline-16-64-1-4096.npz")
    recorded = tl.recorded()
    assert recorded
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for c in recorded:
        assert tl.field(c, "smid") < sms and tl.field(c, "clock_end") >= tl.field(c, "clock_begin")
        for lane in range(tl.stamps.shape[1]):
            for tile in range(min(tl.field(c, "tiles"), tl.tiles)):
                seq = [tl.clock(c, lane, tile, e) for e in ("tile_wait", "tile_ready", "s_issued", "s_done")]
                seq = [x for x in seq if x is not None]
                assert seq == sorted(seq)
    assert any(s.state == "softmax" for s in tlm.lane_spans(tl, recorded[0]))
