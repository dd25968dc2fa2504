#!/usr/bin/env bash
# On the GPU machine, one call: the decode benchmark (python -m kdtree.tools.decode) at 32k (B=2) and
# 128k (B=1): kernel, SGLang 0.5.23's Triton kernels as SGLang serves MLA, and the sm_120 path, each
# replaying CUDA graphs and eager, 64 new tokens per request, 5 interleaved rounds, step breakdown;
# then the GPU tests of the graph paths with the time left. Everything lands in $OUT:
#   decode.json (the record, every round; saved after each context), decode-table.txt, decode.png
#   (when matplotlib imports here; else render it on the development machine with
#   `python -m kdtree.tools.decode --from-json decode.json --plot decode.png`), decode.log, gpu-tests.xml.
#   bash scripts/device-decode.sh          carry .whl and .peers-carry (its sglang-kernels.zip holds
#                                          SGLang's extend_attention.py and decode_attention.py)
# DECODE_BUDGET_S (default 380): no round starts past it; DECODE_ARGS: more options for the tool.
set -u
source "$(dirname "$0")/device-env.sh"
LOG="$OUT/decode.log"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$LOG"
_carry="$(cd "$(dirname "$0")/.." && pwd)/.peers-carry"
if [ -f "$_carry/sglang-kernels.zip" ]; then  # SGLang's kernel files, loaded the way the parity gate loads them
  python3 -c "import zipfile; zipfile.ZipFile('$_carry/sglang-kernels.zip').extractall('/tmp/sgl-site')"
  export PYTHONPATH="$PYTHONPATH:/tmp/sgl-site"
fi
python3 -c "from kdtree.bench.decode_triton import load_kernels; print('SGLang kernels:', load_kernels()[2])" 2>&1 \
  | tail -1 | tee -a "$LOG"
python3 -c "import matplotlib; print('matplotlib', matplotlib.__version__)" 2>&1 | tail -1 | tee -a "$LOG"

budget=${DECODE_BUDGET_S:-380}
timeout $((budget + 90)) python3 -m kdtree.tools.decode --context 32k --context 128k --batch 2 --batch 1 \
  --rounds 5 --new-tokens 64 --budget 64 --drafter ddtree --time-budget "$budget" --no-progress \
  --json "$OUT/decode.json" --plot "$OUT/decode.png" ${DECODE_ARGS:-} > "$OUT/decode-table.txt" 2>> "$LOG"
echo "decode benchmark exit $?" | tee -a "$LOG"
cat "$OUT/decode-table.txt" | tee -a "$LOG"

# the graph paths' GPU tests with what is left of the call (it stops at 600 s)
left=$((585 - SECONDS))
if [ "$left" -gt 30 ] && python3 -c "import pytest" 2>/dev/null; then
  timeout "$left" python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/engine/test_engine_draft_graphs_gpu.py \
    tests/bench/test_bench_decode_triton.py tests/bench/test_bench_decode.py tests/engine/test_engine_graph_gpu.py \
    --junitxml="$OUT/gpu-tests.xml" 2>&1 | tail -15 | tee -a "$LOG"
fi
ls "$OUT"
