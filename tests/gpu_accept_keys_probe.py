"""Greedy accept two ways on the same trees and target logits (H200): the walk
(``accept_tree``: a visited row at a time, a cluster a request) against every node's
greedy key at once then a walk along the keys (the one-shard case of the vocab-parallel
kernels, ``shard_keys`` + ``walk_keys``). Prints both times and whether the acceptances
are equal.

    python tests/gpu_accept_keys_probe.py [--replays N] [--bs ...] [--budget ...]

Trees and targets as tests/gpu_sampling_bench.py (``deep`` and ``llm`` rows).
"""

from __future__ import annotations

import argparse

import torch

import ddtree
from ddtree import _buffers, _vocab_parallel
from ddtree.bench_gpu import graph_time_us, peaked_logits
from gpu_sampling_bench import DEPTH, VOCAB, targets


def keys_accept(tree, target, acc, keys) -> None:
    """Every node's greedy key over the whole row, then the walk along them."""
    _vocab_parallel.shard_keys(target, 0, VOCAB, None, out=keys)
    _vocab_parallel.walk_gathered(tree, acc, keys[0].unsqueeze(0), keys[1].unsqueeze(0), None)


FIELDS = ("accept_len", "accepted_tokens", "accepted_nodes", "bonus", "accept_index", "status")


def same(a, b) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in FIELDS)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--bs", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--budget", type=int, nargs="+", default=[63, 255])
    args = p.parse_args()
    print(f"# {torch.cuda.get_device_name()}; L={DEPTH} V={VOCAB} bf16; median of "
          f"{args.replays} graph replays (µs)")  # fmt: skip
    print("bs | B | target | mean accept_len | walk | keys + walk | walk ÷ keys | equal")
    for budget in args.budget:
        for bs in args.bs:
            x = peaked_logits(bs, DEPTH, VOCAB, 0, "cuda")
            roots = torch.randint(0, VOCAB, (bs,), device="cuda")
            prefix = torch.zeros(bs, dtype=torch.int64, device="cuda")
            tree = ddtree.build_tree(x, roots, prefix, budget=budget)
            for kind in ("llm", "deep"):
                target = targets(tree, bs, kind)
                walk = ddtree.accept_tree(tree, target)
                acc = _buffers.new_acceptance(tree.batch_size, tree.depth, tree.device)
                keys = torch.empty(2, bs, tree.width, dtype=torch.int64, device="cuda")
                keys_accept(tree, target, acc, keys)
                torch.cuda.synchronize()
                t_walk = graph_time_us(lambda t=tree, y=target: ddtree.accept_tree(t, y),
                                       args.replays)  # fmt: skip
                t_keys = graph_time_us(
                    lambda t=tree, y=target, a=acc, k=keys: keys_accept(t, y, a, k), args.replays
                )
                print(
                    f"{bs} | {budget} | {kind} | {walk.accept_len.double().mean().item():.2f} | "
                    f"{t_walk:.1f} | {t_keys:.1f} | {t_walk / t_keys:.2f}x | {same(walk, acc)}"
                )


if __name__ == "__main__":
    main()
