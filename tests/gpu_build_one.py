"""One tree build (and optionally one accept) of a benchmark shape, after three warm-ups,
for Nsight Compute: python3 tests/gpu_build_one.py BS BUDGET [greedy|sampled|best-first],
e.g. ``ncu --clock-control none --profile-from-start off python3 tests/gpu_build_one.py 64
255`` (tests/gpu_run.sh, step ncu-build). ``best-first`` profiles the selection alone, by
the best-first warp, on a built tree's stage-1 outputs (the bench's best-first column).
The logits are `bench_gpu.peaked_logits` (L = 15, V = 151,936, bf16), as in
`python -m ddtree bench --device cuda`."""

import sys

import torch

import ddtree
from ddtree import _cuda
from ddtree.bench_gpu import STAGES, peaked_logits
from ddtree.stepper import Stepper

DEPTH, VOCAB = 15, 151_936


def main() -> None:
    bs, budget = int(sys.argv[1]), int(sys.argv[2])
    accept = sys.argv[3] if len(sys.argv) > 3 else None
    dev = torch.device("cuda")
    x = peaked_logits(bs, DEPTH, VOCAB, 0, dev)
    roots = torch.randint(0, VOCAB, (bs,), device=dev)
    prefix = torch.randint(0, 4000, (bs,), device=dev)
    if accept == "best-first":
        best_first(x, roots, prefix, budget)
        return
    target = peaked_logits(bs, budget + 1, VOCAB, 1, dev) if accept else None
    kw = {"temperature": 1.0, "top_p": 0.9} if accept == "sampled" else {}

    def build():
        tree = ddtree.build_tree(x, roots, prefix, budget=budget)
        if accept:
            ddtree.accept_tree(tree, target, **kw)
        return tree

    print("nodes", profile_fourth(build).num_nodes.float().mean().item())


def profile_fourth(call):
    """Three warm-up calls, then the call Nsight Compute profiles (ncu --profile-from-start
    off); returns its result."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    out = call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return out


def best_first(x, roots, prefix, budget: int) -> None:
    """The best-first warp's selection alone (the bench's stage bits), as the bench times it."""
    bs = x.shape[0]
    stepper = Stepper(max_batch=bs, budget=budget, depth=DEPTH, vocab=VOCAB, device=x.device)
    tree = stepper.step(x, roots, prefix)
    scratch = {n: t[: bs * DEPTH] for n, t in stepper._scratch.items()}
    bits = dict(STAGES)["select_best_first"]
    k = min(budget, VOCAB)
    profile_fourth(lambda: _cuda.launch_build(tree, scratch, x, roots, prefix, budget, k, bits))
    print("best-first selection of", bs, "requests, B =", budget)


if __name__ == "__main__":
    main()
