#!/usr/bin/env bash
# Source on a machine where the package cannot be pip-installed (the GPU machine has no network):
# maps the top-level folders into the `kdtree` namespace through (git-ignored) symlinks in kdtree/
# and puts the repo on PYTHONPATH; wheels carried in .whl/ and .whl-sglang/ (scripts/fetch-device-kit.sh)
# are installed into a private target.
#   source scripts/device-env.sh
_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for _p in orchestrator phases gates kernels engine tools bench integrations constraints; do [ -d "$_repo/$_p" ] && ln -sfn "../$_p" "$_repo/kdtree/$_p"; done
_wheels=$(ls "$_repo"/.whl/*.whl "$_repo"/.whl-sglang/*.whl 2>/dev/null)
if [ -n "$_wheels" ]; then  # installed once per machine and wheel set (the scripts source this per step)
  _set=$(basename -a $_wheels | sort | md5sum | cut -c1-16)
  if [ "$(cat /tmp/kdtree-site/.kdtree-wheels 2>/dev/null)" != "$_set" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/kdtree-site $_wheels && echo "$_set" > /tmp/kdtree-site/.kdtree-wheels
  fi
  export PYTHONPATH="/tmp/kdtree-site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$_repo:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
export OUT=${OUT:-/tmp/kdtree-out}  # what the device tool brings back
mkdir -p "$OUT"
export KDTREE_CACHE_DIR=${KDTREE_CACHE_DIR:-/tmp/kdtree-jit}  # JIT builds, kept while the machine is warm
