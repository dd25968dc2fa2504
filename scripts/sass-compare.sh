#!/usr/bin/env bash
# Compare the kernels' SASS and ptxas resources of two revisions, per arch, without a GPU.
#
#   bash scripts/sass-compare.sh REV_A REV_B [BUILD ...]
#
# REV: a git revision, or "worktree" for the files as they are now (uncommitted edits included).
# BUILD: an arch, optionally with extra nvcc flags after a colon: sm_120, sm_90a,
# "sm_90a:-DKD_SKIP=8". Default: sm_120 sm_90a.
#
# Each revision's kernels/csrc/tree_verify_mla.cu is compiled as kdtree.kernels.jit.compile_arch
# does (that revision's BASE_FLAGS, -DKDTREE_SM90A=1 for sm_90a, -Xptxas -v, -c), its SASS dumped
# with cuobjdump, and the two compared kernel by kernel: instructions with their encodings (control
# bits included, so a register or scheduling change counts), code addresses left out. ptxas'
# resource lines (registers, spills, stack, shared memory) are compared too. Builds are cached
# under $SASS_CACHE (default /tmp/kdtree-sass) by source hash and flags.
# Exit status: 0 every build identical, 1 some differ, 2 bad arguments or a failed build.
# Needs nvcc and cuobjdump (PATH, beside nvcc, $CUOBJDUMP, or the copy triton ships).
set -u
usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 2 ] || usage
REV_A=$1 REV_B=$2; shift 2
[ $# -gt 0 ] || set -- sm_120 sm_90a
for spec in "$@"; do
  case "${spec%%:*}" in sm_[0-9]*) ;; *) echo "error: build '$spec': expected sm_NN[a][:flags], e.g. sm_90a:-DKD_SKIP=8" >&2; exit 2 ;; esac
done
ROOT=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel) || exit 2
CACHE=${SASS_CACHE:-/tmp/kdtree-sass}
NVCC=${NVCC:-nvcc}
command -v "$NVCC" >/dev/null || { echo "error: nvcc not found (set NVCC or put CUDA's bin/ on PATH)" >&2; exit 2; }

find_cuobjdump() {
  [ -n "${CUOBJDUMP:-}" ] && { echo "$CUOBJDUMP"; return; }
  command -v cuobjdump && return
  local beside; beside="$(dirname "$(readlink -f "$(command -v "$NVCC")")")/cuobjdump"
  [ -x "$beside" ] && { echo "$beside"; return; }
  for py in "$ROOT/.venv/bin/python" python3; do
    local t; t=$("$py" -c "import triton, os; print(os.path.join(os.path.dirname(triton.__file__), 'backends/nvidia/bin/cuobjdump'))" 2>/dev/null)
    [ -n "$t" ] && [ -x "$t" ] && { echo "$t"; return; }
  done
  return 1
}
CUOBJ=$(find_cuobjdump) || { echo "error: cuobjdump not found (set CUOBJDUMP)" >&2; exit 2; }

# export REV DIR: the revision's kernels/csrc and its JIT (kernels/jit.py, later kernels/jit/) into DIR
export_rev() {
  local rev=$1 dir=$2 jit=kernels/jit
  mkdir -p "$dir"
  if [ "$rev" = worktree ]; then
    (cd "$ROOT" && tar -cf - kernels/csrc "$jit") | tar -xf - -C "$dir"
  else
    git -C "$ROOT" cat-file -e "$rev:$jit" 2>/dev/null || jit=kernels/jit.py
    git -C "$ROOT" archive "$rev" kernels/csrc "$jit" | tar -xf - -C "$dir" || return 1
  fi
}

# base_flags DIR: the BASE_FLAGS tuple of that revision's JIT
base_flags() {
  local src="$1/kernels/jit/extension.py"
  [ -f "$src" ] || src="$1/kernels/jit.py"
  python3 - "$src" <<'EOF'
import ast, sys
for node in ast.parse(open(sys.argv[1]).read()).body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "BASE_FLAGS" for t in node.targets):
        print(" ".join(ast.literal_eval(node.value)))
EOF
}

# build REV ARCH FLAGS -> prints the cache directory holding ptxas.log and sass.txt
build() {
  local rev=$1 arch=$2 flags=$3 tmp key dir num defs base
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/sass-src.XXXXXX")
  export_rev "$rev" "$tmp" || { echo "error: cannot export revision $rev" >&2; return 1; }
  base=$(base_flags "$tmp")
  key=$( (cd "$tmp" && find kernels/csrc -type f | sort | xargs sha256sum; echo "$base|$arch|$flags|$("$NVCC" --version | tail -1)") \
         | sha256sum | cut -c1-16)
  dir="$CACHE/$key"
  if [ ! -s "$dir/sass.txt" ]; then
    mkdir -p "$dir"
    num=${arch#sm_}
    defs=""; [ "$arch" = sm_90a ] && defs="-DKDTREE_SM90A=1"
    # shellcheck disable=SC2086  # flag lists are meant to split
    if ! timeout 1800 "$NVCC" $base $flags -gencode=arch=compute_$num,code=$arch $defs -Xptxas -v \
        -I"$tmp/kernels/csrc" -c "$tmp/kernels/csrc/tree_verify_mla.cu" -o "$dir/k.o" > "$dir/ptxas.log" 2>&1; then
      echo "error: nvcc failed for $rev $arch $flags:" >&2; tail -20 "$dir/ptxas.log" >&2; rm -rf "$tmp"; return 1
    fi
    "$CUOBJ" -sass "$dir/k.o" > "$dir/sass.tmp" && mv "$dir/sass.tmp" "$dir/sass.txt"
  fi
  rm -rf "$tmp"
  echo "$dir"
}

# normalised SASS: "kernel<TAB>instruction<TAB>encoding" per instruction, code addresses dropped
normalise() {
  awk '/Function :/ { fn = $3 }
       /^[[:space:]]*\/\*[0-9a-f][0-9a-f][0-9a-f][0-9a-f]+\*\// {
         line = $0; sub(/^[[:space:]]*\/\*[0-9a-f]+\*\/[[:space:]]*/, "", line)
         enc = line; sub(/^.*\/\* /, "", enc); sub(/ \*\/.*$/, "", enc)
         sub(/[[:space:]]*\/\*.*$/, "", line); pend = fn "\t" line "\t" enc; next }
       /^[[:space:]]*\/\* 0x[0-9a-f]+ \*\/[[:space:]]*$/ && pend != "" {
         enc = $0; gsub(/[^0-9a-fx]/, "", enc); print pend " " enc; pend = "" }' "$1"
}
# ptxas' resources, one line per kernel: "kernel: Used N registers, ... | N bytes stack frame, ..."
resources() {
  awk '/Function properties for/ { fn = $NF } /stack frame/ { sub(/^[[:space:]]+/, ""); props = $0 }
       /ptxas info *: Used/ { sub(/^.*: Used/, "Used"); print fn ": " $0 " | " props }' "$1"
}

echo "nvcc: $("$NVCC" --version | tail -2 | head -1)"
echo "cuobjdump: $CUOBJ"
echo "A = $REV_A ($( [ "$REV_A" = worktree ] && echo uncommitted || git -C "$ROOT" rev-parse --short "$REV_A")), B = $REV_B ($( [ "$REV_B" = worktree ] && echo uncommitted || git -C "$ROOT" rev-parse --short "$REV_B"))"
status=0
for spec in "$@"; do
  arch=${spec%%:*}; flags=""; [ "$spec" != "$arch" ] && flags=${spec#*:}
  da=$(build "$REV_A" "$arch" "$flags") || exit 2
  db=$(build "$REV_B" "$arch" "$flags") || exit 2
  normalise "$da/sass.txt" > "$da/norm.txt"; normalise "$db/sass.txt" > "$db/norm.txt"
  echo "== $arch${flags:+ $flags}"
  same=1
  for fn in $(cut -f1 "$da/norm.txt" "$db/norm.txt" | sort -u); do
    na=$(awk -F'\t' -v f="$fn" '$1 == f' "$da/norm.txt" | wc -l)
    nb=$(awk -F'\t' -v f="$fn" '$1 == f' "$db/norm.txt" | wc -l)
    nd=$(diff <(awk -F'\t' -v f="$fn" '$1 == f' "$da/norm.txt") <(awk -F'\t' -v f="$fn" '$1 == f' "$db/norm.txt") | grep -c '^[<>]')
    verdict=identical; [ "$nd" -eq 0 ] || { verdict="DIFFERS ($nd lines of the diff)"; same=0; }
    printf '  %-70s %6s -> %6s instructions  %s\n' "$fn" "$na" "$nb" "$verdict"
  done
  if diff <(resources "$da/ptxas.log") <(resources "$db/ptxas.log") > "$db/resources.diff"; then
    echo "  ptxas resources: identical"
    resources "$db/ptxas.log" | sed 's/^/    /'
  else
    echo "  ptxas resources: DIFFER"; sed 's/^/    /' "$db/resources.diff"; same=0
  fi
  [ "$same" -eq 1 ] || { status=1; echo "  diff: diff $da/norm.txt $db/norm.txt"; }
  grep -qE '\bHGMMA\b' "$db/sass.txt" && [ "$arch" != sm_90a ] && { echo "  ERROR: HGMMA in the $arch SASS of B"; status=1; }
done
exit $status
