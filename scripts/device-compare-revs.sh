#!/usr/bin/env bash
# One GPU call that compares the Hopper (wgmma) kernel of several git revisions on one machine:
# each revision is checked out into its own worktree, built for sm_90a through that revision's JIT
# loader, checked against the fp64 oracle (devcheck --quick, wgmma forced) and timed interleaved
# with the ws kernel of the same build (wgmma / ws per config: ws is the anchor that makes the
# revisions' ratios comparable within the call). compute-sanitizer's racecheck then runs the
# sanitizer driver on each revision marked with a trailing '+race'. A revision may carry build flags
# after a colon ("main:-DKD_SKIP=8": a measurement build without tile loads, timed but not checked).
# Experiments live on branches, so main's sources (the phase records' inputs) stay as they are.
# Only main's history reaches the GPU machine, so an experiment travels as its patch: a revision
# that is a .patch file in the repo (plans/experiments/) is HEAD with that patch applied.
#   bash scripts/device-compare-revs.sh c96222d main "main:-DKD_SKIP=8" plans/experiments/v6.8-early-pb-v-b-vote-on-sb.patch+race
# (carry .whl.) Each revision is checked out once (under /tmp/rev-REV), whatever its flag sets. Logs land in $OUT/compare-revs.tgz; the call stays within COMPARE_BUDGET seconds
# (default 300). CONFIGS="H,T,B,L;..." overrides the configs.
set -u
BUDGET=${COMPARE_BUDGET:-300}
START=$(date +%s)
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/scripts/device-env.sh"
LOGS=/tmp/compare-revs; rm -rf "$LOGS"; mkdir -p "$LOGS"
export KDTREE_CACHE_DIR=${KDTREE_CACHE_DIR:-/tmp/kdtree-jit}
CONFIGS=${CONFIGS:-"64,64,1,32768;64,16,8,32768;16,512,1,32768;128,16,1,32768;16,64,1,131072;8,16,1,32768"}
[ $# -gt 0 ] || { echo "usage: $0 REV[+race] ..." >&2; exit 2; }
source "$ROOT/scripts/device-steps.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$LOGS/gpu.txt"

declare -a DIRS NAMES FLAGS RACE
rm -rf /tmp/rev-*; git -C "$ROOT" worktree prune  # nothing of an earlier call on this machine
for spec in "$@"; do
  race=0; case "$spec" in *+race) race=1; spec=${spec%+race} ;; esac
  rev=${spec%%:*}; flags=""; [ "$rev" != "$spec" ] && flags=${spec#*:}
  name=$(safe "$spec"); dir=/tmp/rev-$(safe "$rev")
  if [ ! -d "$dir" ] && ! checkout_rev "$rev" "$dir" > "$LOGS/worktree-$name.log" 2>&1; then
    echo "== $rev: no such revision or patch here (of the branches only main's history reaches the GPU"
    echo "   machine: name an experiment by its patch, plans/experiments/NAME.patch)"
    cat "$LOGS/worktree-$name.log"; continue
  fi
  echo "$spec = $(git -C "$dir" rev-parse --short HEAD)$(git -C "$dir" diff --quiet || echo " + ${rev##*/}")${flags:+ with $flags}"
  DIRS+=("$dir"); NAMES+=("$name"); FLAGS+=("$flags"); RACE+=("$race")
  KDTREE_NVCC_FLAGS="$flags" build_sm90a "$name" "$dir" &
done
wait
echo "built ${#DIRS[@]} builds in $(( $(date +%s) - START )) s"

for i in "${!DIRS[@]}"; do
  export KDTREE_NVCC_FLAGS="${FLAGS[$i]}"
  echo "######## ${NAMES[$i]}"
  check_and_time "${NAMES[$i]}" "${DIRS[$i]}"
done

for i in "${!DIRS[@]}"; do
  [ "${RACE[$i]}" = 1 ] || continue
  export KDTREE_NVCC_FLAGS="${FLAGS[$i]}"
  step "racecheck-${NAMES[$i]}" 150 bash -c "$IN_REV" in_rev "${DIRS[$i]}" compute-sanitizer --tool racecheck \
    --error-exitcode 86 python3 -m kdtree.tools.sanitize_driver
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|WRONG|done" "$LOGS/racecheck-${NAMES[$i]}.log" | tail -3
done
unset KDTREE_NVCC_FLAGS
tar czf "$OUT/compare-revs.tgz" -C "$LOGS" .
echo "done in $(( $(date +%s) - START ))s"
