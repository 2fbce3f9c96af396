"""SPEC stage 5 — commit: kept KV slots, in-place compaction of paged caches, and the
gather of the accepted nodes' hidden states. CUDA tensors run the kernels of
``kernels/commit.cu`` (no sync, no allocation when outputs are given); CPU tensors run the
same definitions in torch."""

from __future__ import annotations

import torch

from . import _core, _cuda
from ._types import Acceptance


def _window(acc: Acceptance, out_cache_loc) -> torch.Tensor:
    if not isinstance(out_cache_loc, torch.Tensor):
        raise TypeError(
            f"out_cache_loc: expected a torch.Tensor, got {type(out_cache_loc).__name__}"
        )
    w = out_cache_loc
    if w.dtype != torch.int64 or w.dim() != 2 or w.shape[0] != acc.batch_size:
        raise ValueError(
            f"out_cache_loc: must be int64 [{acc.batch_size}, Q], got {w.dtype} {list(w.shape)}"
        )
    if w.device != acc.device:
        raise ValueError(f"out_cache_loc: on {w.device}, the acceptance is on {acc.device}")
    if not w.is_contiguous():
        raise ValueError("out_cache_loc: must be contiguous")
    return w


def _out(name: str, t, shape, dtype, device) -> torch.Tensor:
    if t is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if t.dtype != dtype or tuple(t.shape) != tuple(shape) or t.device != device:
        raise ValueError(f"{name}: must be {dtype} {list(shape)} on {device}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")
    return t


def kept_slots(acc: Acceptance, out_cache_loc, *, kept=None, release=None):
    """Kept slots ``[bs, L+1]`` (window slots of the accepted path, −1 padded) and the
    release mask ``[bs, Q]`` (True = slot freed)."""
    w = _window(acc, out_cache_loc)
    bs, q = w.shape
    kept = _out("kept", kept, (bs, acc.path_len), torch.int64, w.device)
    release = _out("release", release, (bs, q), torch.bool, w.device)
    nodes = acc.accepted_nodes
    if w.device.type == "cuda":
        _core.cuda_kept_slots(
            *_cuda.launch_on(w.device),
            bs,
            q,
            acc.path_len,
            nodes.data_ptr(),
            w.data_ptr(),
            kept.data_ptr(),
            release.data_ptr(),
        )
        return kept, release
    on_path = nodes >= 0
    kept.copy_(torch.where(on_path, w.gather(1, nodes.clamp(min=0)), -1))
    release.fill_(True)
    release.scatter_(1, nodes.clamp(min=0), False)  # pads hit node 0, always on the path
    return kept, release


def _row_bytes(name: str, t: torch.Tensor) -> int:
    row = t[0]
    if not row.is_contiguous() or t.stride(0) != row.numel():
        raise ValueError(f"{name}: rows (dimension 0) must be contiguous and unpadded")
    return row.numel() * t.element_size()


class CacheTable:
    """Paged KV caches (a layer's K, V or MLA latent cache each: ``[slots, ...]``, rows of
    one size) and, on CUDA, the device table of their base addresses, built once."""

    def __init__(self, caches, device: torch.device):
        caches = list(caches)
        if not caches or not all(isinstance(c, torch.Tensor) for c in caches):
            raise TypeError("caches: expected a non-empty sequence of tensors")
        sizes = {_row_bytes(f"caches[{i}]", c) for i, c in enumerate(caches)}
        if len(sizes) != 1:
            raise ValueError(f"caches: rows must all have one size in bytes, got {sorted(sizes)}")
        for i, c in enumerate(caches):
            if c.device != device:
                raise ValueError(f"caches[{i}]: on {c.device}, expected {device}")
        self.caches = caches
        self.row_bytes = sizes.pop()
        self.device = device
        self.table = None
        if device.type == "cuda":
            ptrs = torch.tensor([c.data_ptr() for c in caches], dtype=torch.int64)
            self.table = ptrs.to(device)


def compact_kv(acc: Acceptance, out_cache_loc, caches) -> None:
    """In every cache, moves each request's accepted rows (window slot of path node i) to
    the window's i-th slot, for i < accept_len; every source is read before any write."""
    w = _window(acc, out_cache_loc)
    table = caches if isinstance(caches, CacheTable) else CacheTable(caches, w.device)
    bs, q = w.shape
    if w.device.type == "cuda":
        _core.cuda_compact_kv(
            *_cuda.launch_on(w.device),
            bs,
            q,
            acc.path_len,
            acc.accepted_nodes.data_ptr(),
            w.data_ptr(),
            table.table.data_ptr(),
            len(table.caches),
            table.row_bytes,
        )
        return
    nodes = acc.accepted_nodes
    for b in range(bs):
        path = nodes[b][nodes[b] >= 0]
        src, dst = w[b, path], w[b, : len(path)]
        for c in table.caches:
            c[dst] = c[src].clone()  # read all sources first


def gather_hidden(acc: Acceptance, hidden, *, out=None) -> torch.Tensor:
    """Rows ``b*Q + node`` of ``hidden`` ``[bs*Q, H...]`` for each accepted node, in path
    order, into ``out`` ``[bs, L+1, H...]`` (zeros past each path)."""
    if not isinstance(hidden, torch.Tensor) or hidden.dim() < 2:
        raise ValueError("hidden: must be a tensor [bs*Q, H, ...]")
    bs, path_len = acc.batch_size, acc.path_len
    if hidden.shape[0] % bs != 0 or hidden.device != acc.device:
        raise ValueError(
            f"hidden: must be [bs*Q, ...] on {acc.device} with bs={bs}, "
            f"got {list(hidden.shape)} on {hidden.device}"
        )
    if not hidden.is_contiguous():
        raise ValueError("hidden: must be contiguous")
    q = hidden.shape[0] // bs
    out = _out("out", out, (bs, path_len, *hidden.shape[1:]), hidden.dtype, hidden.device)
    nodes = acc.accepted_nodes
    if hidden.device.type == "cuda":
        _core.cuda_gather_hidden(
            *_cuda.launch_on(hidden.device),
            bs,
            q,
            path_len,
            nodes.data_ptr(),
            hidden.data_ptr(),
            _row_bytes("hidden", hidden),
            out.data_ptr(),
        )
        return out
    rows = hidden.view(bs, q, -1)
    flat = out.view(bs, path_len, -1)
    flat.zero_()
    for b in range(bs):
        path = nodes[b][nodes[b] >= 0]
        flat[b, : len(path)] = rows[b, path]
    return out
