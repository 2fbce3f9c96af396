"""Smoke test of ``python -m ddtree bench`` at a tiny size: it runs and prints its table."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

TINY = ["--bs", "2", "--vocab", "1000", "--budget", "15", "--depth", "4"]
FAST = ["--repeats", "1", "--ref-requests", "1"]


def test_bench_runs_at_a_tiny_size():
    cmd = [sys.executable, "-m", "ddtree", "bench", *TINY, *FAST]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "stage" in proc.stdout and "reference µs/request" in proc.stdout, proc.stdout
    assert "Rust CPU µs/request" in proc.stdout, proc.stdout
    assert "MISMATCH" not in proc.stdout, proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU answer")
def test_bench_on_cuda_without_a_gpu_exits_2():
    cmd = [sys.executable, "-m", "ddtree", "bench", "--device", "cuda", *TINY, *FAST]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "no CUDA device" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU answer")
def test_loop_bench_without_a_gpu_exits_2():
    cmd = [sys.executable, "-m", "ddtree", "bench", "--loop", "--rounds", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "no CUDA device" in proc.stderr


def test_loop_plot_draws_saved_intervals(tmp_path):
    pytest.importorskip("matplotlib")
    from ddtree import bench_loop

    spans = {"cpu": [[0.0, 5.0], [100.0, 120.0]], "eager": [[0.0, 50.0]]}
    saved = tmp_path / "loop.json"
    saved.write_text(__import__("json").dumps(spans))
    out = tmp_path / "loop.png"
    assert bench_loop.main(["--plot-from", str(saved), "--plot", str(out)]) == 0
    assert out.stat().st_size > 1000
