#!/usr/bin/env bash
# Source on a machine where the package cannot be pip-installed (the GPU machine has no network):
# maps the top-level folders into the `kdtree` namespace through symlinks and puts it on PYTHONPATH.
#   source scripts/device-env.sh
_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_ns="${TMPDIR:-/tmp}/kdtree-ns"
rm -rf "$_ns" && mkdir -p "$_ns/kdtree"
cp "$_repo/kdtree/__init__.py" "$_ns/kdtree/__init__.py"
for _p in orchestrator phases gates kernels engine; do ln -s "$_repo/$_p" "$_ns/kdtree/$_p"; done
[ -d "$_repo/.whl" ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target "$_ns/site" "$_repo"/.whl/*.whl && export PYTHONPATH="$_ns/site:${PYTHONPATH:-}"
export PYTHONPATH="$_ns:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
