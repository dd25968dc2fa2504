#!/usr/bin/env bash
# Source on a machine where the package cannot be pip-installed (the GPU machine has no network):
# maps the top-level folders into the `kdtree` namespace through (git-ignored) symlinks in kdtree/
# and puts the repo on PYTHONPATH; wheels carried in .whl/ are installed into a private target.
#   source scripts/device-env.sh
_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for _p in orchestrator phases gates kernels engine tools; do ln -sfn "../$_p" "$_repo/kdtree/$_p"; done
if [ -d "$_repo/.whl" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/kdtree-site "$_repo"/.whl/*.whl && export PYTHONPATH="/tmp/kdtree-site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$_repo:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
