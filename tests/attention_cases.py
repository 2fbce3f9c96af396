"""Random tree-attention cases and an independent dense reference (float64, the full
[Q, P+Q] mask written out), shared by the CPU and GPU attention tests."""

from __future__ import annotations

import math

import torch

import ddtree


def make_case(
    *,
    bs=2,
    budget=15,
    hq=4,
    hkv=2,
    dqk=64,
    dv=None,
    prefix=(5, 0),
    page_size=1,
    dtype=torch.bfloat16,
    device="cpu",
    mla=False,
    strided_q=False,
    index_dtype=torch.int32,
    seed=0,
):
    """A built tree (real: from random draft logits, pads included), queries, tree K/V and a
    paged pool holding each request's prefix in shuffled pages."""
    g = torch.Generator().manual_seed(seed)
    depth, vocab = 4, 50
    x = torch.randn(bs, depth, vocab, generator=g) * 2
    z = torch.zeros(bs, dtype=torch.int64)
    prefix = torch.tensor(prefix, dtype=torch.int64)
    tree = ddtree.build_tree(x, z, prefix, budget=budget)
    q_nodes = budget + 1
    rows = bs * q_nodes
    dv = dqk if dv is None else dv
    if mla:
        hkv, dv = 1, dqk - 64
    pages = [-(-int(p) // page_size) for p in prefix]
    total_pages = sum(pages) + 3  # spare pages: the pool is larger than what is used
    slots = total_pages * page_size
    k_cache = torch.randn(slots, hkv, dqk, generator=g)
    v_cache = k_cache[..., :dv] if mla else torch.randn(slots, hkv, dv, generator=g)
    perm = torch.randperm(total_pages, generator=g)
    indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()])
    indices = perm[: int(indptr[-1])]
    width = dqk + 8 if strided_q else dqk
    q = torch.randn(rows, hq, width, generator=g)[..., :dqk]
    k_new = torch.randn(rows, hkv, dqk, generator=g)
    v_new = k_new[..., :dv] if mla else torch.randn(rows, hkv, dv, generator=g)

    def on(t):
        return t.to(dtype).to(device)

    if mla:  # keep V a strided view of K on the device too
        k_cache, k_new = on(k_cache), on(k_new)
        v_cache, v_new = k_cache[..., :dv], k_new[..., :dv]
    else:
        k_cache, v_cache, k_new, v_new = on(k_cache), on(v_cache), on(k_new), on(v_new)
    qd = torch.randn(rows, hq, width, generator=g).to(dtype)
    qd = q.to(dtype) if not strided_q else qd
    q = qd.to(device)[..., :dqk] if strided_q else qd.to(device)
    tree = ddtree.Tree(**{n: getattr(tree, n).to(device) for n in tree.__dataclass_fields__})
    return {
        "q": q,
        "k_new": k_new,
        "v_new": v_new,
        "k_cache": k_cache,
        "v_cache": v_cache,
        "kv_indptr": indptr.to(index_dtype).to(device),
        "kv_indices": indices.to(index_dtype).to(device),
        "prefix_lens": prefix.to(device),
        "tree": tree,
        "sm_scale": 1 / math.sqrt(dqk),
        "page_size": page_size,
    }


def dense_reference(c):
    """out [bs*Q, Hq, Dv] and lse [bs*Q, Hq] in float64 from the full mask, written out."""
    tree = c["tree"]
    bs, q_nodes = tree.batch_size, tree.width
    hq, hkv = c["q"].shape[1], c["k_new"].shape[1]
    group = hq // hkv
    ps = c["page_size"]
    out = torch.zeros(bs * q_nodes, hq, c["v_new"].shape[2], dtype=torch.float64)
    lse = torch.zeros(bs * q_nodes, hq, dtype=torch.float64)
    vis = tree.visibility().cpu()
    indptr, indices = c["kv_indptr"].cpu().long(), c["kv_indices"].cpu().long()
    for b in range(bs):
        p = int(c["prefix_lens"][b])
        slots = [int(indices[int(indptr[b]) + t // ps]) * ps + t % ps for t in range(p)]
        rows = slice(b * q_nodes, (b + 1) * q_nodes)
        k = torch.cat([c["k_cache"].cpu()[slots], c["k_new"].cpu()[rows]]).double()
        v = torch.cat([c["v_cache"].cpu()[slots], c["v_new"].cpu()[rows]]).double()
        mask = torch.cat([torch.ones(q_nodes, p, dtype=torch.bool), vis[b]], dim=1)
        for h in range(hq):
            qh = c["q"].cpu()[rows, h].double()
            s = qh @ k[:, h // group].T * c["sm_scale"]
            s = s.masked_fill(~mask, -math.inf)
            lse[rows, h] = torch.logsumexp(s, dim=1)
            out[rows, h] = torch.softmax(s, dim=1) @ v[:, h // group]
    return out, lse
