"""A minimal LLaMA serving engine for the demo: a paged KV pool, prefill, and the verify
forward whose attention is ``ddtree.tree_attention`` (the CUDA kernel on GPU tensors, the
readable path on the CPU), plus the early-exit drafter.

Layout of the pool: one K and one V tensor per layer, ``[slots, Hkv, D]``; request b owns
the pages ``page_table[b]`` (page size ``page_size``), token t of its sequence lives in slot
``page_table[b][t // ps] * ps + t % ps``. A verify round writes the tree's K/V into the
slots of positions ``P .. P+Q-1`` (SGLang's ``out_cache_loc``); after the accept,
``compact_kv`` moves the accepted path's rows to positions ``P .. P+accept_len-1``.

The decode-side forward is written for CUDA-graph replay, where what counts is the number of
kernels per layer, not Python: one GEMM for Q, K, V and their rotate-half images (the RoPE
rotation folded into the weights, so RoPE is a multiply and a fused multiply-add), RoPE's
cos/sin read from a table made once, the residual adds fused into the output GEMMs
(``addmm``), gate and up in one GEMM, and ``F.rms_norm``. Every decoder of the demo runs this
same forward, so they stay comparable token for token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import ddtree

from .model import Config, Layer, Weights, rope_cos_sin


class Pool:
    """The paged KV pool of every layer and each request's page list."""

    def __init__(self, w: Weights, bs: int, max_tokens: int, page_size: int, device, dtype):
        cfg = w.config
        self.page_size = page_size
        pages = -(-max_tokens // page_size)
        self.positions = pages * page_size  # positions a request can hold
        self.slots = bs * pages * page_size
        shape = (self.slots, cfg.n_kv_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layers)]
        # Pages handed out shuffled, as a real allocator's free list would be after a while.
        order = torch.randperm(bs * pages, generator=torch.Generator().manual_seed(0))
        self.page_table = order.view(bs, pages).to(device)
        self.kv_indptr = torch.arange(0, bs * pages + 1, pages, device=device, dtype=torch.int32)
        self.kv_indices = self.page_table.flatten().to(torch.int32)

    def slots_of(self, b_rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Slots of `positions` [bs, n] of the requests `b_rows` [bs]."""
        ps = self.page_size
        pages = self.page_table[b_rows.unsqueeze(1), positions // ps]
        return pages * ps + positions % ps

    def caches(self) -> list[torch.Tensor]:
        return self.k + self.v


def rotate_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The rows of a Q or K weight whose product is rotate_half of the original's: per head,
    ``[-w2; w1]`` for the halves ``w1, w2`` (exact: a permutation and signs)."""
    d = w.shape[0] // heads
    w = w.view(heads, 2, d // 2, -1)
    return torch.cat([-w[:, 1], w[:, 0]], dim=1).reshape(heads * d, -1)


@dataclass
class FusedLayer:
    """One block's weights laid out for the decode forward."""

    attn_norm: torch.Tensor
    qkv: torch.Tensor  # [(Hq+Hkv)*D + Hkv*D + (Hq+Hkv)*D, H]: q, k, v, rot(q), rot(k)
    wo_t: torch.Tensor  # [Hq*D, H] (a transposed view, for addmm)
    ffn_norm: torch.Tensor
    gate_up: torch.Tensor  # [2F, H]
    down_t: torch.Tensor  # [F, H]

    @classmethod
    def of(cls, lay: Layer, cfg: Config) -> FusedLayer:
        rot = [rotate_rows(lay.wq, cfg.n_heads), rotate_rows(lay.wk, cfg.n_kv_heads)]
        return cls(
            attn_norm=lay.attn_norm,
            qkv=torch.cat([lay.wq, lay.wk, lay.wv, *rot]).contiguous(),
            wo_t=lay.wo.T,
            ffn_norm=lay.ffn_norm,
            gate_up=torch.cat([lay.w_gate, lay.w_up]).contiguous(),
            down_t=lay.w_down.T,
        )


def rope_tables(cfg: Config, positions: int, device, dtype):
    """cos and sin ``[positions, 1, D]`` in ``dtype``, as ``model.rope`` computes them."""
    pos = torch.arange(positions, device=device)
    return rope_cos_sin(pos, cfg.head_dim, cfg.rope_theta, dtype)


class Engine:
    """The target model's forwards over a `Pool`; `draft_layers` of them are the drafter."""

    def __init__(self, w: Weights, pool: Pool, draft_layers: int):
        self.w, self.pool, self.cfg = w, pool, w.config
        self.draft_layers = draft_layers
        self.sm_scale = 1 / math.sqrt(self.cfg.head_dim)
        self.layers = [FusedLayer.of(lay, self.cfg) for lay in w.layers]
        dev, dtype = w.embed.device, w.embed.dtype
        self.cos, self.sin = rope_tables(self.cfg, pool.positions, dev, dtype)
        self.workspaces: dict[tuple, ddtree.AttentionWorkspace] = {}

    @property
    def device(self) -> torch.device:
        return self.w.embed.device

    def workspace(self, bs: int, q_nodes: int):
        """The attention workspace of a (bs, Q) shape on CUDA, made once (None on the CPU).
        Made outside any capture: a decoder calls it before capturing its round."""
        if self.device.type != "cuda":
            return None
        key = (bs, q_nodes)
        if key not in self.workspaces:
            cfg = self.cfg
            self.workspaces[key] = ddtree.AttentionWorkspace(
                self.device, max_batch=bs, q_nodes=q_nodes, hq=cfg.n_heads,
                hkv=cfg.n_kv_heads, dqk=cfg.head_dim, dv=cfg.head_dim,
            )  # fmt: skip
        return self.workspaces[key]

    def norm(self, h, weight):
        return F.rms_norm(h, (h.shape[-1],), weight, self.cfg.rms_eps)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return (self.norm(h, self.w.norm) @ self.w.embed.T).float()

    def rope(self, positions):
        """cos and sin ``[n, 1, D]`` of `positions` [n], gathered once per forward."""
        return self.cos[positions], self.sin[positions]

    def qkv(self, lay: FusedLayer, h, rope):
        """Q, K (RoPE applied, `rope` = self.rope(positions)) and V of hidden states [n, H]:
        views."""
        cfg = self.cfg
        n, d = h.shape[0], cfg.head_dim
        heads = cfg.n_heads + cfg.n_kv_heads
        y = self.norm(h, lay.attn_norm) @ lay.qkv.T
        qk = y[:, : heads * d].view(n, heads, d)
        v = y[:, heads * d : (heads + cfg.n_kv_heads) * d].view(n, cfg.n_kv_heads, d)
        rot = y[:, (heads + cfg.n_kv_heads) * d :].view(n, heads, d)
        cos, sin = rope
        qk = torch.addcmul(qk * cos, rot, sin)
        return qk[:, : cfg.n_heads], qk[:, cfg.n_heads :], v

    def mlp(self, lay: FusedLayer, h):
        gu = self.norm(h, lay.ffn_norm) @ lay.gate_up.T
        f = self.cfg.ffn
        return torch.addmm(h, F.silu(gu[:, :f]) * gu[:, f:], lay.down_t)

    def prefill(self, b: int, tokens: list[int], keep=()) -> torch.Tensor:
        """Request b's prompt into the pool (positions 0..T-1); returns its last logits
        (and with `keep`, layer indices, the hidden states after those layers side by side
        [T, len(keep) * H], for a drafter's context). Eager, one request at a time, causal
        SDPA over the prompt."""
        dev = self.device
        t = torch.tensor(tokens, device=dev)
        pos = torch.arange(len(tokens), device=dev)
        slots = self.pool.slots_of(torch.tensor([b], device=dev), pos.unsqueeze(0))[0]
        h = self.w.embed[t]
        group = self.cfg.n_heads // self.cfg.n_kv_heads
        rope = self.rope(pos)
        kept = []
        for i, lay in enumerate(self.layers):
            q, k, v = self.qkv(lay, h, rope)
            self.pool.k[i][slots], self.pool.v[i][slots] = k, v
            kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            o = F.scaled_dot_product_attention(
                q.transpose(0, 1), kk.transpose(0, 1), vv.transpose(0, 1), is_causal=True
            ).transpose(0, 1)
            h = torch.addmm(h, o.reshape(len(tokens), -1), lay.wo_t)
            h = self.mlp(lay, h)
            if i in keep:
                kept.append(h)
        logits = self.logits(h[-1:])[0]
        return (logits, torch.cat(kept, dim=1)) if keep else logits

    def verify(self, tree: ddtree.Tree, prefix_lens, window, layers=None, keep=()):
        """The verify forward of `tree` (node tokens at their positions, attention by the
        tree's ancestor bits over each request's prefix): writes the nodes' K/V into the
        `window` slots [bs, Q] and returns logits [bs, Q, V] (hidden [bs*Q, H] if `layers`
        stops early, for the drafter). With `keep` (layer indices), returns (logits, the
        hidden states after those layers side by side [bs*Q, len(keep)*H]) — what a drafter
        that reads the target's hidden states asks for. No host sync; capturable on CUDA."""
        bs, q_nodes = tree.verify_ids.shape
        rope = self.rope(tree.positions.flatten())
        h = self.w.embed[tree.verify_ids.flatten()]
        workspace = self.workspace(bs, q_nodes)
        slots = window.flatten()
        kept = []
        for i, lay in enumerate(self.layers[: layers or self.cfg.n_layers]):
            q, k, v = self.qkv(lay, h, rope)
            self.pool.k[i].index_copy_(0, slots, k)
            self.pool.v[i].index_copy_(0, slots, v)
            o = ddtree.tree_attention(
                q, k, v, self.pool.k[i], self.pool.v[i], self.pool.kv_indptr,
                self.pool.kv_indices, prefix_lens, tree, sm_scale=self.sm_scale,
                page_size=self.pool.page_size, workspace=workspace,
            )  # fmt: skip
            h = torch.addmm(h, o.reshape(bs * q_nodes, -1), lay.wo_t)
            h = self.mlp(lay, h)
            if i in keep:
                kept.append(h)
        if layers is not None:
            return h
        logits = self.logits(h).view(bs, q_nodes, -1)
        return (logits, torch.cat(kept, dim=1)) if keep else logits
