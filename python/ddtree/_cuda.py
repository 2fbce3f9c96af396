"""The GPU path: validated CUDA tensors go to ``ddtree._core``'s kernels by pointer, launched
on PyTorch's current stream of their device. Nothing here synchronizes or allocates."""

from __future__ import annotations

import torch

from . import _core
from ._types import Tree


def device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def raw_stream(index: int) -> int:
    """PyTorch's current stream of device ``index`` (the capture stream inside a graph) as a
    raw handle; the private binding is a few times cheaper than ``torch.cuda.current_stream``
    on the per-step path."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return get(index) if get is not None else torch.cuda.current_stream(index).cuda_stream


def launch_on(device: torch.device) -> tuple[int, int]:
    """(device index, PyTorch's current raw stream there): where a kernel launches."""
    index = device_index(device)
    return index, raw_stream(index)


def prepare(device: torch.device) -> None:
    """Loads the kernels on ``device`` (not allowed later, inside a graph capture)."""
    _core.cuda_prepare(device_index(device))


def new_scratch(rows: int, device) -> dict:
    """Per-row eligible counts and NaN/+inf flags of stage 1 (int32)."""
    return {
        "eligible": torch.empty(rows, dtype=torch.int32, device=device),
        "bad": torch.empty(rows, dtype=torch.int32, device=device),
    }


def launch_build(tree: Tree, scratch: dict, draft_logits, root_tokens, prefix_lens, budget, k,
                 stages=7) -> None:  # fmt: skip
    """SPEC stages 1–3 into the tensors of ``tree`` (three kernel launches; ``scratch`` holds
    the per-row int32 tensors of ``new_scratch``; ``stages`` is a bit mask 1 | 2 | 4 the
    benchmark uses to time one stage at a time, with 8 forcing the best-first selection, 16
    stage 1 one block a row and 32 the parallel selection, each the same tree)."""
    _core.cuda_build_tree(
        *launch_on(tree.device),
        draft_logits,
        root_tokens,
        prefix_lens,
        budget,
        k,
        tree,
        scratch,
        stages,
    )


def full_mask(ancestor_bits, seq_lens, out, write_prefix: bool) -> None:
    bs, q, _ = ancestor_bits.shape
    _core.cuda_full_mask(
        *launch_on(ancestor_bits.device),
        ancestor_bits,
        seq_lens,
        bs,
        q,
        write_prefix,
        out,
        out.numel(),
    )


def accept_into(tree: Tree, target_logits, acc, sampling) -> None:
    """SPEC stage 4 into ``acc`` (one kernel launch, plus the generator's advance when
    sampling); ``sampling`` is a ``SamplingState`` or None (greedy)."""
    _core.cuda_accept(*launch_on(tree.device), target_logits, tree, acc, sampling)


def images() -> list[tuple[str, bool, int]]:
    """(module, is_ptx, arch) of every kernel image compiled into this build."""
    return _core.cuda_images()


def kernel_resources(module: str, arch: int) -> list[tuple[str, int, int, int, int]] | None:
    """(kernel, registers, max_threads, frame_bytes, static_smem) of every kernel in a
    module's machine code for ``arch`` (90, 120), read from the cubin compiled into this
    build; None when it holds none."""
    return _core.cuda_kernel_resources(module, arch)


def attention_tiles() -> list[tuple[str, int, int]]:
    """(name, threads, dynamic shared memory bytes) of every portable attention tile."""
    return _core.cuda_attention_tiles()


def maps_host(device: torch.device, pinned: torch.Tensor) -> bool:
    """Whether the driver maps a pinned host tensor into the device's address space."""
    return _core.cuda_maps_host(device_index(device), pinned)
