"""The step profiler on the CPU: it times a real verify step and names the host operators."""

from kdtree.tools import step_profile


def test_profiles_a_cpu_verify_step_and_names_its_host_ops(tmp_path, capsys):
    out = tmp_path / "profile.json"
    rc = step_profile.main(["--preset", "tiny", "--context", "64", "--batch", "2", "--tree", "8",
                            "--device", "cpu", "--json", str(out)])
    assert rc == 0
    import json

    got = json.loads(out.read_text())["L64 torch"]
    assert got["wall_ms"] > 0 and got["host_ms"] > 0
    names = [op["op"] for op in got["top_host_ops"]]
    assert any("mm" in n or "matmul" in n or "linear" in n for n in names), names
    assert "L=64 B=2 T=8 torch" in capsys.readouterr().out


def test_refuses_cuda_without_a_gpu(capsys):
    import torch

    if torch.cuda.is_available():
        return
    assert step_profile.main(["--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
