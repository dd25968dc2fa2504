#!/usr/bin/env python3
"""SGLang 0.5.23's Triton attention kernel files, taken from its PyPI wheel: ``extend_attention.py``
(target verify, prefill), ``decode_attention.py`` (decode), the two files they import and the
wheel's METADATA, about 60 KiB of the 39 MB wheel.

    python3 scripts/fetch-sglang-kernels.py DIR          the files under DIR (a package tree: put DIR
                                                         on PYTHONPATH; `kdtree.integrations.sglang.
                                                         sglang_kernels` loads them with the package
                                                         __init__s skipped)
    python3 scripts/fetch-sglang-kernels.py --zip FILE   the same files as a zip (the device kit's
                                                         .peers-carry/sglang-kernels.zip)

`make test` fetches them into .kdtree-cache/sglang-kernels, where the interpreted tests of the Triton
backend find them (they skip, saying so, when the index cannot be reached). DIR is written whole or
not at all. Exit 1 with the reason when the wheel cannot be had.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

VERSION = "0.5.23"
KEEP = ("sglang/kernels/ops/attention/extend_attention.py", "sglang/kernels/ops/attention/decode_attention.py",
        "sglang/kernels/ops/attention/score_mod.py", "sglang/srt/environ.py", f"sglang-{VERSION}.dist-info/METADATA")
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")
DONE = ".complete"  # DIR's marker: the version whose files it holds


def download_wheel(into: str) -> str:
    """The wheel's path, downloaded with pip (no dependencies) into `into`."""
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", *platforms, "-d", into, f"sglang=={VERSION}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = glob.glob(os.path.join(into, f"sglang-{VERSION}-*.whl"))
    if done.returncode != 0 or not wheels:
        raise SystemExit(f"fetch-sglang-kernels: pip could not download sglang=={VERSION}: "
                         f"{(done.stderr or done.stdout).strip()[-500:]}")
    return wheels[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", nargs="?", help="write the files under this folder")
    parser.add_argument("--zip", help="write the files into this zip instead")
    args = parser.parse_args()
    if bool(args.dir) == bool(args.zip):
        parser.error("give a folder or --zip FILE (one of them)")
    if args.dir and open_marker(args.dir) == VERSION:
        print(f"{args.dir}: SGLang {VERSION}'s kernel files are there already")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(download_wheel(tmp)) as wheel:
            files = {name: wheel.read(name) for name in KEEP}
        if args.zip:
            part = args.zip + ".tmp"
            with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as out:
                for name, data in files.items():
                    out.writestr(name, data)
            os.replace(part, args.zip)
            print(f"{args.zip}: {len(files)} files of sglang {VERSION}")
            return 0
        parent = os.path.dirname(os.path.abspath(args.dir))
        os.makedirs(parent, exist_ok=True)
        staged = tempfile.mkdtemp(prefix=".sglang-kernels-", dir=parent)
        for name, data in files.items():
            os.makedirs(os.path.join(staged, os.path.dirname(name)), exist_ok=True)
            with open(os.path.join(staged, name), "wb") as f:
                f.write(data)
        with open(os.path.join(staged, DONE), "w") as f:
            f.write(VERSION)
        shutil.rmtree(args.dir, ignore_errors=True)
        os.replace(staged, args.dir)
    print(f"{args.dir}: {len(files)} files of sglang {VERSION}")
    return 0


def open_marker(folder: str) -> str:
    try:
        with open(os.path.join(folder, DONE)) as f:
            return f.read().strip()
    except OSError:
        return ""


if __name__ == "__main__":
    sys.exit(main())
