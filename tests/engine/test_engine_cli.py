"""The demo CLI: `python -m kdtree.engine generate`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from kdtree.engine import generate as api_generate
from kdtree.engine.__main__ import main


@pytest.mark.slow
def test_json_output_matches_the_api():
    args = ["generate", "--prompt-ids", "5,17,17,3", "--batch", "3", "--drafter", "ngram", "--budget", "16",
            "--max-new-tokens", "10", "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert set(payload) >= {"tokens", "accepted_per_step", "tokens_per_s", "mean_accepted", "prompts"}
    assert payload["prompts"][0] == [5, 17, 17, 3] and len({len(p) for p in payload["prompts"]}) == 3
    assert payload["tokens"] == api_generate(payload["prompts"], max_new_tokens=10).tokens


@pytest.mark.slow
def test_report_shows_tokens_acceptance_and_speed():
    result = CliRunner().invoke(main, ["generate", "--seed", "3", "--batch", "2", "--drafter", "ddtree",
                                       "--max-new-tokens", "8"])
    assert result.exit_code == 0, result.output
    assert "request 1" in result.output and "mean accepted length" in result.output
    assert "tokens/s" in result.output


def test_bad_input_is_a_usage_error():
    runner = CliRunner()
    assert runner.invoke(main, ["generate", "--prompt-ids", "5,x"]).exit_code == 2
    assert runner.invoke(main, ["generate", "--backend", "flash"]).exit_code == 2
    bad_token = runner.invoke(main, ["generate", "--prompt-ids", "99999"])
    assert bad_token.exit_code == 2 and "outside the vocabulary" in bad_token.output


@pytest.mark.slow
def test_module_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "kdtree.engine", "generate", "--prompt-ids", "1,2,3,1,2",
                          "--drafter", "none", "--max-new-tokens", "4", "--json"],
                         capture_output=True, text=True, check=True)
    assert len(json.loads(out.stdout)["tokens"][0]) == 4


def test_threads_sets_torchs_thread_count(monkeypatch):
    import torch

    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    args = ["generate", "--prompt-ids", "1,2,3", "--drafter", "none", "--max-new-tokens", "2", "--json"]
    assert CliRunner().invoke(main, args + ["--threads", "1"]).exit_code == 0
    assert seen == [1]
    assert CliRunner().invoke(main, args).exit_code == 0 and seen == [1], "no --threads: torch's own choice"
    assert CliRunner().invoke(main, args + ["--threads", "0"]).exit_code == 2


def test_version_and_log_level():
    from kdtree import __version__

    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output
    assert CliRunner().invoke(main, ["generate", "--log-level", "loud"]).exit_code == 2
