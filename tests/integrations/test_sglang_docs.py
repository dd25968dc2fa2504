"""The SGLang launch commands in the README and docs/sglang.md use only flags SGLang 0.5.23 has.

The flags come from `sglang_server_flags_0.5.23.txt`, written by ``scripts/sglang_server_flags.py``
from the SGLang 0.5.23 wheel. With ``SGLANG_WHEEL`` pointing at that wheel, the list is
regenerated and must equal the committed one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLAG_LIST = Path(__file__).with_name("sglang_server_flags_0.5.23.txt")
DOCS = [ROOT / "README.md", ROOT / "docs" / "sglang.md"]
SCRIPT = ROOT / "scripts" / "sglang_server_flags.py"


def known_flags() -> set[str]:
    return {line.strip() for line in FLAG_LIST.read_text().splitlines() if line.startswith("--")}


def launch_commands(text: str) -> list[str]:
    """Each ``sglang.launch_server`` / ``sglang serve`` command of the fenced code blocks, one line each."""
    commands = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        for command in block.replace("\\\n", " ").splitlines():
            if "sglang.launch_server" in command or "sglang serve" in command:
                commands.append(command)
    return commands


def flags_of(command: str) -> list[str]:
    return [token.split("=", 1)[0] for token in command.split() if token.startswith("--")]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_flag_of_every_launch_command_exists_in_sglang_0_5_23(doc):
    commands = launch_commands(doc.read_text())
    assert commands, f"{doc.name} has no launch command"
    flags = known_flags()
    unknown = sorted({f for c in commands for f in flags_of(c)} - flags)
    assert not unknown, f"{doc.name} names flags SGLang 0.5.23 does not have: {unknown}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_launch_commands_make_verify_batches_reach_the_kernel(doc):
    for command in launch_commands(doc.read_text()):
        tokens = command.split()
        value = lambda flag: tokens[tokens.index(flag) + 1]  # noqa: E731
        assert value("--attention-backend") == "triton" and value("--page-size") == "1", command
        assert int(value("--speculative-eagle-topk")) > 1, command
        assert value("--speculative-algorithm") in ("EAGLE", "EAGLE3"), command


def _sglang_prose(doc: Path) -> str:
    text = doc.read_text()
    if doc.name == "README.md":  # the README's SGLang section only: the rest names kdtree's own flags
        text = text[text.index("## Serving with SGLang"):]
        text = text[: text.index("\n## ", 1)]
    return text


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_flag_the_sglang_text_names_exists_too(doc):
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", _sglang_prose(doc)))
    assert {"--attention-backend", "--page-size"} <= named
    assert not sorted(named - known_flags())


def test_the_checker_catches_a_flag_that_does_not_exist():
    command = launch_commands("```bash\npython -m sglang.launch_server \\\n  --page-size 1 --no-such-flag=3\n```\n")
    assert flags_of(command[0]) == ["--page-size", "--no-such-flag"]
    assert set(flags_of(command[0])) - known_flags() == {"--no-such-flag"}


def test_the_flag_list_is_the_real_one():
    flags = known_flags()
    assert FLAG_LIST.read_text().startswith("# flags of `python -m sglang.launch_server`, read from sglang-0.5.23")
    assert len(flags) > 400
    assert {"--model-path", "--attention-backend", "--page-size", "--speculative-eagle-topk", "--tp-size"} <= flags


def _fake_wheel(path: Path) -> Path:
    wheel = path / "sglang-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sglang/srt/server_args.py", (
            "def add_cli_args(parser):\n"
            "    add_cli_args_from_dataclass(parser, ServerArgs)\n"
            "    parser.add_argument('--config', type=str)\n"))
        zf.writestr("sglang/srt/arg_groups/fields/spec.py", (
            "class Spec(msgspec.Struct):\n"
            "    _NS_PATH = 'spec'\n"
            "    speculative_eagle_topk: A[Optional[int], 'help'] = None\n"
            "    draft_path: A[Optional[str], Arg(help='h', aliases=['--draft'])] = None\n"
            "    tp_size: A[int, Arg(help='h', cli_name='--tensor-parallel-size')] = 1\n"
            "    hidden: A[str, Arg(no_cli=True)] = 'x'\n"
            "    plain: int = 0\n"
            "class NotServerArgs(msgspec.Struct):\n"
            "    other_field: A[int, 'help'] = 0\n"))
    return wheel


def test_the_script_reads_fields_aliases_cli_names_and_hand_registered_flags(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), str(_fake_wheel(tmp_path))], capture_output=True,
                          text=True, check=True)
    assert done.stdout.splitlines()[1:] == ["--config", "--draft", "--draft-path", "--speculative-eagle-topk",
                                            "--tensor-parallel-size"]


def test_the_script_refuses_a_wheel_of_another_layout(tmp_path):
    wheel = tmp_path / "other.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sglang/srt/server_args.py", "parser.add_argument('--x')\n")
    done = subprocess.run([sys.executable, str(SCRIPT), str(wheel)], capture_output=True, text=True)
    assert done.returncode == 2 and "layout" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(not os.environ.get("SGLANG_WHEEL"), reason="SGLANG_WHEEL (the sglang 0.5.23 wheel) not set")
def test_the_committed_list_matches_the_wheel():
    done = subprocess.run([sys.executable, str(SCRIPT), os.environ["SGLANG_WHEEL"]], capture_output=True,
                          text=True, check=True)
    assert done.stdout.splitlines()[1:] == FLAG_LIST.read_text().splitlines()[1:]
