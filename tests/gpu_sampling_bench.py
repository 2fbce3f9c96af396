"""Sampled accept against greedy accept on the same trees and target logits (H200).

    python tests/gpu_sampling_bench.py [--replays N]

Trees: ``bench_gpu.peaked_logits`` drafts (L = 15, V = 151,936, bf16), B = 63. Three kinds
of target logits [bs, Q, V] bf16 (``targets``): ``flat`` (N(0, 3²) noise, as
tests/gpu_sglang_bench.py: every token a contender for the draw, the worst case), ``llm``
(a language model's shape: a few plausible tokens far above the rest) and ``deep`` (``llm``
with each node's first child on top: the walks go deep). Every time is
the median GPU time of a CUDA-graph replay of one ``accept_tree`` call. Run it once with
``DDTREE_SAMPLING=exhaustive`` (sample_row's passes for every draw) and once without (the
shortlist) to compare the two draws; the mode is printed with the table.
"""

from __future__ import annotations

import argparse
import os

import torch

import ddtree
from ddtree.bench_gpu import graph_time_us, peaked_logits

DEPTH, VOCAB, BUDGET = 15, 151_936, 63
MODES = {
    "T=1": {"temperature": 1.0},
    "T=1 top-p 0.9": {"temperature": 1.0, "top_p": 0.9},
    "T=1 top-k 20": {"temperature": 1.0, "top_k": 20},
    "T=0.6 top-k 20 top-p 0.95": {"temperature": 0.6, "top_k": 20, "top_p": 0.95},
}


def llm_like(bs: int, q: int, g: torch.Generator) -> torch.Tensor:
    """Rows shaped like a language model's: N(0, 2²) for the vocabulary, and 64 plausible
    tokens whose values fall from 22 by exponential gaps (most tokens 15–25 nats below the
    maximum: far from it at temperature 1)."""
    x = torch.randn(bs, q, VOCAB, device="cuda", generator=g) * 2.0
    gaps = torch.empty(bs, q, 64, device="cuda").exponential_(generator=g).cumsum(2)
    top = torch.randint(0, VOCAB, (bs, q, 64), device="cuda", generator=g)
    return x.scatter_(2, top, 22.0 - gaps)


def targets(tree: ddtree.Tree, bs: int, kind: str) -> torch.Tensor:
    """``flat``: N(0, 3²) noise; ``llm``: llm_like rows; ``deep``: llm_like rows with each
    node's first child's token at 30 (the walks go deep)."""
    q = tree.width
    g = torch.Generator(device="cuda").manual_seed(3)
    if kind == "flat":
        return (torch.randn(bs, q, VOCAB, device="cuda", generator=g) * 3).to(torch.bfloat16)
    x = llm_like(bs, q, g)
    if kind == "deep":
        token = torch.gather(tree.verify_ids, 1, tree.first_child.clamp(min=0))
        lift = torch.where(tree.first_child >= 0, 30.0, 0.0)
        x.scatter_(
            2, token.unsqueeze(2), torch.maximum(x.gather(2, token.unsqueeze(2)), lift.unsqueeze(2))
        )
    return x.to(torch.bfloat16)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--bs", type=int, nargs="+", default=[1, 8, 64])
    args = p.parse_args()
    mode = os.environ.get("DDTREE_SAMPLING") or "shortlist"
    print(
        f"# sampled accept, draws by {mode}; {torch.cuda.get_device_name()}; B={BUDGET} "
        f"L={DEPTH} V={VOCAB} bf16; median of {args.replays} graph replays (µs)"
    )
    print(
        "bs | target | mean accept_len (greedy) | greedy | "
        + " | ".join(MODES)
        + " | "
        + " | ".join(f"{m} ÷ greedy" for m in MODES)
    )
    for bs in args.bs:
        x = peaked_logits(bs, DEPTH, VOCAB, 0, "cuda")
        roots = torch.randint(0, VOCAB, (bs,), device="cuda")
        prefix = torch.zeros(bs, dtype=torch.int64, device="cuda")
        tree = ddtree.build_tree(x, roots, prefix, budget=BUDGET)
        for kind in ("flat", "llm", "deep"):
            target = targets(tree, bs, kind)
            acc = ddtree.accept_tree(tree, target)

            def accept(kw, tree=tree, target=target):
                return ddtree.accept_tree(tree, target, **kw)

            greedy = graph_time_us(lambda: accept({}), args.replays)
            times = [
                graph_time_us(lambda kw=kw: accept({"generator": 1, **kw}), args.replays)
                for kw in MODES.values()
            ]
            print(
                f"{bs} | {kind} | {acc.accept_len.double().mean().item():.2f} | {greedy:.1f} | "
                + " | ".join(f"{t:.1f}" for t in times)
                + " | "
                + " | ".join(f"{t / greedy:.2f}x" for t in times)
            )


if __name__ == "__main__":
    main()
