"""``python -m kdtree.constraints sglang|test``: the path of that constraint file."""

from __future__ import annotations

import sys

from kdtree.constraints import NAMES, path


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in NAMES:
        sys.stderr.write(f"usage: python -m kdtree.constraints {{{'|'.join(NAMES)}}}\n")
        return 2
    sys.stdout.write(f"{path(argv[0])}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
