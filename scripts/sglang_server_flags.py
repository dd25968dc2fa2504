"""List every command-line flag of SGLang's server (``python -m sglang.launch_server``) from its wheel.

    pip download sglang==0.5.23 --no-deps -d /tmp/sgl
    python scripts/sglang_server_flags.py /tmp/sgl/sglang-0.5.23-*.whl > tests/integrations/sglang_0.5.23_server_flags.txt

Reads the wheel without installing or importing it (SGLang needs a CUDA machine to import):
SGLang 0.5.23 derives most flags from the annotated fields of the namespace classes in
``sglang/srt/arg_groups/fields/`` (``A[T, "help"]`` or ``A[T, Arg(...)]``: ``--field-name``, or
``Arg(cli_name=...)``, plus ``Arg(aliases=[...])``; ``Arg(no_cli=True)`` has none) and registers
the rest by hand with ``parser.add_argument("--...")`` in ``sglang/srt/server_args.py``. Prints
the sorted flags, one a line, after a header naming the wheel. Exit 2 with one line when the
wheel does not have that layout (another SGLang version: check what changed before trusting it).
"""

from __future__ import annotations

import ast
import sys
import zipfile
from pathlib import PurePosixPath

FIELDS_DIR = "sglang/srt/arg_groups/fields/"
SERVER_ARGS = "sglang/srt/server_args.py"


def _annotation_arg(annotation: ast.expr):
    """The metadata of an ``A[T, ...]`` annotation: an ``Arg(...)`` call, a help string, or None."""
    if not (isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name)
            and annotation.value.id in ("A", "Annotated") and isinstance(annotation.slice, ast.Tuple)):
        return None
    for meta in annotation.slice.elts[1:]:
        if isinstance(meta, ast.Call) and isinstance(meta.func, ast.Name) and meta.func.id == "Arg":
            return meta
        if isinstance(meta, (ast.Constant, ast.JoinedStr, ast.BinOp)):  # help text, maybe concatenated
            return meta
    return None


def _keyword(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name:
            return ast.literal_eval(kw.value)
    return None


def field_flags(source: str) -> set[str]:
    """Flags of the annotated fields of every class with a ``_NS_PATH`` in one fields module."""
    flags: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        if not any(isinstance(s, ast.Assign) and any(getattr(t, "id", "") == "_NS_PATH" for t in s.targets)
                   for s in node.body):
            continue
        for stmt in node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            meta = _annotation_arg(stmt.annotation)
            if meta is None:
                continue
            name = "--" + stmt.target.id.replace("_", "-")
            if isinstance(meta, ast.Call):
                if _keyword(meta, "no_cli"):
                    continue
                name = _keyword(meta, "cli_name") or name
                flags.update(_keyword(meta, "aliases") or [])
            flags.add(name)
    return flags


def add_argument_flags(source: str) -> set[str]:
    """The ``--flags`` of every ``*.add_argument("--...", ...)`` call in a module."""
    flags: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            flags.update(a.value for a in node.args
                         if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--"))
    return flags


def server_flags(wheel: str) -> set[str]:
    """Every flag SGLang's server parser accepts, read from the wheel (ValueError: unknown layout)."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        fields = [n for n in names if n.startswith(FIELDS_DIR) and n.endswith(".py")]
        if SERVER_ARGS not in names or not fields:
            raise ValueError(f"{wheel}: no {SERVER_ARGS} with {FIELDS_DIR}*.py (not SGLang 0.5.23's layout)")
        server_args = zf.read(SERVER_ARGS).decode()
        if "add_cli_args_from_dataclass" not in server_args:
            raise ValueError(f"{wheel}: {SERVER_ARGS} does not derive flags from fields (another layout)")
        flags = add_argument_flags(server_args)
        for name in fields:
            flags |= field_flags(zf.read(name).decode())
    return flags


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/sglang_server_flags.py SGLANG_WHEEL", file=sys.stderr)
        return 2
    try:
        flags = server_flags(argv[0])
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        print(f"sglang_server_flags: {exc}", file=sys.stderr)
        return 2
    print(f"# flags of `python -m sglang.launch_server`, read from {PurePosixPath(argv[0]).name} "
          "by scripts/sglang_server_flags.py")
    print("\n".join(sorted(flags)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
