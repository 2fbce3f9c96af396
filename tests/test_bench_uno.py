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


def test_uno_k_follows_unos_own_checks():
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
    # Q below the draft width L + 1 is refused, and at depth 1 the parent list is one wide.
    assert bench_uno.uno_k(8, 15) is None and bench_uno.uno_k(16, 15) == 8
    assert bench_uno.uno_k(2, 1) == 8 and bench_uno.uno_k(3, 1) is None
    # K = 8 over a vocabulary of 4 is refused.
    assert bench_uno.uno_k(64, 15, vocab=4) is None and bench_uno.uno_k(64, 15, vocab=8) == 8


def no_package(monkeypatch, *names):
    """find_spec as if `names` were not installed (the tests' sglang_release puts stub
    sglang and flashinfer packages on sys.path once it has loaded them)."""
    real = bench_uno.importlib.util.find_spec

    def find_spec(name, *args):
        return None if name in names else real(name, *args)

    monkeypatch.setattr(bench_uno.importlib.util, "find_spec", find_spec)
    for name in names:
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_load_from_the_file_stands_in_torch_topk_and_leaves_no_stub(monkeypatch):
    monkeypatch.delenv("DDTREE_SGLANG_WHEEL", raising=False)
    no_package(monkeypatch, "flashinfer")
    uno = bench_uno.load(str(uno_file()))
    assert uno is not None and uno.build.__name__ == "build_uno_tree_proposal"
    assert uno.source == str(uno_file())
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
    no_package(monkeypatch, "sglang")
    assert bench_uno.load() is None
    with pytest.raises(FileNotFoundError, match="uno: no file"):
        bench_uno.load(str(tmp_path / "missing.whl"))
    empty = tmp_path / "sglang-0.5.23-py3-none-any.whl"
    with zipfile.ZipFile(empty, "w") as z:
        z.writestr("sglang/__init__.py", "")
    with pytest.raises(ValueError, match="has no sglang/kernels"):
        bench_uno.load(str(empty))


def test_a_file_that_fails_to_load_leaves_no_module_behind(tmp_path, monkeypatch):
    bad = tmp_path / "uno_tree.py"
    bad.write_text("import torch\nraise ImportError('not this release')\n")
    with pytest.raises(ImportError, match="not this release"):
        bench_uno.load(str(bad))
    assert "ddtree_bench_uno_tree" not in sys.modules


def test_a_row_without_uno_prints_dashes_under_the_uno_columns():
    row = {"uno": 12.5}
    assert bench_gpu.cell(row, "uno", "{:>8.1f}") == "    12.5"
    assert bench_gpu.cell(row, "uno_topk", "{:>12.1f}") == " " * 11 + "-"
    assert bench_gpu.cell(row, "x_uno", "{:>19.2f}x") == " " * 19 + "-"


def test_the_table_gives_unos_time_without_its_top_k_over_ddtrees_build(capsys):
    base = {"bs": 1, "B": 63, "candidates": 50.0, "select": 60.0, "select_parallel": 60.0,
            "select_best_first": 50.0,
            "emit": 4.0, "build": 116.0, "host_step": 10.0, "torch_topk_lse": 270.0,
            "seed_cpu": 1900.0, "rust_cpu": 30000.0, "match": True, "exact": True,
            "stats": {n: 1.0 for n in bench_gpu.STAT_NAMES}}  # fmt: skip
    with_uno = dict(base, uno_k=8, uno=144.0, uno_topk=60.0, build_at_k=100.0, cand_at_k=70.0,
                    select_at_k=25.0, read_floor=16.0, uno_own_topk=False,
                    uno_topk_same=True)  # fmt: skip
    own = dict(with_uno, uno_own_topk=True, stats_at_k={n: 2.0 for n in bench_gpu.STAT_NAMES})
    bench_gpu.print_table([with_uno, dict(base, B=255), own])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(
        "UNO K | UNO µs | its top-k µs | build@K µs | cand@K µs | select@K µs | UNO−top-k / "
        "build@K | read µs | UNO−top-k+read / build@K | UNO / build@K | top-k == torch"
    )
    assert lines[1].split(" | ")[-11:] == ["    8", "   144.0", "        60.0", "     100.0",
                                           "     70.0", "       25.0", " " * 15 + "0.84x",
                                           "   16.0", " " * 20 + "1.00x", " " * 13 + "-",
                                           " " * 10 + "True"]  # fmt: skip
    assert [c.strip() for c in lines[2].split(" | ")[-11:]] == ["-"] * 11
    # UNO's whole time over ddtree's build only where its top-k is flashinfer's own.
    assert lines[3].split(" | ")[-2].strip() == "1.44x"
    # The selection's diagnostics at UNO's K follow the row's own.
    assert "1 | 63 (K = 8) | 2.00 | 2 | 2" in "\n".join(lines)


def test_the_header_says_once_what_uno_the_run_has(tmp_path, monkeypatch, capsys):
    import argparse

    p = argparse.ArgumentParser()
    monkeypatch.delenv("DDTREE_SGLANG_WHEEL", raising=False)
    no_package(monkeypatch, "sglang")
    assert bench_gpu.load_uno(p, "none") is None
    assert bench_gpu.load_uno(p, None) is None
    assert capsys.readouterr().out.splitlines() == [
        "# UNO: left out (--uno none)",
        "# UNO: not found (--uno PATH, $DDTREE_SGLANG_WHEEL or an installed sglang)",
    ]
    bad = tmp_path / "uno_tree.py"
    bad.write_text("raise ImportError('not this release')\n")
    with pytest.raises(SystemExit):  # a --uno file that does not load is an argument error
        bench_gpu.load_uno(p, str(bad))
    assert "--uno: not this release" in capsys.readouterr().err


def test_a_flashinfer_top_k_library_that_does_not_load_is_named(tmp_path, monkeypatch, capsys):
    import argparse

    monkeypatch.delenv("DDTREE_FLASHINFER_TOPK", raising=False)
    no_package(monkeypatch, "flashinfer")
    missing = tmp_path / "libfi_topk.so"
    with pytest.raises(OSError):
        bench_uno.load(str(uno_file()), str(missing))
    assert "flashinfer" not in sys.modules
    with pytest.raises(SystemExit):  # --uno-topk that does not load is an argument error
        bench_gpu.load_uno(argparse.ArgumentParser(), str(uno_file()), str(missing))
    assert "--uno-topk:" in capsys.readouterr().err
    # A UNO file that is missing is named as --uno's, a top-k library set or not.
    monkeypatch.setenv("DDTREE_FLASHINFER_TOPK", str(missing))
    with pytest.raises(SystemExit):
        bench_gpu.load_uno(argparse.ArgumentParser(), str(tmp_path / "uno_tree.py"))
    err = capsys.readouterr().err
    assert "--uno: uno: no file" in err and "--uno-topk" not in err


FLASHINFER_LIB = __import__("os").environ.get("DDTREE_FLASHINFER_TOPK")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif(not FLASHINFER_LIB, reason="needs $DDTREE_FLASHINFER_TOPK (build.sh)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_flashinfer_top_k_gives_torch_topks_values_and_ids_of_them(dtype):
    # Rows with many ties (values on a coarse grid) and a -inf block: the values equal
    # torch.topk's; every id holds its value (ids of equal values may come in any order).
    g = torch.Generator(device="cuda").manual_seed(5)
    x = (torch.randn(40, 151936, device="cuda", generator=g) * 4).round().to(dtype)
    x[3, :100000] = float("-inf")
    top_k = bench_uno.flashinfer_top_k(FLASHINFER_LIB)
    for k in (8, 16, 63):
        values, ids = top_k(x, k, sorted=True)
        assert torch.equal(values, torch.topk(x, k, sorted=True).values)
        assert ids.dtype == torch.int64 and torch.equal(x.gather(1, ids), values)
        assert all(len(set(row.tolist())) == k for row in ids)
    with pytest.raises(ValueError, match="only UNO's call"):
        top_k(x, 8, sorted=False)
