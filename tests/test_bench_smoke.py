"""Smoke tests of ``python -m ddtree bench``: it runs at a tiny size; bad flags exit with 2."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
import torch

from ddtree import bench, bench_attention, bench_host, bench_loop
from ddtree.__main__ import build_parser, main

TINY = ["--bs", "2", "--vocab", "1000", "--budget", "15", "--depth", "4"]
FAST = ["--repeats", "1", "--ref-requests", "1"]


def test_bench_runs_at_a_tiny_size():
    cmd = [sys.executable, "-m", "ddtree", "bench", *TINY, *FAST]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "stage" in proc.stdout and "reference µs/request" in proc.stdout, proc.stdout
    assert "Rust CPU µs/request" in proc.stdout, proc.stdout
    assert "MISMATCH" not in proc.stdout, proc.stdout


def test_the_vocab_parallel_bench_runs_two_ranks_at_a_tiny_size():
    cmd = [sys.executable, "-m", "ddtree", "bench", "--vocab-parallel", "--bs", "1", "3",
           "--tp", "2", "--vocab", "64", "--budget", "7", "--depth", "3",
           "--repeats", "1"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split(" | ") for line in proc.stdout.splitlines()[2:]]
    assert [r[:3] for r in rows] == [["1", "2", "7"], ["3", "2", "7"]], proc.stdout
    assert all(r[-1] == "True" for r in rows), proc.stdout
    # Bytes in per rank, per row: K*12 + 21 with partials, V/2 * 2 gathering bf16.
    assert rows[0][3] == f"{3 * (7 * 12 + 21):,}" and rows[0][4] == f"{3 * 32 * 2:,}"
    bad = subprocess.run([*cmd[:5], "--tp", "3", "--vocab", "64"], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "--tp: each must divide" in bad.stderr


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


def exit_code(argv) -> int:
    """``python -m ddtree`` in this process (fast): its return value or SystemExit code."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("mode", [[], ["--loop"], ["--device", "cuda"]])
@pytest.mark.parametrize("flag, value", [("--budget", "100000"), ("--depth", "40")])
def test_limits_are_argument_errors(mode, flag, value, capsys):
    assert exit_code(["bench", *mode, *TINY, *FAST, flag, value]) == 2
    assert flag in capsys.readouterr().err


def test_every_flag_has_help():
    parsers = {
        "bench": argparse.ArgumentParser(),
        "loop": bench_loop.parser(),
        "host": argparse.ArgumentParser(),
        "attention": bench_attention.parser(),
    }
    bench.add_arguments(parsers["bench"])
    bench_host.add_arguments(parsers["host"])
    for name, p in parsers.items():
        for action in p._actions:
            assert action.help, (name, action.option_strings)
    assert exit_code(["bench", "--loop", "--help"]) == 0


def test_top_level_help_names_the_gpu_benchmarks():
    text = " ".join(build_parser().format_help().split())
    assert "--device cuda" in text and "--loop" in text, text
    assert "--attention" in text and "--host" in text, text


def test_bench_help_lists_every_mode_and_shows_the_defaults(capsys):
    assert exit_code(["bench", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--loop", "--attention", "--host", "--vocab-parallel", "--device"):
        assert flag in text, (flag, text)
    assert "--bs BS requests in the batch (default: 64)" in text, text
    assert "(default: cpu)" in text and "(default: bf16)" in text, text
    assert "(default: None)" not in text and "(default: False)" not in text, text


MODES = [["--loop"], ["--host"], ["--attention"], ["--device", "cuda"], ["--vocab-parallel"]]


@pytest.mark.parametrize("mode", MODES)
def test_each_benchmarks_help_shows_its_defaults(mode, capsys):
    assert exit_code(["bench", *mode, "--help"]) == 0
    assert "(default: " in capsys.readouterr().out


def test_loop_plot_draws_saved_intervals(tmp_path):
    pytest.importorskip("matplotlib")
    spans = {"cpu": [[0.0, 5.0], [100.0, 120.0]], "eager": [[0.0, 50.0]]}
    saved = tmp_path / "loop.json"
    saved.write_text(__import__("json").dumps(spans))
    out = tmp_path / "loop.png"
    assert bench_loop.main(["--plot-from", str(saved), "--plot", str(out)]) == 0
    assert out.stat().st_size > 1000
