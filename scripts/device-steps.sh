#!/usr/bin/env bash
# Shared by the GPU-call scripts that build and measure kernel builds (device-hopper-sweep.sh,
# device-compare-revs.sh, device-timeline.sh); source it after setting BUDGET (seconds for the whole call), START
# (`date +%s` at the call's start) and LOGS (a folder for the steps' logs).
#   left                         seconds of the budget left
#   step NAME CAP CMD...         CMD under min(CAP, left - 10 s), its output in $LOGS/NAME.log; a line
#                                with its exit status (99: skipped, the budget is spent)
#   check_and_time NAME DIR      devcheck in DIR (its kdtree first on the path) under the current
#                                KDTREE_NVCC_FLAGS: the wgmma variant against the fp64 oracle (not
#                                for KD_SKIP measurement builds), then timed against the same
#                                build's ws kernel on $CONFIGS
#   build_sm90a NAME DIR         the JIT's sm_90a extension of DIR under the current KDTREE_NVCC_FLAGS
#                                (log in $LOGS/build-NAME.log); run several with & and wait
#   IN_REV                       `bash -c "$IN_REV" in_rev DIR CMD...` runs CMD in DIR that way
#   safe TEXT                    TEXT as a file-safe name
#   checkout_rev REV DIR         a worktree of REV at DIR, or of HEAD with REV applied where REV is a
#                                .patch file of $ROOT (only main's history reaches the GPU machine)
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
step() {
  local name=$1 cap=$2; shift 2
  local t=$(( $(left) - 10 )); [ "$t" -gt "$cap" ] && t=$cap
  if [ "$t" -lt 15 ]; then echo "== $name: skipped (budget spent)"; return 99; fi
  timeout --kill-after=5 "$t" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc ($(( $(date +%s) - START ))s into the call)"
  return $rc
}
safe() { echo "$1" | tr -c 'A-Za-z0-9._\n-' '_'; }
checkout_rev() {  # checkout_rev REV DIR: a worktree of REV, or of HEAD with REV applied where REV is a .patch file
  case "$1" in
    *.patch) [ -f "$ROOT/$1" ] || { echo "no file $1"; return 1; }
             git -C "$ROOT" worktree add -f --detach "$2" HEAD && git -C "$2" apply "$ROOT/$1" ;;
    *) git -C "$ROOT" worktree add -f --detach "$2" "$1" ;;
  esac
}
IN_REV='cd "$1" && source scripts/device-env.sh >/dev/null && shift && exec "$@"'
build_sm90a() {
  timeout 300 bash -c "$IN_REV" in_rev "$2" \
    python3 -c "from kdtree.kernels.jit import build_extension; build_extension(['sm_90a'])" > "$LOGS/build-$1.log" 2>&1
}
check_and_time() {
  local name=$1 dir=$2
  case "${KDTREE_NVCC_FLAGS:-}" in
    *KD_SKIP*) ;;  # a measurement build: its outputs are not the op's
    *) step "check-$name" 90 bash -c "$IN_REV" in_rev "$dir" python3 -m kdtree.tools.devcheck --out "$LOGS/check-$name" \
         --quick --variants wgmma --impl none
       grep -E "^(ok |BAD)" "$LOGS/check-$name.log" | awk '{print $1}' | sort | uniq -c
       grep -E "^BAD|Error|error" "$LOGS/check-$name.log" | head -5 ;;
  esac
  step "time-$name" 120 bash -c "$IN_REV" in_rev "$dir" python3 -m kdtree.tools.devcheck --out "$LOGS/time-$name" \
    --time-only --impl none --compare-variants ws,wgmma --configs "$CONFIGS"
  sed -n '/^config /,$p' "$LOGS/time-$name.log"
  grep -E "Error|error" "$LOGS/time-$name.log" | head -3
}
