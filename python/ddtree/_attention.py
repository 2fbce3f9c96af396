"""Tree verify attention: each tree node's query attends to its request's whole prefix (read
from the paged KV pool through ``kv_indptr``/``kv_indices``) and to the tree nodes whose bit
is set in ``tree.ancestor_bits`` (its ancestors and itself), as the target's verify forward
needs. MLA (absorbed: one latent KV head, V a view of K's first columns) and GQA/MHA alike.

CUDA tensors run the kernel of ``kernels/attention.cu`` (no host sync; capturable with
``out`` and a prepared ``AttentionWorkspace``); CPU tensors run the readable fp32 version
below, which is also what the tests hold the kernel to.
"""

from __future__ import annotations

import math

import torch

from . import _core, _validate
from ._types import Tree, checked

ATTN_DTYPES = (torch.bfloat16, torch.float16)
CPU_DTYPES = (*ATTN_DTYPES, torch.float32)  # fp32 on the CPU: the demo's lossless decoding
PREFIX_CHUNK = 4096  # prefix keys per step of the CPU path's online softmax


def tree_attention(
    q,
    k_new,
    v_new,
    k_cache,
    v_cache,
    kv_indptr,
    kv_indices,
    prefix_lens,
    tree,
    *,
    sm_scale,
    page_size=1,
    out=None,
    return_lse=False,
    lse_out=None,
    workspace=None,
    status=None,
):
    """Attention of the tree's queries ``q`` ``[bs*Q, Hq, Dqk]`` over each request's prefix
    and its ancestors in the tree; returns ``out`` ``[bs*Q, Hq, Dv]`` (and the natural-log
    ``lse`` float32 ``[bs*Q, Hq]`` with ``return_lse``). See docs/api.md."""
    given = dict(locals())  # the arguments, by name, for _check
    a = _check(given)
    if q.device.type == "cuda":
        _cuda_attention(a, workspace)
    else:
        _cpu_attention(a)
    return (a["out"], a["lse"]) if return_lse else a["out"]


class AttentionWorkspace:
    """Scratch of the CUDA attention for calls of up to ``max_batch`` requests of a tree of
    ``q_nodes`` nodes with ``hq`` query heads over ``hkv`` KV heads and value dim ``dv``:
    the per-request index status and the key splits' partial results. Made once (it
    allocates); a call given it allocates nothing, so it may be captured in a CUDA graph.

    The key range of a request is split across ``splits(bs)`` blocks (flash-decoding) so
    that the blocks fill whole waves of what the GPU holds at once (the Rust crate's
    ``SplitPlan``); the count depends only on the shapes, so replays of a captured call keep
    their geometry. On an H100/H200 (compute capability 9.0) the calls take the Hopper kernel
    (wgmma) where one holds the head dim, unless ``DDTREE_ATTENTION`` was set to ``portable``
    (or ``sm120``: the portable kernel at sm_120's occupancy) before the device's first use."""

    def __init__(self, device, *, max_batch, q_nodes, hq, hkv, dqk, dv):
        device = torch.device(device)
        if device.type != "cuda" or not torch.cuda.is_available():
            why = (
                f"got {str(device)!r}"
                if device.type != "cuda"
                else f"{device} needs a CUDA GPU and none is available here"
            )
            raise ValueError(
                f"device: an AttentionWorkspace is for CUDA devices, {why}; tree_attention "
                "on CPU tensors needs no workspace (leave workspace=None)"
            )
        self.device = _validate.concrete_device(device)
        # The split policy and sizes are the Rust crate's (SplitPlan), kept there.
        self._plan = _core.AttentionPlan(self.device.index, max_batch, q_nodes, hq, hkv, dqk, dv)
        self.shape = (q_nodes, hq, hkv, dqk, dv)
        self.max_batch = max_batch
        floats = max(self._plan.part_floats, 1)
        self.part = torch.empty(floats, dtype=torch.float32, device=self.device)
        self.status = torch.empty(max_batch, dtype=torch.int32, device=self.device)

    def splits(self, bs: int) -> int:
        """Key splits per request in a call of ``bs`` requests."""
        return self._plan.splits(bs)

    @property
    def tile(self) -> str:
        """The compiled kernel tile the calls take, e.g. ``"d128"`` (portable, mma.sync) or
        ``"sm90a_d576vk"`` (the Hopper kernel, on compute capability 9.0)."""
        return self._plan.tile


def _tensor(name, x):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    return x


def _shape(name, x, rank):
    if x.dim() != rank:
        raise ValueError(f"{name}: must have {rank} dimensions, got shape {list(x.shape)}")


def _check(given: dict) -> dict:
    """Every argument of tree_attention (by name in `given`) checked — shapes, dtypes,
    devices, strides — before anything runs."""
    q, k_new, v_new = given["q"], given["k_new"], given["v_new"]
    k_cache, v_cache, tree = given["k_cache"], given["v_cache"], given["tree"]
    kv_indptr, kv_indices, prefix_lens = (
        given["kv_indptr"],
        given["kv_indices"],
        given["prefix_lens"],
    )
    sm_scale, page_size, status = given["sm_scale"], given["page_size"], given["status"]
    out, return_lse, lse_out = given["out"], given["return_lse"], given["lse_out"]
    checked("tree", tree, Tree)
    names = ("q", "k_new", "v_new", "k_cache", "v_cache")
    ts = [_tensor(n, t) for n, t in zip(names, (q, k_new, v_new, k_cache, v_cache), strict=True)]
    for n, t in zip(names, ts, strict=True):
        _shape(n, t, 3)
    dev = q.device
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"q: on {dev}; tree_attention runs on the CPU or a CUDA device")
    dtypes = ATTN_DTYPES if dev.type == "cuda" else CPU_DTYPES
    if q.dtype not in dtypes:
        raise TypeError(f"q: dtype {q.dtype} not supported on {dev.type} (use one of {dtypes})")
    for n, t in zip(names[1:], ts[1:], strict=True):
        if t.dtype != q.dtype:
            raise TypeError(f"{n}: dtype {t.dtype} differs from q's {q.dtype}")
        if t.device != dev:
            raise ValueError(f"{n}: on {t.device}, q is on {dev}")
    for n, t in zip(names, ts, strict=True):
        if t.stride(2) != 1:
            raise ValueError(f"{n}: the last dimension must be contiguous (stride 1)")
    bs, width = tree.batch_size, tree.width
    if tree.device != dev:
        raise ValueError(f"tree: on {tree.device}, q is on {dev}")
    rows, hq, dqk = q.shape
    if rows != bs * width:
        raise ValueError(f"q: must have bs*Q = {bs}*{width} rows (the tree's), got {rows}")
    hkv = k_new.shape[1]
    if hkv < 1 or hq % hkv != 0:
        raise ValueError(f"k_new: {hkv} KV heads do not divide q's {hq} query heads")
    dv = v_new.shape[2]
    _same(k_new, "k_new", (rows, hkv, dqk))
    _same(v_new, "v_new", (rows, hkv, dv))
    slots = k_cache.shape[0]
    _same(k_cache, "k_cache", (slots, hkv, dqk))
    _same(v_cache, "v_cache", (slots, hkv, dv))
    indptr, indices = _tensor("kv_indptr", kv_indptr), _tensor("kv_indices", kv_indices)
    for n, t in (("kv_indptr", indptr), ("kv_indices", indices)):
        _shape(n, t, 1)
        if t.dtype not in (torch.int32, torch.int64) or t.device != dev:
            raise TypeError(f"{n}: must be int32 or int64 on {dev}, got {t.dtype} on {t.device}")
        if not t.is_contiguous():
            raise ValueError(f"{n}: must be contiguous")
    if indptr.dtype != indices.dtype:
        raise TypeError(f"kv_indices: dtype {indices.dtype} differs from kv_indptr's")
    if indptr.shape[0] != bs + 1:
        raise ValueError(f"kv_indptr: must have bs+1 = {bs + 1} entries, got {indptr.shape[0]}")
    prefix = _tensor("prefix_lens", prefix_lens)
    if prefix.shape != (bs,) or prefix.dtype != torch.int64 or prefix.device != dev:
        raise ValueError(f"prefix_lens: must be int64 [{bs}] on {dev}")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size: must be a positive int, got {page_size!r}")
    if page_size & (page_size - 1):
        raise ValueError(f"page_size: must be a power of two, got {page_size}")
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)):
        raise TypeError(f"sm_scale: expected a number, got {type(sm_scale).__name__}")
    if not math.isfinite(sm_scale):
        raise ValueError(f"sm_scale: must be finite, got {sm_scale}")
    out = _out("out", out, (rows, hq, dv), q.dtype, dev, last_contiguous=True)
    lse = None
    if return_lse:
        lse = _out("lse_out", lse_out, (rows, hq), torch.float32, dev, last_contiguous=True)
        if not lse.is_contiguous():  # the kernel writes lse[row * Hq + head]
            raise ValueError("lse_out: must be contiguous")
    elif lse_out is not None:
        raise ValueError("lse_out: given without return_lse=True")
    if status is not None and (
        status.shape != (bs,) or status.dtype != torch.int32 or status.device != dev
    ):
        raise ValueError(f"status: must be int32 [{bs}] on {dev}")
    if status is not None and not status.is_contiguous():  # written as status[b]
        raise ValueError("status: must be contiguous")
    return {
        "q": q, "k_new": k_new, "v_new": v_new, "k_cache": k_cache, "v_cache": v_cache,
        "indptr": indptr, "indices": indices, "prefix": prefix, "tree": tree,
        "sm_scale": float(sm_scale), "page_size": page_size, "out": out, "lse": lse,
        "status": status, "bs": bs, "q_nodes": width, "hq": hq, "hkv": hkv, "dqk": dqk,
        "dv": dv,
    }  # fmt: skip


def _same(t, name, shape):
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: must be {list(shape)}, got {list(t.shape)}")


def _out(name, t, shape, dtype, device, last_contiguous):
    if t is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype or t.device != device:
        raise ValueError(f"{name}: must be {dtype} {list(shape)} on {device}")
    if last_contiguous and t.stride(-1) != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous (stride 1)")
    return t


def prefix_slots(a: dict, b: int) -> torch.Tensor | None:
    """The KV pool slots of request b's prefix tokens, in order, or None when an index is out
    of range (a page past the request's list or the index tensor, a slot past the pool)."""
    p = int(a["prefix"][b])
    ps = a["page_size"]
    start, end = int(a["indptr"][b]), int(a["indptr"][b + 1])
    pages = -(-p // ps)
    if p < 0 or start < 0 or start + pages > min(end, a["indices"].numel()):
        return None
    t = torch.arange(p)
    page_ids = a["indices"][start : start + pages].to(torch.int64)
    slots = page_ids[t // ps] * ps + t % ps if ps > 1 else page_ids
    if bool(((slots < 0) | (slots >= a["k_cache"].shape[0])).any()):
        return None
    return slots


def _cpu_attention(a: dict) -> None:
    """The readable version: per request and KV head, fp32 scores over the prefix in chunks
    (online softmax), then over the tree with the ancestor mask."""
    bs, width, group = a["bs"], a["q_nodes"], a["hq"] // a["hkv"]
    visible = a["tree"].visibility()
    for b in range(bs):
        slots = prefix_slots(a, b)
        if slots is None:
            if a["status"] is None:
                raise ValueError(f"kv_indices: request {b} has a page or slot out of range")
            a["status"][b] = _core.STATUS_SLOT_OUT_OF_RANGE
            continue
        rows = slice(b * width, (b + 1) * width)
        q = a["q"][rows].float() * a["sm_scale"]  # [Q, Hq, D]
        k_tree = a["k_new"][rows].float().repeat_interleave(group, dim=1)
        v_tree = a["v_new"][rows].float().repeat_interleave(group, dim=1)
        s_tree = torch.einsum("ihd,jhd->hij", q, k_tree)
        s_tree = s_tree.masked_fill(~visible[b].unsqueeze(0), -math.inf)
        m = s_tree.amax(dim=2)  # [Hq, Q]; finite: every node sees itself
        acc = torch.einsum("hij,jhd->hid", torch.exp(s_tree - m[..., None]), v_tree)
        total = torch.exp(s_tree - m[..., None]).sum(dim=2)
        for c in range(0, len(slots), PREFIX_CHUNK):
            chunk = slots[c : c + PREFIX_CHUNK].to(a["k_cache"].device)
            k = a["k_cache"][chunk].float().repeat_interleave(group, dim=1)
            v = a["v_cache"][chunk].float().repeat_interleave(group, dim=1)
            s = torch.einsum("ihd,jhd->hij", q, k)
            m_new = torch.maximum(m, s.amax(dim=2))
            scale = torch.exp(m - m_new)
            e = torch.exp(s - m_new[..., None])
            acc = acc * scale[..., None] + torch.einsum("hij,jhd->hid", e, v)
            total = total * scale + e.sum(dim=2)
            m = m_new
        a["out"][rows] = (acc / total[..., None]).permute(1, 0, 2).to(a["out"].dtype)
        if a["lse"] is not None:
            a["lse"][rows] = (m + torch.log(total)).T
        if a["status"] is not None:
            a["status"][b] = 0


def _cuda_attention(a: dict, workspace: AttentionWorkspace | None) -> None:
    from . import _cuda

    q = a["q"]
    shape = (a["q_nodes"], a["hq"], a["hkv"], a["dqk"], a["dv"])
    arg = launch_arg(a)  # checks the head dims and the tree first
    if workspace is None:
        workspace = AttentionWorkspace(
            q.device, max_batch=a["bs"], q_nodes=a["q_nodes"], hq=a["hq"], hkv=a["hkv"],
            dqk=a["dqk"], dv=a["dv"],
        )  # fmt: skip
    elif workspace.shape != shape or workspace.max_batch < a["bs"] or workspace.device != q.device:
        raise ValueError(
            f"workspace: made for {workspace.max_batch} requests of shape {workspace.shape} on "
            f"{workspace.device}, the call has {a['bs']} of {shape} on {q.device}"
        )
    arg["part"] = workspace.part
    arg["status"] = a["status"] if a["status"] is not None else workspace.status[: a["bs"]]
    _core.cuda_tree_attention(*_cuda.launch_on(q.device), arg, workspace._plan)


def launch_arg(a: dict) -> dict:
    """The kernel's view of a checked call (``_check``) but its workspace: Rust reads each
    tensor's address and strides (and checks the rows' alignment)."""
    if a["dqk"] % 8 or a["dv"] % 8:
        raise ValueError("q: head dims must be multiples of 8 on CUDA")
    bits = a["tree"].ancestor_bits
    if not bits.is_contiguous():
        raise ValueError("tree: ancestor_bits must be contiguous")
    arg = {
        "q": a["q"],
        "k_new": a["k_new"],
        "v_new": a["v_new"],
        "k_cache": a["k_cache"],
        "v_cache": a["v_cache"],
        "out": a["out"],
        "kv_indptr": a["indptr"],
        "kv_indices": a["indices"],
        "prefix_lens": a["prefix"],
        "ancestor_bits": bits,
        "lse": a["lse"],
        "num_indices": a["indices"].numel(),
        "num_slots": a["k_cache"].shape[0],
        "sm_scale_log2": a["sm_scale"] * LOG2E,
        "index64": a["indices"].dtype == torch.int64,
        "f16": a["q"].dtype == torch.float16,
        "shape": [
            a["bs"], a["q_nodes"], a["hq"], a["hkv"], a["dqk"], a["dv"],
            a["page_size"].bit_length() - 1, bits.shape[2],
        ],
    }  # fmt: skip
    if a["status"] is not None:
        arg["status"] = a["status"]
    return arg


LOG2E = 1.4426950408889634
