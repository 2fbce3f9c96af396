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


def test_import_works_without_a_driver():
    import ddtree

    assert ddtree.build_tree is not None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-driver answer")
def test_cuda_use_without_a_driver_raises_runtime_error():
    from ddtree import _core

    with pytest.raises(RuntimeError, match="driver"):
        _core.cuda_prepare(0)
