"""The CUDA kernels are compiled into the extension for both targets (checked without a GPU)."""

from __future__ import annotations

import pytest
import torch

import ddtree._cuda as cuda


def test_every_kernel_module_holds_sm90_and_sm120_code_and_ptx():
    images = set(cuda.images())
    modules = {m for m, _, _ in images}
    portable = {"candidates", "select", "emit", "accept", "commit", "attention"}
    assert modules == portable | {"attention_sm90a"}
    # The Hopper attention (wgmma) is sm_90a machine code alone, listed as arch 90.
    assert {(a, p) for m, p, a in images if m == "attention_sm90a"} == {(90, False)}
    for module in portable:
        for arch in (90, 120):
            assert (module, False, arch) in images, f"{module}: no sm_{arch} machine code"
            assert (module, True, arch) in images, f"{module}: no compute_{arch} PTX"


# sm_120 (RTX PRO 6000 Blackwell): 64 K registers, 100 KB of shared memory an SM, at most
# 99 KB of it (101,376 bytes) dynamic in one block. No such GPU runs here, so its cubin is
# read instead (ptxas's figures as written into the ELF).
SM120_REGISTERS = 65536
SM120_SMEM_PER_SM = 100 * 1024
SM120_SMEM_PER_BLOCK = 99 * 1024


def test_the_sm120_attention_tiles_fit_an_sm120_sm():
    kernels = {k[0]: k[1:] for k in cuda.kernel_resources("attention", 120)}
    tiles = cuda.attention_tiles()
    assert {t[0] for t in tiles} >= {"d64", "d128", "d256", "d576", "d576vk"}
    for name, threads, smem in tiles:
        for dtype in ("bf16", "f16"):
            registers, max_threads, frame, static = kernels[f"ddtree_attention_{dtype}_{name}"]
            where = f"{dtype}_{name}: {registers} registers x {threads} threads, {smem} B"
            assert max_threads == threads, where  # compiled for the threads it is launched with
            assert registers * threads <= SM120_REGISTERS, where
            assert smem <= SM120_SMEM_PER_BLOCK, where
            assert smem + static <= SM120_SMEM_PER_SM, where
            # A spill would put local-memory traffic on the hot loop: none spills (the MLA
            # tile, at 254 registers, is the closest).
            assert frame == 0, f"{where}, {frame} B of frame"


def test_the_greedy_accept_kernels_do_not_spill():
    """The greedy walk's argmax keeps eight loads in flight on sm_90 and one on sm_120, the
    most each target holds in its 64 registers without a frame (kernels/README.md)."""
    for arch in (90, 120):
        kernels = {k[0]: k[1:] for k in cuda.kernel_resources("accept", arch)}
        for dtype in ("f32", "f16", "bf16"):
            registers, _, frame, _ = kernels[f"ddtree_accept_{dtype}"]
            assert registers <= 64 and frame == 0, (arch, dtype, registers, frame)


def test_kernel_resources_read_the_cubin_for_each_target():
    for arch in (90, 120):
        ks = cuda.kernel_resources("candidates", arch)
        assert ks and all(r > 0 and t > 0 for _, r, t, _, _ in ks), arch
    assert cuda.kernel_resources("attention_sm90a", 120) is None  # Hopper-only code
    assert cuda.kernel_resources("no_such_module", 90) is None


def test_import_works_without_a_driver():
    import ddtree

    assert ddtree.build_tree is not None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-driver answer")
def test_cuda_use_without_a_driver_raises_runtime_error():
    from ddtree import _core

    with pytest.raises(RuntimeError, match="driver"):
        _core.cuda_prepare(0)
