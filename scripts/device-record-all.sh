#!/usr/bin/env bash
# Re-record every phase on the GPU machine in plan order, none forced:
#   bash scripts/device-record-all.sh all      carry .whl and .peers-carry (with its sglang-kernels.zip:
#                                              SGLang's Triton verify kernel files, all phases 2 and 3
#                                              take from SGLang): phases 1-4 and the torch op's GPU
#                                              tests in one call, within ALL_BUDGET s (default 570)
# or in two device calls (a call carries 64 MiB: FlashInfer's kit and SGLang's whole wheel do not fit
# together):
#   bash scripts/device-record-all.sh phase1   carry .whl and .peers-carry: phase 1 with FlashInfer
#                                              FA2/FA3 on the path (the speed gate's peer targets)
#   bash scripts/device-record-all.sh rest     carry .whl and .peers-carry (or .whl-sglang): the phases a
#                                              call just before on this machine did not record (its
#                                              records are kept from /tmp/kdtree-records), then the
#                                              user-path GPU tests
#   bash scripts/device-record-all.sh urgent   carry .whl and .whl-sglang: when device time is short,
#                                              phase 4 first (forced past stale earlier phases; the run
#                                              records that), the kernel's run-length GPU tests, then
#                                              phases 2 and 3 (forced), in one call of <= 560 s
# Each call packs every file the runs wrote under plans/results (records, their gate logs, plots) into
# $OUT/results-new.tgz (unpack it here with `tar xzf results-new.tgz`), and copies the records into
# /tmp/kdtree-records on the machine: a `rest`
# call that finds the machine still warm takes the phase-1 record from there, so the two calls can
# follow each other without a copy here in between. Copy the records into plans/results/<phase>/
# here and run `orchestrate checkpoint --phase <phase> --commit --include-untracked` for each, in order.
# `rest` ends with the GPU tests of the torch op and the SGLang integration.
set -u
WHICH=${1:?all, phase1, rest or urgent}
source "$(dirname "$0")/device-env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/machine.txt"
record() {  # record PHASE TIMEOUT_S [--force]: the run's new record (none if refused) into $OUT
  local mark; mark=$(mktemp)
  timeout "$2" python3 -m kdtree.orchestrator --repo . run "$1" --device cuda ${3:-} 2>&1 \
    | grep -v "INFO - \|UserWarning" | tail -25 | tee -a "$OUT/records.log"
  local newest; newest=$(find plans/results/"$1" -maxdepth 1 -name '2*.json' -newer "$mark" | sort | tail -1)
  rm -f "$mark"
  if [ -z "$newest" ]; then echo "$1: no new record" | tee -a "$OUT/records.log"; return 1; fi
  echo "$1: new record $(basename "$newest")" | tee -a "$OUT/records.log"
  mkdir -p "/tmp/kdtree-records/$1" && cp "$newest" "/tmp/kdtree-records/$1/"
  [ -f "${newest%.json}.log" ] && cp "${newest%.json}.log" "/tmp/kdtree-records/$1/"
  return 0
}
results_back() {  # every file the runs wrote under plans/results (records, gate logs, plots) in one archive
  find plans/results -type f -newer "$CALL_MARK" ! -name '.lock' | tar czf "$OUT/results-new.tgz" -T -
  tar tzf "$OUT/results-new.tgz" | tee -a "$OUT/records.log"
}
peers() {  # FlashInfer (and FlashMLA, SGLang's kernel files when carried) from .peers-carry onto the path
    _carry="$(cd "$(dirname "$0")/.." && pwd)/.peers-carry"
    if [ -d "$_carry" ]; then
      if [ -f "$_carry/sglang-kernels.zip" ]; then
        python3 -c "import zipfile; zipfile.ZipFile('$_carry/sglang-kernels.zip').extractall('/tmp/sgl-site')"
        export PYTHONPATH="$PYTHONPATH:/tmp/sgl-site"  # last: a full SGLang install, if any, wins
      fi
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fi-tvm "$_carry"/apache_tvm_ffi-*.whl
      python3 -c "import zipfile; zipfile.ZipFile('$_carry/flashinfer-trim.zip').extractall('/tmp/fi-site')"
      export PYTHONPATH="/tmp/fi-site:/tmp/fi-tvm:$PYTHONPATH" MAX_JOBS=16
      if ls "$_carry"/sgl_flash_mla-*.whl >/dev/null 2>&1; then  # FlashMLA: phase 1's second Hopper peer
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fmla-site "$_carry"/sgl_flash_mla-*.whl
        export PYTHONPATH="/tmp/fmla-site:$PYTHONPATH"
        python3 -c "from kdtree.bench import flashmla_peer as p; print('flashmla:', p.unavailable_reason() or 'loads')" \
        | tee -a "$OUT/records.log"
      fi
    else
      echo "no .peers-carry: FlashInfer's targets will read 'not measured'" | tee -a "$OUT/records.log"
    fi
}
user_path_tests() {  # user_path_tests TIMEOUT_S: the torch op and the SGLang integration on the GPU
  timeout "$1" python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_kernel_torch_op.py \
    tests/integrations/test_sglang_gpu.py --junitxml="$OUT/gpu-user-path.xml" 2>&1 | tail -8 | tee -a "$OUT/records.log"
}
BUDGET=${ALL_BUDGET:-570} START=$(date +%s)
CALL_MARK=$(mktemp); trap results_back EXIT
source "$(dirname "$0")/device-steps.sh"  # left: what is left of BUDGET
case "$WHICH" in
  phase1)
    peers
    record phase1 560 ;;
  all)
    peers
    record phase1 $(( $(left) - ${REST_RESERVE_S:-150} ))  # the rest of the budget for phases 2-4
    for p in phase2 phase3 phase4; do
      t=$(( $(left) - 20 )); [ "$t" -gt "${PHASE_CAP_S:-400}" ] && t=${PHASE_CAP_S:-400}
      if [ "$t" -lt 30 ]; then echo "$p: not run (the call's budget is spent)" | tee -a "$OUT/records.log"; continue; fi
      record "$p" "$t"
    done
    t=$(( $(left) - 5 ))
    [ "$t" -ge 30 ] && user_path_tests "$t" ;;
  rest)
    peers
    for p in phase1 phase2 phase3 phase4; do  # records of a call just before on this machine: kept, not rerun
      if ls /tmp/kdtree-records/$p/2*.json >/dev/null 2>&1; then
        cp /tmp/kdtree-records/$p/2* plans/results/$p/
        echo "$p: recorded by the previous call ($(ls /tmp/kdtree-records/$p/ | tr '\n' ' '))" | tee -a "$OUT/records.log"
        continue
      fi
      [ "$p" = phase1 ] && continue
      t=$(( $(left) - 60 )); [ "$t" -gt "${PHASE_CAP_S:-400}" ] && t=${PHASE_CAP_S:-400}
      [ "$t" -ge 30 ] && record "$p" "$t"
    done
    t=$(( $(left) - 5 )); [ "$t" -gt 240 ] && t=240
    [ "$t" -ge 30 ] && user_path_tests "$t" ;;
  urgent)
    record phase4 200 --force
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kernel_runs.py -m gpu \
      --junitxml="$OUT/gpu-runs.xml" 2>&1 | tail -8 | tee -a "$OUT/records.log"
    record phase2 110 --force
    record phase3 110 --force ;;
  *) echo "unknown step '$WHICH': all, phase1, rest or urgent"; exit 2 ;;
esac
ls "$OUT"
