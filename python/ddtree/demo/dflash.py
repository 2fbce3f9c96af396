"""A DFlash block drafter (arXiv 2602.06036) for the demo's target: a few transformer layers
of the target's shape that read the target's hidden states and predict a whole block of L
tokens in one forward.

* Context ("KV injection"): the target's hidden states after the `taps` layers, side by
  side, fused by one linear layer and an RMSNorm into one context feature per committed
  token. Each draft layer projects the features through its own K/V weights (K with RoPE
  at the token's position); those K/V rows are the draft layer's cache, in a paged pool
  laid out like the target's (same pages and slots), extended by every round's accepted
  tokens.
* Block: ``[root, MASK x (L - 1)]`` at positions ``P .. P+L-1`` (P = committed tokens; the
  root is the next token, not yet committed), embedded with the target's frozen embedding
  and a learned mask vector; attention inside the block is bidirectional and every block
  position sees the whole context. Block position i predicts the token at ``P + i + 1``
  through the target's final projection (tied embedding) after the drafter's own norm, so
  the L outputs are the ``[bs, L, V]`` draft logits ``Stepper.step`` takes.

`DFlashDrafter` runs the block inside the engine's round (``ddtree.tree_attention`` with an
all-visible block tree over the context pool; capturable); `reference_block` is the
straightforward dense version, which the tests hold it to and training uses (batched, with
a mask, in `block_logits`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

import ddtree
from ddtree import Tree, reference

from .model import Config, Layer, apply_rope, rope, rope_cos_sin

TAPS_30 = (1, 8, 14, 20, 27)  # DFlash's taps for a 30-layer target (0-based layer indices)


@dataclass(frozen=True)
class DraftConfig:
    """The drafter's shape: `layers` draft layers of the target's shape, block size
    `block` (= L, the draft depth), target layers `taps` read for the context."""

    target: Config
    layers: int = 1
    block: int = 8
    taps: tuple[int, ...] = TAPS_30

    def __post_init__(self):
        if not 1 <= self.block <= 20:
            raise ValueError(f"block: must be in 1..20 (the tree build's depth), got {self.block}")
        if not self.taps or any(not 0 <= t < self.target.n_layers for t in self.taps):
            raise ValueError(f"taps: each must be a target layer 0..{self.target.n_layers - 1}")
        # The engine hands over the tapped layers' hidden states in layer order, once each.
        if list(self.taps) != sorted(set(self.taps)):
            raise ValueError(f"taps: must be strictly increasing, got {self.taps}")


@dataclass
class DraftWeights:
    """The drafter's own weights (the target's embedding is shared, frozen)."""

    fc: torch.Tensor  # [H, len(taps) * H]: the taps' fusion
    fc_norm: torch.Tensor  # [H]
    mask: torch.Tensor  # [H]: the MASK token's embedding
    layers: list[Layer]
    norm: torch.Tensor  # [H]: before the tied LM head

    @classmethod
    def init(cls, cfg: DraftConfig, seed: int = 0, dtype=torch.float32) -> DraftWeights:
        """Random initial weights (normal, std 0.02; norms at one), reproducible by seed."""
        t = cfg.target
        g = torch.Generator().manual_seed(seed)

        def w(*shape):
            return (torch.randn(*shape, generator=g) * 0.02).to(dtype)

        def ones(n):
            return torch.ones(n, dtype=dtype)

        h, q, kv = t.hidden, t.n_heads * t.head_dim, t.n_kv_heads * t.head_dim
        layers = [
            Layer(
                ones(h),
                w(q, h),
                w(kv, h),
                w(kv, h),
                w(h, q),
                ones(h),
                w(t.ffn, h),
                w(t.ffn, h),
                w(h, t.ffn),
            )  # fmt: skip
            for _ in range(cfg.layers)
        ]
        return cls(w(h, len(cfg.taps) * h), ones(h), w(h), layers, ones(h))

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every weight by name (``layers.i.<field>`` for the layers), for saving."""
        out = {"fc": self.fc, "fc_norm": self.fc_norm, "mask": self.mask, "norm": self.norm}
        for i, lay in enumerate(self.layers):
            for f in fields(Layer):
                out[f"layers.{i}.{f.name}"] = getattr(lay, f.name)
        return out

    @classmethod
    def from_tensors(cls, t: dict[str, torch.Tensor], layers: int) -> DraftWeights:
        lays = [Layer(**{f.name: t[f"layers.{i}.{f.name}"] for f in fields(Layer)})
                for i in range(layers)]  # fmt: skip
        return cls(t["fc"], t["fc_norm"], t["mask"], lays, t["norm"])

    def to(self, device=None, dtype=None) -> DraftWeights:
        moved = {k: v.to(device=device, dtype=dtype) for k, v in self.tensors().items()}
        return DraftWeights.from_tensors(moved, len(self.layers))

    def parameters(self) -> list[torch.Tensor]:
        return list(self.tensors().values())


# ---------------------------------------------------------------------------------------------
# The math, shared by the engine path, the reference and training
# ---------------------------------------------------------------------------------------------


def norm(x, weight, eps):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def context(w: DraftWeights, cfg: DraftConfig, taps_hidden: torch.Tensor) -> torch.Tensor:
    """Context features [..., H] of tapped hidden states [..., len(taps) * H]."""
    return norm(taps_hidden @ w.fc.T, w.fc_norm, cfg.target.rms_eps)


def context_kv(lay: Layer, cfg: DraftConfig, ctx: torch.Tensor, cos, sin):
    """One draft layer's K (RoPE by `cos`, `sin` of the tokens' positions) and V
    [n, Hkv, D] of context features [n, H]."""
    t = cfg.target
    k = (ctx @ lay.wk.T).view(-1, t.n_kv_heads, t.head_dim)
    v = (ctx @ lay.wv.T).view(-1, t.n_kv_heads, t.head_dim)
    return apply_rope(k, cos, sin), v


def block_input(w: DraftWeights, embed: torch.Tensor, roots: torch.Tensor, block: int):
    """The block's hidden states [bs, L, H]: the root's embedding, then MASK."""
    h = w.mask.expand(roots.shape[0], block, -1).clone()
    h[:, 0] = embed[roots]
    return h


def mlp(lay: Layer, h, eps):
    x = norm(h, lay.ffn_norm, eps)
    return h + (F.silu(x @ lay.w_gate.T) * (x @ lay.w_up.T)) @ lay.w_down.T


def head(w: DraftWeights, cfg: DraftConfig, embed: torch.Tensor, h: torch.Tensor):
    """Draft logits (float32) of block hidden states: own norm, then the tied embedding."""
    return (norm(h, w.norm, cfg.target.rms_eps) @ embed.T).float()


def reference_block(w: DraftWeights, cfg: DraftConfig, embed, taps_hidden, root: int):
    """One request's draft logits [L, V], densely: the context of its P committed tokens'
    tapped hidden states [P, len(taps) * H], the block of `root` at positions P..P+L-1."""
    t = cfg.target
    p, L = taps_hidden.shape[0], cfg.block
    ctx = context(w, cfg, taps_hidden)
    pos_ctx, pos_blk = torch.arange(p), torch.arange(p, p + L)
    h = block_input(w, embed, torch.tensor([root]), L)[0]
    group = t.n_heads // t.n_kv_heads
    for lay in w.layers:
        kc, vc = context_kv(lay, cfg, ctx, *rope_cos_sin(pos_ctx, t.head_dim, t.rope_theta,
                                                         ctx.dtype))  # fmt: skip
        x = norm(h, lay.attn_norm, t.rms_eps)
        q = rope((x @ lay.wq.T).view(L, t.n_heads, t.head_dim), pos_blk, t.rope_theta)
        kb = rope((x @ lay.wk.T).view(L, t.n_kv_heads, t.head_dim), pos_blk, t.rope_theta)
        vb = (x @ lay.wv.T).view(L, t.n_kv_heads, t.head_dim)
        k = torch.cat([kc, kb]).repeat_interleave(group, 1)
        v = torch.cat([vc, vb]).repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) / t.head_dim**0.5
        o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.float()).to(h.dtype)
        h = h + o.reshape(L, -1) @ lay.wo.T
        h = mlp(lay, h, t.rms_eps)
    return head(w, cfg, embed, h)


def block_logits(w: DraftWeights, cfg: DraftConfig, embed, taps_hidden, tokens, anchors):
    """Training's batched forward: for each sequence of `tokens` [N, T] (tapped hidden
    states [N, T, len(taps) * H]) and each of its `anchors` [N, A] (root positions, each
    with at least one context token), the block's draft logits [N, A, L, V]. Block j sees
    the context before its anchor and its own block only (one SDPA with a boolean mask)."""
    t = cfg.target
    n, T = tokens.shape
    a, L = anchors.shape[1], cfg.block
    ctx = context(w, cfg, taps_hidden)  # [N, T, H]
    roots = tokens.gather(1, anchors)  # [N, A]
    h = block_input(w, embed, roots.flatten(), L).view(n, a * L, -1)
    pos_blk = (anchors.unsqueeze(2) + torch.arange(L, device=tokens.device)).view(n, a * L)
    pos_ctx = torch.arange(T, device=tokens.device).expand(n, T)
    # Query rows (block j, i) see context keys before anchor j and block j's own keys.
    blk_of = torch.arange(a * L, device=tokens.device) // L
    see_ctx = pos_ctx.unsqueeze(1) < anchors.repeat_interleave(L, 1).unsqueeze(2)
    see_blk = (blk_of.unsqueeze(1) == blk_of.unsqueeze(0)).expand(n, -1, -1)
    mask = torch.cat([see_ctx, see_blk], dim=2).unsqueeze(1)  # [N, 1, A*L, T + A*L]
    group = t.n_heads // t.n_kv_heads
    for lay in w.layers:
        kc = rope((ctx @ lay.wk.T).view(n, T, t.n_kv_heads, t.head_dim), pos_ctx, t.rope_theta)
        vc = (ctx @ lay.wv.T).view(n, T, t.n_kv_heads, t.head_dim)
        x = norm(h, lay.attn_norm, t.rms_eps)
        q = rope((x @ lay.wq.T).view(n, a * L, t.n_heads, t.head_dim), pos_blk, t.rope_theta)
        kb = rope((x @ lay.wk.T).view(n, a * L, t.n_kv_heads, t.head_dim), pos_blk,
                  t.rope_theta)  # fmt: skip
        vb = (x @ lay.wv.T).view(n, a * L, t.n_kv_heads, t.head_dim)
        k = torch.cat([kc, kb], 1).repeat_interleave(group, 2).transpose(1, 2)
        v = torch.cat([vc, vb], 1).repeat_interleave(group, 2).transpose(1, 2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask)
        h = h + o.transpose(1, 2).reshape(n, a * L, -1) @ lay.wo.T
        h = mlp(lay, h, t.rms_eps)
    return head(w, cfg, embed, h).view(n, a, L, -1)


# ---------------------------------------------------------------------------------------------
# The drafter inside the engine's round
# ---------------------------------------------------------------------------------------------


def block_tree(bs: int, block: int, device) -> Tree:
    """A Tree whose `block` nodes all see each other (bidirectional attention): what the
    tree attention needs for a block; the positions are filled per round."""
    words = (block + 31) // 32
    bits = torch.from_numpy(reference.pack_bits([set(range(block))], words)[0])
    i64 = {"dtype": torch.int64, "device": device}
    idx = torch.arange(block, **i64)
    return Tree(
        verify_ids=torch.zeros(bs, block, **i64),
        positions=torch.zeros(bs, block, **i64),
        depths=idx.expand(bs, block).contiguous(),
        parents=torch.full((bs, block), -1, **i64),
        first_child=torch.full((bs, block), -1, **i64),
        next_sibling=torch.full((bs, block), -1, **i64),
        ancestor_bits=bits.to(device).expand(bs, block, words).contiguous(),
        num_nodes=torch.full((bs,), block - 1, **i64),
        scores=torch.zeros(bs, block, dtype=torch.float64, device=device),
        topk_logprobs=torch.zeros(bs, 1, 1, device=device),
        topk_ids=torch.zeros(bs, 1, 1, **i64),
        status=torch.zeros(bs, dtype=torch.int32, device=device),
    )


class DFlashDrafter:
    """The `decode.Drafter` of a DFlash drafter over `engine` (its embedding, RoPE tables
    and pool layout) for `bs` requests: its own context pool, one K and V per draft layer.

    `depth` (default: the block) is how many of the block's positions get logits: a tree of
    B nodes is never deeper than B, so a decoder with B < L asks for B and skips the LM head
    of the positions it cannot use (the block still runs whole: its attention is
    bidirectional)."""

    def __init__(self, engine, w: DraftWeights, cfg: DraftConfig, bs: int, depth=None):
        self.engine, self.w, self.cfg = engine, w, cfg
        self.depth = cfg.block if depth is None else depth
        if not 1 <= self.depth <= cfg.block:
            raise ValueError(f"depth: must be in 1..{cfg.block} (the block), got {depth}")
        self.hidden_layers = tuple(cfg.taps)
        t, pool, dev = cfg.target, engine.pool, engine.device
        shape = (pool.slots, t.n_kv_heads, t.head_dim)
        dtype = engine.w.embed.dtype
        self.k = [torch.zeros(shape, device=dev, dtype=dtype) for _ in w.layers]
        self.v = [torch.zeros(shape, device=dev, dtype=dtype) for _ in w.layers]
        self.tree = block_tree(bs, cfg.block, dev)
        self.offsets = torch.arange(cfg.block, device=dev)
        self.rows = torch.arange(bs, device=dev)
        engine.workspace(bs, cfg.block)

    def start(self, b: int, taps_hidden: torch.Tensor) -> None:
        """Request b's prompt (tapped hidden states [T, k*H]) into the context pool."""
        dev = self.engine.device
        pos = torch.arange(taps_hidden.shape[0], device=dev)
        slots = self.engine.pool.slots_of(torch.tensor([b], device=dev), pos.unsqueeze(0))[0]
        self._write(taps_hidden, pos, slots)

    def absorb(self, hidden, accept_len, prefix) -> None:
        """A round's accepted rows [bs, L+1, k*H] into the context at positions prefix..;
        rows past accept_len land past the new prefix, where the next rounds overwrite them
        before any attention reads them."""
        bs, rows = hidden.shape[:2]
        pos = prefix.unsqueeze(1) + torch.arange(rows, device=prefix.device)
        slots = self.engine.pool.slots_of(self.rows[:bs], pos)
        self._write(hidden.reshape(bs * rows, -1), pos.flatten(), slots.flatten())

    def _write(self, taps_hidden, positions, slots) -> None:
        ctx = context(self.w, self.cfg, taps_hidden)
        cos, sin = self.engine.rope(positions)
        for i, lay in enumerate(self.w.layers):
            k, v = context_kv(lay, self.cfg, ctx, cos, sin)
            self.k[i].index_copy_(0, slots, k)
            self.v[i].index_copy_(0, slots, v)

    def __call__(self, roots, prefix):
        e, t, L = self.engine, self.cfg.target, self.cfg.block
        bs = roots.shape[0]
        torch.add(prefix.unsqueeze(1), self.offsets, out=self.tree.positions)
        cos, sin = e.rope(self.tree.positions.flatten())  # the engine's table, once a call
        h = block_input(self.w, e.w.embed, roots, L).view(bs * L, -1)
        workspace = e.workspace(bs, L)
        indptr = e.pool.kv_indptr[: bs + 1]  # the first bs requests' pages
        for i, lay in enumerate(self.w.layers):
            x = norm(h, lay.attn_norm, t.rms_eps)
            q = apply_rope((x @ lay.wq.T).view(-1, t.n_heads, t.head_dim), cos, sin)
            k = apply_rope((x @ lay.wk.T).view(-1, t.n_kv_heads, t.head_dim), cos, sin)
            v = (x @ lay.wv.T).view(-1, t.n_kv_heads, t.head_dim)
            o = ddtree.tree_attention(
                q, k, v, self.k[i], self.v[i], indptr, e.pool.kv_indices, prefix, self.tree,
                sm_scale=t.head_dim**-0.5, page_size=e.pool.page_size, workspace=workspace,
            )  # fmt: skip
            h = h + o.reshape(bs * L, -1) @ lay.wo.T
            h = mlp(lay, h, t.rms_eps)
        return head(self.w, self.cfg, e.w.embed, h.view(bs, L, -1)[:, : self.depth])
