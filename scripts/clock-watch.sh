#!/usr/bin/env bash
# One GPU call: the SM clock, power draw and throttle reasons while the kernel runs back to back
# for a few seconds on one shape (default 64,16,8,32768), for each variant named: tells a power-
# or clock-limited kernel from a latency-limited one.
#   bash scripts/clock-watch.sh [H,T,B,L] [variant ...]
set -u
source "$(dirname "$0")/device-env.sh"
shape=${1:-64,16,8,32768}
shift || true
for v in ${*:-ws}; do
  echo "---- $v ($shape)"
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader -lms 250 > /tmp/clocks_$v.txt &
  smi=$!
  python3 - "$shape" "$v" <<'PY'
import sys, time, torch
from kdtree.bench.forced import forced_kernel
from kdtree.bench.cases import call, make_case
H, T, B, L = (int(x) for x in sys.argv[1].split(","))
tree_verify_mla = forced_kernel(sys.argv[2])
case = make_case(H, [(T, L)] * B, "random", 1, pool_slots=max(4 * B * (L + T), 1 << 20))
call(tree_verify_mla, case); torch.cuda.synchronize()
t0 = time.time(); n = 0
a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
while time.time() - t0 < 4.0:
    a.record(); [call(tree_verify_mla, case) for _ in range(20)]; b.record(); b.synchronize(); n += 20
print(f"{n} calls, last 20: {a.elapsed_time(b) / 20:.3f} ms/call")
PY
  kill $smi; sleep 0.3
  sort /tmp/clocks_$v.txt | uniq -c | sort -rn | head -6
done
