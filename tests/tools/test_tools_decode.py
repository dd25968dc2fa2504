"""``python -m kdtree.tools.decode`` on the CPU: the whole command with the tiny model (table,
JSON record with every round, PNG), the table and plot again from a saved record, and bad input
refused with one line naming what is wrong."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from kdtree.tools import decode

CPU_ARGS = ["--device", "cpu", "--preset", "tiny", "--context", "24", "--context", "40", "--batch", "2",
            "--backend", "torch", "--backend", "reference", "--baseline", "reference", "--mode", "eager",
            "--rounds", "2", "--new-tokens", "3", "--budget", "4", "--no-progress"]


@pytest.mark.slow
def test_the_command_writes_table_record_and_png(tmp_path, capsys):
    record, png = tmp_path / "decode.json", tmp_path / "out" / "decode.png"
    assert decode.main(CPU_ARGS + ["--json", str(record), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "| 24 | 2 | torch-eager |" in out and "| 40 | 2 | reference-eager |" in out
    got = json.loads(record.read_text())
    assert got["command"].startswith("python -m kdtree.tools.decode --device cpu")
    assert [len(a["rounds"]) for c in got["contexts"] for a in c["arms"].values()] == [2, 2, 2, 2]
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert not list(png.parent.glob(".decode.png.*"))  # written atomically: no temp file left

    png.unlink()
    assert decode.main(["--from-json", str(record), "--plot", str(png)]) == 0
    assert "| 24 | 2 | torch-eager |" in capsys.readouterr().out and png.exists()


@pytest.mark.slow
def test_runs_as_a_module_with_a_progress_bar(tmp_path):
    args = [a for a in CPU_ARGS if a != "--no-progress"]
    done = subprocess.run([sys.executable, "-m", "kdtree.tools.decode", *args[:args.index("--context") + 2],
                           *args[args.index("--batch"):]], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "torch-eager" in done.stdout
    assert "breakdown" in done.stderr and "━" in done.stderr  # rich's bar on stderr, its last label


def test_context_lengths_parse():
    assert decode.context_length("32k") == 32768 and decode.context_length("4096") == 4096
    with pytest.raises(ValueError, match="context length"):
        decode.context_length("abc")
    with pytest.raises(ValueError, match=">= 1"):
        decode.context_length("0")


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert decode.main(["--context", "lots"]) == 2
    assert "context length" in capsys.readouterr().err
    assert decode.main(CPU_ARGS + ["--baseline", "kernel"]) == 2
    assert "--baseline 'kernel' is not one of the backends" in capsys.readouterr().err
    assert decode.main(CPU_ARGS + ["--batch", "3", "--batch", "4", "--batch", "5"]) == 2
    assert "one batch size" in capsys.readouterr().err
    broken = tmp_path / "x.json"
    broken.write_text("{}")
    assert decode.main(["--from-json", str(broken)]) == 2
    assert "not a decode record" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert decode.main(["--device", "cuda"]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err
