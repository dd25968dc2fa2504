#!/usr/bin/env bash
# One GPU call that records the kernel's timeline for several revisions: each revision is checked
# out into its own worktree (a revision may be a plans/experiments/*.patch, applied to HEAD: only
# main's history reaches the GPU machine), its sm_90a extension built with -DKD_TIMELINE=1 (plus the
# revision's own flags after a colon), and `python -m kdtree.tools.timeline run` launches each config
# once per variant, writing the stamps of the launch's first CTAs (one per SM and more) to
#   timeline/NAME/VARIANT/timeline-H-T-B-L.npz (packed into $OUT/timeline.tgz), its picture (.png, where matplotlib is
#   installed; else render it on the development machine: python -m kdtree.tools.timeline render)
#   and summary.jsonl (the figures of each SM's first CTA)
# and the build and run logs to $OUT/timeline-logs.tgz. A revision needs the timeline build
# (kernels/csrc/timeline.cuh); one without it is skipped, saying so.
#   bash scripts/device-timeline.sh main plans/experiments/v6.9-lean-loop-sm90a.patch
# (carry .whl.) CONFIGS="H,T,B,L;..." (default 64,64,1,32768;16,512,1,32768), TIMELINE_VARIANTS
# (default "wgmma"; e.g. "wgmma ws"), TIMELINE_TILES (tiles drawn, default 2:8), TIMELINE_BUDGET
# seconds for the call (default 300).
set -u
BUDGET=${TIMELINE_BUDGET:-300}
START=$(date +%s)
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/scripts/device-env.sh"
LOGS=/tmp/timeline-logs; rm -rf "$LOGS"; mkdir -p "$LOGS"
export KDTREE_CACHE_DIR=${KDTREE_CACHE_DIR:-/tmp/kdtree-jit}
CONFIGS=${CONFIGS:-"64,64,1,32768;16,512,1,32768"}
VARIANTS=${TIMELINE_VARIANTS:-wgmma}
TILES=${TIMELINE_TILES:-2:8}
[ $# -gt 0 ] || { echo "usage: $0 REV[:FLAGS] ..." >&2; exit 2; }
source "$ROOT/scripts/device-steps.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$LOGS/gpu.txt"

declare -a DIRS NAMES FLAGS
rm -rf /tmp/tlrev-*; git -C "$ROOT" worktree prune
for spec in "$@"; do
  rev=${spec%%:*}; flags=""; [ "$rev" != "$spec" ] && flags=${spec#*:}
  name=$(safe "$spec"); dir=/tmp/tlrev-$(safe "$rev")
  if [ ! -d "$dir" ] && ! checkout_rev "$rev" "$dir" > "$LOGS/worktree-$name.log" 2>&1; then
    echo "== $rev: no such revision or patch here (only main's history reaches the GPU machine: name an"
    echo "   experiment by its patch, plans/experiments/NAME.patch)"; cat "$LOGS/worktree-$name.log"; continue
  fi
  if [ ! -f "$dir/kernels/csrc/timeline.cuh" ] || [ ! -f "$dir/tools/timeline.py" ]; then
    echo "== $spec: skipped, it has no timeline build (kernels/csrc/timeline.cuh, tools/timeline.py)"; continue
  fi
  echo "$spec = $(git -C "$dir" rev-parse --short HEAD)$(git -C "$dir" diff --quiet || echo " + ${rev##*/}")${flags:+ with $flags}"
  DIRS+=("$dir"); NAMES+=("$name"); FLAGS+=("-DKD_TIMELINE=1${flags:+ $flags}")
  KDTREE_NVCC_FLAGS="-DKD_TIMELINE=1${flags:+ $flags}" build_sm90a "$name" "$dir" &
done
wait
echo "built ${#DIRS[@]} timeline builds in $(( $(date +%s) - START )) s"

for i in "${!DIRS[@]}"; do
  export KDTREE_NVCC_FLAGS="${FLAGS[$i]}"
  for v in $VARIANTS; do
    dest="$OUT/timeline/${NAMES[$i]}/$v"
    step "timeline-${NAMES[$i]}-$v" 150 bash -c "$IN_REV" in_rev "${DIRS[$i]}" python3 -m kdtree.tools.timeline run \
      --configs "$CONFIGS" --variant "$v" --out "$dest" --tiles "$TILES" --revision "${NAMES[$i]}"
    grep -E "^H[0-9]|Error|error" "$LOGS/timeline-${NAMES[$i]}-$v.log" | head -8
  done
done
unset KDTREE_NVCC_FLAGS
tar czf "$OUT/timeline-logs.tgz" -C "$LOGS" .
# files deeper than two folders under $OUT do not come back from the GPU machine: one archive instead
[ -d "$OUT/timeline" ] && tar czf "$OUT/timeline.tgz" -C "$OUT" timeline && rm -rf "$OUT/timeline"
echo "done in $(( $(date +%s) - START ))s"
