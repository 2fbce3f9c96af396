"""The three decoders of the demo over one batch of prompts: plain greedy (one token per
forward), chain speculation (the drafter's argmax path, verified causally) and DDTree
(``Stepper.step`` -> verify with tree attention -> ``Stepper.accept`` -> ``compact_kv``).

The drafter is the target's own first ``draft_layers`` layers with its final norm and LM
head (an early-exit drafter): per round it extends the root by its own argmax token L
times, reading the committed prefix's K/V of those layers from the shared pool, so its
per-depth distributions ``[bs, L, V]`` come from the committed tokens and its own drafts
only — never from the target's outputs for the round.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

import ddtree
import ddtree.sglang
from ddtree import Tree

from .engine import Engine


def chain_tree(tokens: torch.Tensor, prefix: torch.Tensor) -> Tree:
    """The Tree of a causal chain of n tokens [bs, n] after prefixes [bs]: node i's parent
    is i-1, each node sees itself and the nodes before it."""
    bs, n = tokens.shape
    dev = tokens.device
    idx = torch.arange(n, device=dev)
    words = (n + 31) // 32
    # Node i sees nodes 0..i: its low i+1 bits, packed in int32 words (built on the host,
    # copied once).
    row = [((1 << (i + 1)) - 1) for i in range(n)]
    packed = [[(r >> (32 * w)) & 0xFFFFFFFF for w in range(words)] for r in row]
    bits = torch.tensor(packed, dtype=torch.int64)
    bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32).to(dev)
    nxt = torch.where(idx + 1 < n, idx + 1, -1)
    full = torch.full((bs, n), -1, dtype=torch.int64, device=dev)
    return Tree(
        verify_ids=tokens.contiguous(),
        positions=prefix.unsqueeze(1) + idx,
        depths=idx.expand(bs, n).contiguous(),
        parents=(idx - 1).expand(bs, n).contiguous(),
        first_child=nxt.expand(bs, n).contiguous(),
        next_sibling=full,
        ancestor_bits=bits.expand(bs, n, words).contiguous(),
        num_nodes=torch.full((bs,), n - 1, dtype=torch.int64, device=dev),
        scores=torch.zeros(bs, n, dtype=torch.float64, device=dev),
        topk_logprobs=torch.zeros(bs, 1, 1, device=dev),
        topk_ids=torch.zeros(bs, 1, 1, dtype=torch.int64, device=dev),
        status=torch.zeros(bs, dtype=torch.int32, device=dev),
    )


@dataclass
class Result:
    tokens: list[list[int]]
    seconds: float
    rounds: int = 0
    accept_lens: list[float] = field(default_factory=list)
    split: dict = field(default_factory=dict)  # seconds per stage of a round
    # Greedy only: top-1 minus top-2 logit at each generated token [bs][n], as its forward
    # computed it; where another decoder parts from greedy, a small margin means a near-tie.
    margins: list[list[float]] = field(default_factory=list)

    def tokens_per_s(self) -> float:
        return sum(len(t) for t in self.tokens) / self.seconds


class Timer:
    """Seconds per stage (with a device sync on CUDA, so the split is real)."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.split: dict[str, float] = {}

    def __call__(self, name, fn, *args, **kw):
        if self.cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn(*args, **kw)
        if self.cuda:
            torch.cuda.synchronize()
        self.split[name] = self.split.get(name, 0.0) + time.perf_counter() - t
        return out


def sample(logits: torch.Tensor, temperature: float, g: torch.Generator | None):
    if temperature <= 0:
        return logits.argmax(-1)
    p = torch.softmax(logits.float() / temperature, -1)
    return torch.multinomial(p.view(-1, p.shape[-1]), 1, generator=g).view(p.shape[:-1])


def prefill(engine: Engine, prompts: list[list[int]], temperature, g):
    """Every prompt into the pool; the first generated token of each, and its logits."""
    first = torch.stack([engine.prefill(b, ids) for b, ids in enumerate(prompts)])
    roots = sample(first, temperature, g)
    prefix = torch.tensor([len(p) for p in prompts], device=roots.device)
    return roots, prefix, first


def top2_margin(logits: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 logit of each row [..., V] -> [...]."""
    top = logits.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def greedy(engine: Engine, prompts, max_new: int, temperature=0.0, seed=0) -> Result:
    """Plain decoding: one forward per token."""
    g = torch.Generator(device=engine.pool.k[0].device).manual_seed(seed)
    t0 = time.perf_counter()
    roots, prefix, logits = prefill(engine, prompts, temperature, g)
    rows = torch.arange(len(prompts), device=roots.device)
    out = [[int(r)] for r in roots]
    margins = [top2_margin(logits)]  # kept on the device: read once, after the loop
    for _ in range(max_new - 1):
        tree = chain_tree(roots.unsqueeze(1), prefix)
        window = engine.pool.slots_of(rows, prefix.unsqueeze(1))
        logits = engine.verify(tree, prefix, window)[:, 0]
        roots = sample(logits, temperature, g)
        margins.append(top2_margin(logits))
        prefix = prefix + 1
        for b, r in enumerate(roots.tolist()):
            out[b].append(r)
    seconds = time.perf_counter() - t0
    return Result(out, seconds, rounds=max_new - 1, margins=torch.stack(margins, 1).tolist())


def draft(engine: Engine, roots, prefix, depth: int) -> torch.Tensor:
    """The early-exit drafter's per-depth logits [bs, L, V]."""
    rows = torch.arange(len(roots), device=roots.device)
    chain = roots.unsqueeze(1)
    out = []
    for d in range(depth):
        tree = chain_tree(chain, prefix)
        positions = prefix.unsqueeze(1) + torch.arange(d + 1, device=rows.device)
        window = engine.pool.slots_of(rows, positions)
        h = engine.verify(tree, prefix, window, layers=engine.draft_layers)
        logits = engine.logits(h.view(len(roots), d + 1, -1)[:, -1])
        out.append(logits)
        chain = torch.cat([chain, logits.argmax(-1, keepdim=True)], dim=1)
    return torch.stack(out, dim=1)


def speculative(
    engine: Engine,
    stepper: ddtree.Stepper,
    prompts,
    max_new: int,
    depth: int,
    temperature=0.0,
    seed=0,
    on_decode_start: Callable[[], None] | None = None,
) -> Result:
    """DDTree (or chain speculation, with a topk=1 Stepper) rounds until every request has
    `max_new` tokens: draft, build, verify, accept, compact the KV of the accepted path.
    `on_decode_start` runs once the prefill is done, before the first round (the GPU idle
    measurement enqueues a marker kernel there, to leave the prefill out)."""
    dev = engine.pool.k[0].device
    g = torch.Generator(device=dev).manual_seed(seed)
    stepper.register_caches(engine.pool.caches())
    timer = Timer(dev)
    t0 = time.perf_counter()
    roots, prefix, _ = prefill(engine, prompts, temperature, g)
    rows = torch.arange(len(prompts), device=dev)
    out = [[int(r)] for r in roots]
    if on_decode_start is not None:
        on_decode_start()
    rounds, lens = 0, []
    q_nodes = stepper.budget + 1
    while min(len(o) for o in out) < max_new:
        logits = timer("draft", draft, engine, roots, prefix, depth)
        tree = timer("build", stepper.step, logits, roots, prefix)
        positions = prefix.unsqueeze(1) + torch.arange(q_nodes, device=dev)
        window = engine.pool.slots_of(rows, positions)
        target = timer("verify", engine.verify, tree, prefix, window)
        kw = {"temperature": temperature, "generator": seed + rounds} if temperature > 0 else {}
        acc = timer("accept_commit", accept_commit, stepper, target, window, kw)
        # The committed tokens as SGLang's tree verify reports them: verified_id holds
        # each request's accepted drafts then its bonus, accept_length counts the drafts.
        sg = ddtree.sglang.verify_output(acc, tree)
        n = (sg["accept_length"] + 1).tolist()
        committed = sg["verified_id"].tolist()
        for b in range(len(out)):
            out[b] += committed[b][: n[b]]
        lens.append(sum(n) / len(n))
        prefix = prefix + acc.accept_len
        roots = acc.bonus.clone()
        rounds += 1
    out = [o[:max_new] for o in out]
    return Result(out, time.perf_counter() - t0, rounds, lens, timer.split)


def accept_commit(stepper, target, window, kw):
    acc = stepper.accept(target, **kw)
    stepper.compact_kv(window)
    return acc
