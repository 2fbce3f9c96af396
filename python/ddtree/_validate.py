"""Argument checks, run before any work: each failure names the argument it is about."""

from __future__ import annotations

import numbers
import os

import torch

from . import _core

LOGIT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_DEPTH = _core.MAX_DEPTH
MAX_BUDGET = _core.MAX_BUDGET
INT64_MAX = torch.iinfo(torch.int64).max


def tensor(name: str, x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    return x


def logits(name: str, x, *, max_depth: int | None = None) -> torch.Tensor:
    """A ``[rows, L, V]`` float logits tensor (strided views allowed)."""
    x = tensor(name, x)
    if x.dtype not in LOGIT_DTYPES:
        raise TypeError(f"{name}: dtype must be bfloat16, float16 or float32, got {x.dtype}")
    if x.dim() != 3:
        raise ValueError(f"{name}: must be 3-D [bs, L, V], got shape {tuple(x.shape)}")
    for axis, what in enumerate(("batch size", "depth L", "vocabulary V")):
        if x.shape[axis] < 1:
            raise ValueError(f"{name}: {what} must be ≥ 1, got shape {tuple(x.shape)}")
    if max_depth is not None and x.shape[1] > max_depth:
        raise ValueError(f"{name}: depth L = {x.shape[1]} exceeds the limit {max_depth}")
    return x


def index_vector(name: str, x, n: int, device: torch.device) -> torch.Tensor:
    """An int64 ``[n]`` vector on ``device`` (a list of ints is accepted too), contiguous."""
    if not isinstance(x, torch.Tensor):
        if isinstance(x, (list, tuple)) and all(isinstance(v, numbers.Integral) for v in x):
            x = torch.tensor(x, dtype=torch.int64, device=device)
        else:
            raise TypeError(f"{name}: expected an int64 torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.int64:
        raise TypeError(f"{name}: dtype must be int64, got {x.dtype}")
    if x.shape != (n,):
        raise ValueError(f"{name}: shape must be [{n}], got {list(x.shape)}")
    same_device(name, x, device)
    return x.contiguous()


def same_device(name: str, x: torch.Tensor, device: torch.device) -> None:
    if x.device != device:
        raise ValueError(f"{name}: is on {x.device}, the other inputs are on {device}")


def positive_int(name: str, x, *, limit: int | None = None) -> int:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(x).__name__}")
    if x < 1:
        raise ValueError(f"{name}: must be ≥ 1, got {x}")
    if limit is not None and x > limit:
        raise ValueError(f"{name}: must be ≤ {limit}, got {x}")
    return int(x)


def optional_positive_int(name: str, x) -> int | None:
    return None if x is None else positive_int(name, x)


def non_negative(name: str, x: torch.Tensor) -> None:
    """Checked on the host, so only for CPU tensors (a CUDA check would sync)."""
    if x.device.type == "cpu" and bool((x < 0).any()):
        raise ValueError(f"{name}: must be ≥ 0, got {x.min().item()}")


def prefix_lens(x: torch.Tensor, depth: int) -> None:
    """≥ 0, and small enough that every position ``prefix + depth`` fits in int64 (it would
    wrap silently). Checked on the host, so only for CPU tensors: on CUDA a negative prefix
    is a status code and an overflowing one is not detected (checking would sync)."""
    non_negative("prefix_lens", x)
    limit = INT64_MAX - depth
    if x.device.type == "cpu" and bool((x > limit).any()):
        raise ValueError(
            f"prefix_lens: {x.max().item()} + depth {depth} overflows the int64 positions "
            f"(at most {limit} at this depth)"
        )


def mask_elements(seq_lens: torch.Tensor, q: int, device: torch.device) -> int:
    """The FULL mask's size, ``sum(Q * (P_b + Q))``, from host ``seq_lens``: each must be
    ≥ 0, and the mask must fit in ``device``'s memory (one byte per element); the sum is
    taken in Python ints, so it cannot wrap."""
    non_negative("seq_lens", seq_lens)
    lens = seq_lens.tolist()
    total = q * (sum(lens) + q * len(lens))
    limit = memory_bytes(device)
    if total > limit:
        raise ValueError(
            f"seq_lens: a mask for prefix lengths up to {max(lens)} needs {total} bytes, "
            f"more than the {limit} bytes of {device} memory"
        )
    return total


def memory_bytes(device: torch.device) -> int:
    """Total memory of ``device`` (host RAM for the CPU), or the int64 limit where unknown."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # no sysconf (Windows)
        return INT64_MAX


def in_vocab(name: str, x: torch.Tensor, vocab: int) -> None:
    if x.device.type == "cpu" and bool(((x < 0) | (x >= vocab)).any()):
        bad = x[(x < 0) | (x >= vocab)][0].item()
        raise ValueError(f"{name}: token {bad} is outside the vocabulary 0..{vocab - 1}")


def mask_out(out, total: int | None, device: torch.device) -> None:
    out = tensor("out", out)
    if out.dtype != torch.bool:
        raise TypeError(f"out: dtype must be bool, got {out.dtype}")
    if out.dim() != 1 or not out.is_contiguous():
        raise ValueError(f"out: must be a contiguous 1-D tensor, got shape {tuple(out.shape)}")
    if total is not None and out.numel() < total:
        raise ValueError(f"out: holds {out.numel()} elements, the mask needs {total}")
    same_device("out", out, device)


def concrete_device(device: torch.device) -> torch.device:
    """``cuda`` means the current CUDA device, as for tensors created with it."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def supported_device(device: torch.device, name: str) -> None:
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: is on {device}; ddtree runs on CPU or CUDA tensors")


def cuda_present(device: torch.device, name: str) -> None:
    """A CUDA device on a machine without one fails later in a driver call; say here what
    to pass instead."""
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f'{name}: {device} needs a CUDA GPU and none is available here; pass device="cpu" '
            "to run on the Rust CPU path"
        )


def require_cpu(device: torch.device, what: str) -> None:
    """For the parts of a round that have no GPU kernels yet."""
    if device.type != "cpu":
        raise NotImplementedError(f"{what}: inputs are on {device}; this runs on CPU tensors only")
