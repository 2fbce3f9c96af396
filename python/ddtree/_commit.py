"""SPEC stage 5 — commit: kept KV slots, in-place compaction of paged caches, and the
gather of the accepted nodes' hidden states. CUDA tensors run the kernels of
``kernels/commit.cu`` (no sync, no allocation when outputs are given); CPU tensors run the
same definitions in torch.

Index *values* (the acceptance's nodes, the ``out_cache_loc`` slots) are checked where they
are used, on the device — a host check would sync: a request with one out of range gets the
empty result (nothing moved or gathered; kept slots −1 and nothing released) and a code in
``acc.status`` (``STATUS_NODE_OUT_OF_RANGE``, ``STATUS_SLOT_OUT_OF_RANGE``; an earlier code
is kept). The CPU path gives the same results and codes."""

from __future__ import annotations

import torch

from . import _core, _cuda
from ._types import Acceptance, checked

# The codes of ddtree-core's status module (ddtree.STATUS_*).
NODE_OUT_OF_RANGE = _core.STATUS_NODE_OUT_OF_RANGE
SLOT_OUT_OF_RANGE = _core.STATUS_SLOT_OUT_OF_RANGE


def _node_codes(nodes: torch.Tensor, q: int) -> torch.Tensor:
    """CPU twin of the kernels' check_nodes: per request, NODE_OUT_OF_RANGE when a path
    entry is neither a node of [0, Q) nor trailing −1 padding, else 0 (int32 [bs])."""
    prev = torch.cat([torch.zeros_like(nodes[:, :1]), nodes[:, :-1]], dim=1)
    past_window = torch.arange(nodes.shape[1], device=nodes.device) >= q
    bad = (nodes >= q) | (nodes < -1) | ((nodes >= 0) & ((prev < 0) | past_window))
    bad[:, 0] |= nodes[:, 0] < 0
    return torch.where(bad.any(1), NODE_OUT_OF_RANGE, 0).to(torch.int32)


def _slots_bad(slots_used: torch.Tensor, used: torch.Tensor, slots: int) -> torch.Tensor:
    """Per request: a used slot (where ``used``) outside [0, slots)."""
    return (used & ((slots_used < 0) | (slots_used >= slots))).any(1)


def _record(acc: Acceptance, codes: torch.Tensor) -> None:
    """Records codes where the request has none yet (first code wins, as on the GPU)."""
    acc.status.copy_(torch.where(acc.status == 0, codes, acc.status))


def window(acc: Acceptance, out_cache_loc) -> torch.Tensor:
    checked("acc", acc, Acceptance)
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


def kept_slots(acc: Acceptance, out_cache_loc, *, kept=None, release=None, num_slots=None):
    """Kept slots ``[bs, L+1]`` (window slots of the accepted path, −1 padded) and the
    release mask ``[bs, Q]`` (True = slot freed). With ``num_slots`` (the KV pool's size),
    every window slot must lie in ``[0, num_slots)``; a request with a bad node or slot gets
    kept −1, nothing released, and a code in ``acc.status``."""
    w = window(acc, out_cache_loc)
    bs, q = w.shape
    kept = _out("kept", kept, (bs, acc.path_len), torch.int64, w.device)
    release = _out("release", release, (bs, q), torch.bool, w.device)
    if num_slots is not None:
        num_slots = _slot_count("num_slots", num_slots)
    nodes = acc.accepted_nodes
    if w.device.type == "cuda":
        _core.cuda_kept_slots(
            *_cuda.launch_on(w.device),
            acc,
            q,
            w,
            num_slots,
            kept,
            release,
        )
        return kept, release
    codes = _node_codes(nodes, q)
    if num_slots is not None:
        slot_bad = _slots_bad(w, torch.ones_like(w, dtype=torch.bool), num_slots)
        codes = torch.where((codes == 0) & slot_bad, SLOT_OUT_OF_RANGE, codes).to(torch.int32)
    ok = (codes == 0).unsqueeze(1)
    safe = torch.where(ok, nodes, -1).clamp(max=q - 1)
    kept.copy_(torch.where(safe >= 0, w.gather(1, safe.clamp(min=0)), -1))
    release.copy_(ok.expand(bs, q))
    on_path = torch.where(safe >= 0, safe, safe[:, :1].clamp(min=0))  # pads: the root entry
    release.scatter_(1, on_path, False)
    _record(acc, codes)
    return kept, release


def _slot_count(name: str, n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{name}: must be an int ≥ 0, got {n!r}")
    return n


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
        self.slots = min(c.shape[0] for c in caches)  # the slots every cache holds
        self.device = device
        self.table = None
        if device.type == "cuda":
            self.table = _core.cuda_cache_table(caches, device)


def compact_kv(acc: Acceptance, out_cache_loc, caches) -> None:
    """In every cache, moves each request's accepted rows (window slot of path node i) to
    the window's i-th slot, for i < accept_len; every source is read before any write. A
    request whose nodes or slots (read or written) are out of range moves nothing and gets
    a code in ``acc.status``."""
    w = window(acc, out_cache_loc)
    table = caches if isinstance(caches, CacheTable) else CacheTable(caches, w.device)
    if table.device != w.device:
        raise ValueError(f"caches: on {table.device}, out_cache_loc is on {w.device}")
    bs, q = w.shape
    if w.device.type == "cuda":
        _core.cuda_compact_kv(
            *_cuda.launch_on(w.device),
            acc,
            q,
            w,
            table.table,
            len(table.caches),
            table.row_bytes,
            table.slots,
        )
        return
    nodes = acc.accepted_nodes
    codes = _node_codes(nodes, q)
    on_path = nodes >= 0
    src_slots = torch.where(codes.unsqueeze(1) == 0, nodes, 0).clamp(0, q - 1)
    read_bad = _slots_bad(w.gather(1, src_slots), on_path, table.slots)
    write_bad = _slots_bad(w[:, : acc.path_len], on_path[:, : w.shape[1]], table.slots)
    codes = torch.where((codes == 0) & (read_bad | write_bad), SLOT_OUT_OF_RANGE, codes)
    codes = codes.to(torch.int32)
    for b in range(bs):
        if codes[b] != 0:
            continue
        path = nodes[b][nodes[b] >= 0]
        src, dst = w[b, path], w[b, : len(path)]
        for c in table.caches:
            c[dst] = c[src].clone()  # read all sources first
    _record(acc, codes)


def gather_hidden(acc: Acceptance, hidden, *, out=None) -> torch.Tensor:
    """Rows ``b*Q + node`` of ``hidden`` ``[bs*Q, H...]`` for each accepted node, in path
    order, into ``out`` ``[bs, L+1, H...]`` (zeros past each path). A request with a node
    outside ``[0, Q)`` keeps its ``out`` rows and gets a code in ``acc.status``."""
    checked("acc", acc, Acceptance)
    if not isinstance(hidden, torch.Tensor):
        raise TypeError(f"hidden: expected a torch.Tensor, got {type(hidden).__name__}")
    if hidden.dim() < 2:
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
            acc,
            q,
            hidden,
            _row_bytes("hidden", hidden),
            out,
        )
        return out
    rows = hidden.view(bs, q, -1)
    flat = out.view(bs, path_len, -1)
    codes = _node_codes(nodes, q)
    for b in range(bs):
        if codes[b] != 0:
            continue
        path = nodes[b][nodes[b] >= 0]
        flat[b].zero_()
        flat[b, : len(path)] = rows[b, path]
    _record(acc, codes)
    return out
