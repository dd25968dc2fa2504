#!/usr/bin/env bash
# Here (with network), fetch the git-ignored wheels the GPU machine needs (it has no network):
#   .whl/          pydantic & co., GitPython, pytest & co. (always, ~4 MB).
#   .whl-sglang/   with SGLANG=1: the sglang 0.5.23 cp312 wheel and what its triton_backend imports
#                  (~39 MB); with KIT=1 also what SGLang's attention test kit imports (pyzmq,
#                  loguru, openai, ipython, ...; ~9 MB).
#   .peers-carry/  with PEERS=1: sglang-kernels.zip (SGLang 0.5.23's Triton verify kernel files, for
#                  phases 2 and 3 in the phase-1 call), flashinfer-trim.zip (FlashInfer 0.7.2.post1 without the CUDA
#                  sources its MLA path does not build) and the apache-tvm-ffi 0.1.15 wheel; the
#                  sgl-flash-mla 1.0.0 wheel (FlashMLA's kernels, ~9.5 MB: its dense decode is
#                  phase 1's second Hopper peer, kdtree.bench.flashmla_peer).
# A device call carries 64 MiB at most: .whl + .whl-sglang (phases 2, 3) or .whl + .peers-carry
# (phase 1 with its FlashInfer peers); `du -sh .whl*` tells.
#   SGLANG=1 KIT=1 PEERS=1 bash scripts/fetch-device-kit.sh
set -eu
cd "$(dirname "$0")/.."
fetch() {  # fetch DIR NAME==VERSION ...
  local dir=$1; shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 --platform any -d "$dir" "$@"
}
mkdir -p .whl
fetch .whl pydantic==2.14.4 pydantic_core==2.50.5 annotated_types==0.8.0 typing_inspection==0.4.5 \
  typing_extensions==4.16.0 GitPython==3.2.1 gitdb==4.0.12 smmap==5.0.3 \
  pytest==9.0.2 pluggy==1.6.0 iniconfig==2.3.0 packaging==25.0 \
  hypothesis==6.148.7 sortedcontainers==2.4.0 attrs==25.4.0
mkdir -p .whl-sglang
if [ "${SGLANG:-0}" = 1 ]; then
  fetch .whl-sglang sglang==0.5.23 orjson==3.11.5 pybase64==1.4.3 starlette==0.50.0 msgspec==0.20.0 \
    anyio==4.12.0 idna==3.11
fi
if [ "${KIT:-0}" = 1 ]; then
  fetch .whl-sglang pyzmq==27.1.0 loguru==0.7.3 openai==2.14.0 jiter==0.12.0 distro==1.9.0 sniffio==1.3.1 \
    dill==0.4.0 compressed-tensors==0.13.0 ipython==9.8.0 ipython_pygments_lexers==1.1.1 \
    decorator==5.2.1 jedi==0.19.2 parso==0.8.5 matplotlib-inline==0.2.1 pexpect==4.9.0 \
    ptyprocess==0.7.0 prompt_toolkit==3.0.52 wcwidth==0.2.14 pygments==2.19.2 stack_data==0.6.3 \
    asttokens==3.0.1 executing==2.2.1 pure_eval==0.2.3 traitlets==5.14.3 apache-tvm-ffi==0.1.15
fi
if [ "${PEERS:-0}" = 1 ]; then
  mkdir -p .peers-carry /tmp/fi-dl
  fetch /tmp/fi-dl flashinfer-python==0.7.2.post1
  fetch .peers-carry apache-tvm-ffi==0.1.15
  # abi3 wheel (cp310-abi3): fetched as any CPython >= 3.10 takes it; import flash_mla loads both
  # of its .so files (_loader.py), so the whole wheel is carried
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --abi abi3 --platform manylinux2014_x86_64 -d .peers-carry sgl-flash-mla==1.0.0
  # SGLang's Triton kernels alone (its extend_attention and decode_attention files, the two they
  # import, the wheel's METADATA: ~60 KiB), so phases 2 and 3 run in the same call as phase 1
  # (kdtree.integrations.sglang.sglang_kernels loads these files with the package __init__s skipped)
  python3 scripts/fetch-sglang-kernels.py --zip .peers-carry/sglang-kernels.zip
  python3 - <<'PY'
import glob, re, zipfile
src = glob.glob("/tmp/fi-dl/flashinfer_python-0.7.2.post1-*.whl")[0]
# data files only (every .py stays): CUDA sources other than batch_mla*, CUTLASS's examples and
# tools, thrust, the experimental / MoE kernel sources
drop = re.compile(r"flashinfer/data/csrc/(?!batch_mla)[^/]*\.cu$|flashinfer/data/csrc/[^/]+/"
                  r"|/experimental/|moe_ep/kernel_src/|flashinfer/data/cutlass/(examples|python|test|tools|media|docs)/"
                  r"|flashinfer/data/cccl/thrust/|fused_moe/backends/.*\.(cu|cuh|h|cpp|so)$|prims_ts/kernels/")
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(".peers-carry/flashinfer-trim.zip", "w",
                                                  zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        if not (drop.search(item.filename) and not item.filename.endswith(".py")):
            zout.writestr(item, zin.read(item.filename))
PY
fi
du -sh .whl .whl-sglang .peers-carry 2>/dev/null || true
# one device call carries 64 MiB: say so here when .whl and .peers-carry together do not fit
if [ -d .peers-carry ]; then
  _kib=$(du -sk .whl .peers-carry | awk '{s += $1} END {print s}')
  if [ "$_kib" -gt $((64 * 1024)) ]; then
    echo "WARNING: .whl + .peers-carry = ${_kib} KiB, over a device call's 64 MiB" >&2
  else
    echo ".whl + .peers-carry = ${_kib} KiB of a device call's 65536"
  fi
fi
