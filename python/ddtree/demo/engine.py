"""A minimal LLaMA serving engine for the demo: a paged KV pool, prefill, and the verify
forward whose attention is ``ddtree.tree_attention`` (the CUDA kernel on GPU tensors, the
readable path on the CPU), plus the early-exit drafter.

Layout of the pool: one K and one V tensor per layer, ``[slots, Hkv, D]``; request b owns
the pages ``page_table[b]`` (page size ``page_size``), token t of its sequence lives in slot
``page_table[b][t // ps] * ps + t % ps``. A verify round writes the tree's K/V into the
slots of positions ``P .. P+Q-1`` (SGLang's ``out_cache_loc``); after the accept,
``compact_kv`` moves the accepted path's rows to positions ``P .. P+accept_len-1``.
"""

from __future__ import annotations

import math

import torch

import ddtree

from .model import Weights, rms_norm, rope


class Pool:
    """The paged KV pool of every layer and each request's page list."""

    def __init__(self, w: Weights, bs: int, max_tokens: int, page_size: int, device, dtype):
        cfg = w.config
        self.page_size = page_size
        pages = -(-max_tokens // page_size)
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


class Engine:
    """The target model's forwards over a `Pool`; `draft_layers` of them are the drafter."""

    def __init__(self, w: Weights, pool: Pool, draft_layers: int):
        self.w, self.pool, self.cfg = w, pool, w.config
        self.draft_layers = draft_layers
        self.sm_scale = 1 / math.sqrt(self.cfg.head_dim)
        self.workspaces: dict[tuple, ddtree.AttentionWorkspace] = {}

    def workspace(self, bs: int, q_nodes: int):
        """The attention workspace of a (bs, Q) shape on CUDA, made once (None on the CPU)."""
        if self.pool.k[0].device.type != "cuda":
            return None
        key = (bs, q_nodes)
        if key not in self.workspaces:
            cfg = self.cfg
            self.workspaces[key] = ddtree.AttentionWorkspace(
                self.pool.k[0].device, max_batch=bs, q_nodes=q_nodes, hq=cfg.n_heads,
                hkv=cfg.n_kv_heads, dqk=cfg.head_dim, dv=cfg.head_dim,
            )  # fmt: skip
        return self.workspaces[key]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return (rms_norm(h, self.w.norm, self.cfg.rms_eps) @ self.w.embed.T).float()

    def qkv(self, layer, h, positions):
        """Projections of hidden states [n, H] at `positions` [n], RoPE applied."""
        cfg = self.cfg
        x = rms_norm(h, layer.attn_norm, cfg.rms_eps)
        q = (x @ layer.wq.T).view(-1, cfg.n_heads, cfg.head_dim)
        k = (x @ layer.wk.T).view(-1, cfg.n_kv_heads, cfg.head_dim)
        v = (x @ layer.wv.T).view(-1, cfg.n_kv_heads, cfg.head_dim)
        return rope(q, positions, cfg.rope_theta), rope(k, positions, cfg.rope_theta), v

    def mlp(self, layer, h):
        x = rms_norm(h, layer.ffn_norm, self.cfg.rms_eps)
        gate = torch.nn.functional.silu(x @ layer.w_gate.T)
        return h + (gate * (x @ layer.w_up.T)) @ layer.w_down.T

    def prefill(self, b: int, tokens: list[int]) -> torch.Tensor:
        """Request b's prompt into the pool (positions 0..T-1); returns its last logits."""
        dev = self.pool.k[0].device
        t = torch.tensor(tokens, device=dev)
        pos = torch.arange(len(tokens), device=dev)
        slots = self.pool.slots_of(torch.tensor([b], device=dev), pos.unsqueeze(0))[0]
        h = self.w.embed[t]
        group = self.cfg.n_heads // self.cfg.n_kv_heads
        for i, layer in enumerate(self.w.layers):
            q, k, v = self.qkv(layer, h, pos)
            self.pool.k[i][slots], self.pool.v[i][slots] = k, v
            kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            o = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(0, 1), kk.transpose(0, 1), vv.transpose(0, 1), is_causal=True
            ).transpose(0, 1)
            h = h + o.reshape(len(tokens), -1) @ layer.wo.T
            h = self.mlp(layer, h)
        return self.logits(h[-1:])[0]

    def verify(self, tree: ddtree.Tree, prefix_lens, window, layers=None):
        """The verify forward of `tree` (node tokens at their positions, attention by the
        tree's ancestor bits over each request's prefix): writes the nodes' K/V into the
        `window` slots [bs, Q] and returns logits [bs, Q, V] (hidden [bs*Q, H] if `layers`
        stops early, for the drafter)."""
        bs, q_nodes = tree.verify_ids.shape
        tokens = tree.verify_ids.flatten()
        positions = tree.positions.flatten()
        h = self.w.embed[tokens]
        workspace = self.workspace(bs, q_nodes)
        slots = window.flatten()
        for i, layer in enumerate(self.w.layers[: layers or self.cfg.n_layers]):
            q, k, v = self.qkv(layer, h, positions)
            self.pool.k[i][slots], self.pool.v[i][slots] = k, v
            o = ddtree.tree_attention(
                q, k, v, self.pool.k[i], self.pool.v[i], self.pool.kv_indptr,
                self.pool.kv_indices, prefix_lens, tree, sm_scale=self.sm_scale,
                page_size=self.pool.page_size, workspace=workspace,
            )  # fmt: skip
            h = h + o.reshape(bs * q_nodes, -1) @ layer.wo.T
            h = self.mlp(layer, h)
        if layers is not None:
            return h
        return self.logits(h).view(bs, q_nodes, -1)
