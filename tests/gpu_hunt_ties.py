"""Issue 12's scenario at scale: does the sampled accept ever draw a token that top-k removed?

The reported setup, repeated for a fixed wall time: a batch of 80 requests with per-request
tensor parameters (16 at T=1.3, top_k=1000; the rest T=1.0, T=0.7, top_p=0.95, and
top_k=5000 with top_p=0.9, shuffled over the batch every epoch), bf16 target rows
[bs, Q, V] at V=151936 whose root rows are a normal tail (sigma 0.5) plus 20 tokens raised
by +9, a real tree from build_tree, a fresh seed per call. Every first draw of a top_k=1000
request is ranked in SPEC order (stable sort: value descending, lower id first); a rank of
1000 or more is a token the cut must have removed. Counts stay on the GPU until an epoch
ends (no sync per call). Both the functional accept_tree and Stepper.accept are run.

Also reported: draws at ranks 990-999 (the power: a wrongly kept rank-1000 token would be
drawn about as often as one of them). Not a pytest file: `python3 tests/gpu_hunt_ties.py
SECONDS` (tests/gpu_run.sh step "hunt").
"""

from __future__ import annotations

import sys
import time

import torch

import ddtree

V, BS, BUDGET, DEPTH = 151936, 80, 16, 4
SETTINGS = [  # (temperature, top_k, top_p), 16 requests each
    (1.3, 1000, 1.0),
    (1.0, 0, 1.0),
    (0.7, 0, 1.0),
    (1.0, 0, 0.95),
    (1.0, 5000, 0.9),
]


def epoch_inputs(g: torch.Generator, dev):
    rows = torch.randn(BS, V, device=dev, generator=g) * 0.5
    hot = torch.randint(0, V, (BS, 20), device=dev, generator=g)
    rows.scatter_add_(1, hot, torch.full((BS, 20), 9.0, device=dev))
    rows = rows.to(torch.bfloat16)
    draft = torch.randn(BS, DEPTH, V, device=dev, generator=g).to(torch.bfloat16)
    roots = torch.randint(0, V, (BS,), device=dev, generator=g)
    prefix = torch.full((BS,), 100, dtype=torch.int64, device=dev)
    order = torch.sort(rows.float(), dim=1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(V, device=dev).expand_as(order))
    perm = torch.randperm(BS, device=dev, generator=g)
    params = torch.tensor([s for s in SETTINGS for _ in range(BS // len(SETTINGS))], device=dev)
    params = params[perm]
    return rows, draft, roots, prefix, ranks, params


def first_draws(acc) -> torch.Tensor:
    return torch.where(acc.accept_len >= 2, acc.accepted_tokens[:, 1], acc.bonus)


def hunt(seconds: float, use_stepper: bool, dev) -> dict:
    g = torch.Generator(device=dev).manual_seed(1234 + use_stepper)
    stepper = ddtree.Stepper(BS, BUDGET, DEPTH, V, device=dev) if use_stepper else None
    outside = torch.zeros((), dtype=torch.int64, device=dev)
    near_cut = torch.zeros((), dtype=torch.int64, device=dev)
    worst = torch.zeros((), dtype=torch.int64, device=dev)
    calls = draws = epochs = 0
    seed = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        rows, draft, roots, prefix, ranks, params = epoch_inputs(g, dev)
        t, k, p = params[:, 0].float(), params[:, 1].int(), params[:, 2].float()
        mine = k == 1000
        if use_stepper:
            tree = stepper.step(draft, roots, prefix)
        else:
            tree = ddtree.build_tree(draft, roots, prefix, budget=BUDGET)
        # Every node's row is the request's root row: each walk level draws from it.
        target = rows.unsqueeze(1).expand(BS, tree.width, V).contiguous()
        for _ in range(500):
            seed += 1
            if use_stepper:
                acc = stepper.accept(target, t, k, p, generator=seed, readback=False)
            else:
                acc = ddtree.accept_tree(tree, target, temperature=t, top_k=k, top_p=p,
                                         generator=seed)  # fmt: skip
            r = torch.gather(ranks, 1, first_draws(acc).view(-1, 1)).view(-1)
            outside += ((r >= 1000) & mine).sum()
            near_cut += ((r >= 990) & (r < 1000) & mine).sum()
            worst = torch.maximum(worst, torch.where(mine, r, 0).max())
            calls += 1
            draws += int(BS // len(SETTINGS))
        epochs += 1
        torch.cuda.synchronize()
    return {
        "path": "Stepper.accept" if use_stepper else "accept_tree",
        "calls": calls,
        "epochs": epochs,
        "top_k_1000_draws": draws,
        "outside_kept_set": int(outside),
        "ranks_990_999": int(near_cut),
        "worst_rank": int(worst),
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    dev = torch.device("cuda")
    bad = 0
    for use_stepper in (False, True):
        result = hunt(seconds / 2, use_stepper, dev)
        print(result, flush=True)
        bad += result["outside_kept_set"]
    print("FOUND draws outside the kept set" if bad else "no draw outside the kept set")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
