"""The drafter's training data, made fast: the target decodes hundreds of prompts at once
over a dense KV cache, then one batched prefill per chunk of finished sequences gives their
tapped hidden states and the target's own next-token choice at every position.

Why not the demo's decoders: they serve a few requests through the paged pool, prefill one
prompt at a time and re-capture their graphs per batch — right for measuring a decode,
~3k tokens/s for making data. Here a batch is a plain ``[B, S]`` cache per layer, every
sequence at its own position, and the host reads nothing but a done flag every few steps.

A sampled response follows a branching policy (`Policy`): each token is the target's argmax,
except with probability ``branch`` a draw at ``temperature``. The text stays close to what
greedy decoding visits (what the drafter is judged on) while the prompts' responses differ
from copy to copy. The labels are the target's argmax after each prefix, not the sampled
tokens: the drafter learns what greedy decoding would say next.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .engine import Engine, Pool
from .model import Weights

# Sequences per chunk of the labelling prefill (its logits are chunk x width x V).
LABEL_CHUNK = 32


@dataclass(frozen=True)
class Policy:
    """How a response picks each token: argmax, or with probability `branch` a draw at
    `temperature`. ``Policy()`` is greedy."""

    branch: float = 0.0
    temperature: float = 1.0

    def __post_init__(self):
        if not 0.0 <= self.branch <= 1.0:
            raise ValueError(f"branch: must be in [0, 1], got {self.branch}")
        if self.branch > 0 and not self.temperature > 0:
            raise ValueError(f"temperature: must be > 0 to branch, got {self.temperature}")


def engine_for(target: Weights, positions: int) -> Engine:
    """An engine for the fused weights and RoPE tables up to `positions` (its paged pool,
    one small request, is not used here)."""
    pool = Pool(target, 1, positions, 16, target.embed.device, target.embed.dtype)
    return Engine(target, pool, draft_layers=1)


class DenseBatch:
    """The target over `bs` sequences with one dense K and V cache ``[bs, Hkv, S, D]`` per
    layer, each sequence at its own length."""

    def __init__(self, engine: Engine, bs: int, capacity: int):
        cfg, dev, dtype = engine.cfg, engine.device, engine.w.embed.dtype
        self.e, self.bs, self.capacity = engine, bs, capacity
        shape = (bs, cfg.n_kv_heads, capacity, cfg.head_dim)
        self.k = [torch.zeros(shape, device=dev, dtype=dtype) for _ in range(cfg.n_layers)]
        self.v = [torch.zeros(shape, device=dev, dtype=dtype) for _ in range(cfg.n_layers)]
        self.rows = torch.arange(bs, device=dev)

    def _split(self, y: torch.Tensor, n: int) -> torch.Tensor:
        """[bs*n, heads, D] -> [bs, heads, n, D]."""
        return y.view(self.bs, n, *y.shape[1:]).transpose(1, 2)

    def prefill(self, tokens: torch.Tensor, keep=()) -> tuple[torch.Tensor, list]:
        """Tokens [bs, n] (right-padded) at positions 0..n-1: caches them; returns the last
        layer's hidden states [bs, n, H] and those after the `keep` layers. Causal, so a
        row's padding never reaches its real tokens."""
        e, (bs, n) = self.e, tokens.shape
        rope = e.rope(torch.arange(n, device=tokens.device).repeat(bs))
        h = e.w.embed[tokens.flatten()]
        kept = []
        for i, lay in enumerate(e.layers):
            q, k, v = (self._split(y, n) for y in e.qkv(lay, h, rope))
            self.k[i][:, :, :n], self.v[i][:, :, :n] = k, v
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            h = torch.addmm(h, o.transpose(1, 2).reshape(bs * n, -1), lay.wo_t)
            h = e.mlp(lay, h)
            if i in keep:
                kept.append(h.view(bs, n, -1))
        return h.view(bs, n, -1), kept

    def step(self, tokens: torch.Tensor, pos: torch.Tensor, upto: int) -> torch.Tensor:
        """One token per sequence, `tokens` [bs] at positions `pos` [bs] (all < `upto`):
        cached, attending to each sequence's positions 0..pos; returns logits [bs, V]."""
        e, cfg = self.e, self.e.cfg
        h = e.w.embed[tokens]
        rope = e.rope(pos)
        visible = torch.arange(upto, device=pos.device) <= pos.unsqueeze(1)  # [bs, upto]
        group = cfg.n_heads // cfg.n_kv_heads
        for i, lay in enumerate(e.layers):
            q, k, v = e.qkv(lay, h, rope)
            self.k[i][self.rows, :, pos] = k
            self.v[i][self.rows, :, pos] = v
            kc, vc = self.k[i][:, :, :upto], self.v[i][:, :, :upto]
            qg = q.view(self.bs, cfg.n_kv_heads, group, cfg.head_dim)
            s = torch.einsum("bhgd,bhsd->bhgs", qg, kc).float() * e.sm_scale
            s = s.masked_fill(~visible[:, None, None], float("-inf"))
            o = torch.einsum("bhgs,bhsd->bhgd", s.softmax(-1).to(vc.dtype), vc)
            h = torch.addmm(h, o.reshape(self.bs, -1), lay.wo_t)
            h = e.mlp(lay, h)
        return e.logits(h)


def pick(logits: torch.Tensor, policy: Policy, g: torch.Generator | None) -> torch.Tensor:
    """Each row's next token under `policy` (draws from `g`)."""
    best = logits.argmax(-1)
    if policy.branch == 0:
        return best
    # Gumbel-max: the argmax of logits/T + Gumbel noise is a draw at temperature T.
    u = torch.rand(logits.shape, generator=g, device=logits.device).clamp_(min=1e-20)
    draw = (logits / policy.temperature - torch.log(-torch.log(u))).argmax(-1)
    take = torch.rand(best.shape, generator=g, device=best.device) < policy.branch
    return torch.where(take, draw, best)


@torch.no_grad()
def respond(engine: Engine, prompts: list[list[int]], max_new: int, eos: int, policy: Policy,
            g: torch.Generator | None = None) -> list[list[int]]:  # fmt: skip
    """The target's responses to `prompts` decoded together, each cut after its `eos` and
    at `max_new` tokens."""
    dev, bs = engine.device, len(prompts)
    lens = torch.tensor([len(p) for p in prompts], device=dev)
    tokens = padded(prompts, dev)
    width = tokens.shape[1]
    batch = DenseBatch(engine, bs, width + max_new)
    h, _ = batch.prefill(tokens)
    nxt = pick(engine.logits(h[batch.rows, lens - 1]), policy, g)
    out = torch.full((bs, max_new), eos, dtype=torch.int64, device=dev)
    done = torch.zeros(bs, dtype=torch.bool, device=dev)
    for t in range(max_new):
        out[:, t] = torch.where(done, eos, nxt)
        done |= nxt == eos
        if t + 1 == max_new or (t % 16 == 15 and bool(done.all())):
            break
        nxt = pick(batch.step(nxt, lens + t, width + t + 1), policy, g)
    return [_cut(row, eos) for row in out.tolist()]


def _cut(row: list[int], eos: int) -> list[int]:
    return row[: row.index(eos) + 1] if eos in row else row


def padded(seqs: list[list[int]], device) -> torch.Tensor:
    """Token lists right-padded with 0 into one int64 ``[len(seqs), longest]`` tensor on
    `device` (filled on the host, copied once)."""
    out = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.int64)
    for n, s in enumerate(seqs):
        out[n, : len(s)] = torch.tensor(s)
    return out.to(device)


@torch.no_grad()
def annotate(engine: Engine, tokens: torch.Tensor, lengths: list[int], taps, out_taps,
             out_labels, out_final=None) -> None:  # fmt: skip
    """For each sequence of `tokens` (`padded`, on the engine's device; real `lengths`):
    the hidden states after the `taps` layers side by side into ``out_taps[n, :len]`` and,
    into ``out_labels[n, 1:len]``, the target's argmax after each prefix (the greedy choice
    for position t given tokens 0..t-1); with `out_final`, the final normed hidden state at
    each position into ``out_final[n, :len]`` (its product with the embedding is the
    target's next-token logits there)."""
    for lo in range(0, len(lengths), LABEL_CHUNK):
        lens = lengths[lo : lo + LABEL_CHUNK]
        chunk = tokens[lo : lo + len(lens), : max(lens)]
        h, kept = DenseBatch(engine, len(lens), chunk.shape[1]).prefill(chunk, keep=taps)
        hidden = torch.cat(kept, dim=2)
        final = engine.norm(h, engine.w.norm)
        best = (final @ engine.w.embed.T).argmax(-1)
        for b, n in enumerate(lens):
            out_taps[lo + b, :n] = hidden[b, :n]
            out_labels[lo + b, 1:n] = best[b, : n - 1]
            if out_final is not None:
                out_final[lo + b, :n] = final[b, :n]
