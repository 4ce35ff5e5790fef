"""Entry points: the agent CLI's flags and env twins, and the GPU benchmark's no-GPU refusal."""

from __future__ import annotations

import pytest
import torch

from benchmarks.gpu_suspend import checksum, gbps
from benchmarks.gpu_suspend import main as gpu_suspend_main
from dra_driver.agent.cli import build_parser, main


def test_every_flag_has_an_env_twin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    help_text = capsys.readouterr().out
    flags = [a for a in build_parser()._actions if a.option_strings and a.dest != "help"]
    for a in flags:
        env = "ROSE_AGENT_" + a.dest.upper()
        assert env in help_text.replace("\n", " ").replace(" ", "") or env in help_text, env
    monkeypatch.setenv("ROSE_AGENT_BACKENDS", "simulated")
    monkeypatch.setenv("ROSE_AGENT_HOST_MEMORY_BUDGET_BYTES", "123")
    args = build_parser().parse_args([])
    assert args.backends == "simulated" and args.host_memory_budget_bytes == 123
    assert build_parser().parse_args(["--backends", "cooperative"]).backends == "cooperative"


def test_bad_configuration_is_refused_with_a_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--backends", "warp-drive", "--host-memory-budget-bytes", "1"]) == 2
    assert "unknown suspend backend" in capsys.readouterr().err
    assert main(["--backends", "cuda-checkpoint", "--libcuda", "/nonexistent/libcuda.so.1"]) == 2
    assert "needs the NVIDIA driver's libcuda" in capsys.readouterr().err


def test_benchmark_refuses_without_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert gpu_suspend_main(["--sizes-gib", "0.01"]) == 2
    out = capsys.readouterr()
    assert "no CUDA GPU is visible" in out.err and out.out == ""


def test_benchmark_checksum_is_position_sensitive() -> None:
    x = torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[0:8], y[8:16] = x[8:16].clone(), x[0:8].clone()  # swap two words: the plain sum is unchanged
    assert checksum(x, chunk_elems=100) == checksum(x.clone(), chunk_elems=7)
    assert checksum(x)[0] == checksum(y)[0] and checksum(x)[1] != checksum(y)[1]
    assert gbps(55_000_000_000, 1.0) == pytest.approx(55.0)
