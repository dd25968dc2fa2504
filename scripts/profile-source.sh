#!/usr/bin/env bash
# One GPU call: which SASS instructions a kernel variant's warps wait on (ncu PC sampling, source
# page), for the phase-1 shape H,T,B,L (default 64,16,8,32768). Prints the top instructions with
# their stall reasons; the CSV lands in $OUT/source_<variant>.csv.
#   bash scripts/profile-source.sh [H,T,B,L] [variant ...]      (default variant: ws)
set -u
source "$(dirname "$0")/device-env.sh"
OUT=${OUT:-.}; mkdir -p "$OUT"
shape=${1:-64,16,8,32768}
shift || true
variants=${*:-ws}
for v in $variants; do
  echo "---- $v  (H,T,B,L = $shape)"
  rep=/tmp/source_$v
  timeout 200 ncu --clock-control none -k regex:tree_verify_mla -c 1 \
    --section SourceCounters --section WarpStateStats --import-source no -f -o "$rep" \
    python3 -m kdtree.tools.devcheck --profile "$shape" --variant "$v" > "$OUT/ncu_$v.log" 2>&1
  echo "ncu rc=$?"; tail -3 "$OUT/ncu_$v.log"
  ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "$OUT/source_$v.csv" 2> "$OUT/source_$v.err"
  echo "export rc=$?"; head -c 600 "$OUT/source_$v.err"
  python3 "$(dirname "$0")/ncu_source_top.py" "$OUT/source_$v.csv" --top 45
done
