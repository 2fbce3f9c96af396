"""The UNO columns of ``python -m ddtree bench --device cuda``: SGLang 0.5.23's uno_tree.py
loaded alone (from the file, a wheel, or not at all) and UNO's limits on the shapes."""

from __future__ import annotations

import sys
import zipfile

import pytest
import sglang_release
import torch

from ddtree import bench_gpu, bench_uno


def uno_file():
    return sglang_release.extract() / bench_uno.MEMBER


def test_uno_k_follows_unos_limits():
    # Q = 64 fits K = 8 (parent list 8·14 + 1 = 113 wide); Q = 128 needs K = 16 (Q·K = 2048).
    assert bench_uno.uno_k(64, 15) == 8
    assert bench_uno.uno_k(128, 15) == 16
    assert bench_uno.uno_k(129, 15) is None  # over 128 nodes
    assert bench_uno.uno_k(256, 15) is None
    # Depth 3: K = 8 holds up to 8·2 + 1 = 17 nodes under the root, K = 16 up to 33.
    assert bench_uno.uno_k(18, 3) == 8
    assert bench_uno.uno_k(19, 3) == 16
    assert bench_uno.uno_k(34, 3) == 16
    assert bench_uno.uno_k(35, 3) is None
    assert bench_uno.uno_k(2, 1) == 8


def test_load_from_the_file_stands_in_torch_topk_and_leaves_no_stub(monkeypatch):
    monkeypatch.delenv("DDTREE_SGLANG_WHEEL", raising=False)
    had_flashinfer = "flashinfer" in sys.modules
    uno = bench_uno.load(str(uno_file()))
    assert uno is not None and uno.build.__name__ == "build_uno_tree_proposal"
    assert uno.source == str(uno_file())
    if not had_flashinfer:
        assert uno.topk_name == "torch.topk (flashinfer not installed)"
        assert "flashinfer" not in sys.modules  # the stand-in served the import only
    x = torch.randn(3, 50)
    values, ids = uno.topk(x, 4, sorted=True)
    want = torch.topk(x, 4, dim=-1)
    assert torch.equal(values, want.values) and torch.equal(ids, want.indices)
    assert ids.dtype == torch.int64


def test_load_from_a_wheel_and_from_the_environment(tmp_path, monkeypatch):
    wheel = tmp_path / "sglang-0.5.23-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(bench_uno.MEMBER, uno_file().read_text())
    monkeypatch.setenv("DDTREE_SGLANG_WHEEL", str(wheel))
    uno = bench_uno.load()
    assert uno is not None and uno.source == f"{wheel.name}:{bench_uno.MEMBER}"


def test_without_a_source_there_is_no_uno_and_a_bad_path_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("DDTREE_SGLANG_WHEEL", raising=False)
    if bench_uno.importlib.util.find_spec("sglang") is None:
        assert bench_uno.load() is None
    with pytest.raises(FileNotFoundError, match="uno: no file"):
        bench_uno.load(str(tmp_path / "missing.whl"))


def test_a_row_without_uno_prints_dashes_under_the_uno_columns():
    row = {"uno": 12.5}
    assert bench_gpu.cell(row, "uno", "{:>8.1f}") == "    12.5"
    assert bench_gpu.cell(row, "uno_topk", "{:>12.1f}") == " " * 11 + "-"
    assert bench_gpu.cell(row, "x_uno", "{:>19.2f}x") == " " * 19 + "-"
