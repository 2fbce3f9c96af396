"""Decode a real model (SmolLM2-135M-Instruct, shipped on PyPI as a GGUF file) three ways
over one batch of prompts — plain greedy, chain speculation and DDTree — and print the
texts, tokens per second, mean accepted length, rounds and the per-round time split.
DDTree runs the whole round through ddtree: ``Stepper.step`` builds the tree from the
early-exit drafter's per-depth distributions, the verify forward attends with
``ddtree.tree_attention`` over the paged KV pool, ``Stepper.accept`` walks it and
``Stepper.compact_kv`` keeps the accepted path's K/V. In float32 (the CPU default) all
three decoders produce the same greedy tokens.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

import ddtree

PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers and explain briefly why each one is prime.",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument(
        "--prompt", action="append", help="a user message (repeat for a batch; default: 3)"
    )
    p.add_argument("--max-new-tokens", type=int, default=16, help="tokens per prompt")
    p.add_argument("--budget", type=int, default=15, help="DDTree node budget B")
    p.add_argument("--depth", type=int, default=4, help="draft depth L")
    p.add_argument(
        "--draft-layers", type=int, default=24, help="layers of the early-exit drafter (of 30)"
    )
    p.add_argument("--page-size", type=int, default=16, help="KV pool page size")
    p.add_argument(
        "--dtype", choices=["float32", "bfloat16"], help="default: float32 on the CPU, "
        "bfloat16 on CUDA"
    )  # fmt: skip
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also run DDTree at budgets 1, 3, 7, 15, 31 and plot the mean accepted length by "
        "budget and each round's time split (matplotlib)",
    )


def run(args) -> int:
    from .model import load_tokenizer, load_weights  # gguf and tokenizers: only for the demo

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("demo: --device cuda needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("float32" if device.type == "cpu" else "bfloat16"))
    tok = load_tokenizer()
    weights = load_weights(dtype=dtype).to(device=device)
    prompts = [tok.chat(p) for p in (args.prompt or PROMPTS)]
    results = decode_all(weights, prompts, args, device, dtype)
    if args.plot:
        sweep = budget_sweep(weights, prompts, args, device, dtype)
        plot_budgets(sweep, args.plot)
        for budget, r in sweep.items():  # the plotted numbers, beside the main table
            mean = sum(r.accept_lens) / len(r.accept_lens)
            ms = 1000 * sum(r.split.values()) / max(r.rounds, 1)
            print(f"# budget {budget}: mean accepted length {mean:.2f}, {ms:.0f} ms/round",
                  file=sys.stderr)  # fmt: skip
    if args.json:
        print(json.dumps(as_json(prompts, results)))
        return 0
    report(tok, prompts, results, args, device, dtype)
    return 0


def new_engine(weights, prompts, args, device, dtype, budget: int):
    """An engine over a fresh pool sized for this batch and a tree of `budget` nodes."""
    from .engine import Engine, Pool

    # A request keeps decoding (up to L+1 tokens a round) until the slowest one has
    # max_new tokens, and each round's window needs Q more slots.
    per_round = args.depth + 1
    capacity = max(len(p) for p in prompts) + per_round * args.max_new_tokens + budget + per_round
    pool = Pool(weights, len(prompts), capacity, args.page_size, device, dtype)
    return Engine(weights, pool, args.draft_layers)


def new_stepper(weights, prompts, args, device, budget: int, topk=None) -> ddtree.Stepper:
    return ddtree.Stepper(
        max_batch=len(prompts), budget=budget, depth=args.depth, vocab=weights.config.vocab,
        device=device, topk=topk,
    )  # fmt: skip


def decode_all(weights, prompts, args, device, dtype) -> dict:
    """The three decoders, each on a fresh pool of the same shape."""
    from . import decode

    def engine():
        return new_engine(weights, prompts, args, device, dtype, args.budget)

    def stepper(budget, topk):
        return new_stepper(weights, prompts, args, device, budget, topk)

    n, t = args.max_new_tokens, args.temperature
    return {
        "ar": decode.greedy(engine(), prompts, n, t),
        "chain": decode.speculative(engine(), stepper(args.depth, 1), prompts, n, args.depth, t),
        "ddtree": decode.speculative(
            engine(), stepper(args.budget, None), prompts, n, args.depth, t
        ),
    }


def as_json(prompts, results) -> dict:
    return {
        "prompt_ids": prompts,
        "ar_ids": results["ar"].tokens,
        "chain_ids": results["chain"].tokens,
        "ddtree_ids": results["ddtree"].tokens,
        "accept_lens": results["ddtree"].accept_lens,
        "chain_accept_lens": results["chain"].accept_lens,
        "tokens_per_s": {k: r.tokens_per_s() for k, r in results.items()},
        "rounds": {k: r.rounds for k, r in results.items()},
        "split_s": {k: r.split for k, r in results.items() if r.split},
    }


def report(tok, prompts, results, args, device, dtype) -> None:
    ar = results["ar"].tokens
    print(f"# ddtree demo: SmolLM2-135M-Instruct on {device} ({dtype}), {len(prompts)} prompts")
    for b, ids in enumerate(ar):
        print(f"\n[{b}] {tok.decode(ids)!r}")
    print("\ndecoder | tokens/s | rounds | mean accepted length | same tokens as greedy")
    for name, r in results.items():
        mean = sum(r.accept_lens) / len(r.accept_lens) if r.accept_lens else 1.0
        same = r.tokens == ar
        print(f"{name} | {r.tokens_per_s():.1f} | {r.rounds} | {mean:.2f} | {same}")
    for name in ("chain", "ddtree"):
        split = results[name].split
        total = sum(split.values())
        cells = ", ".join(f"{k} {v / total:.0%}" for k, v in split.items())
        print(f"# {name} round time: {cells}")


SWEEP_BUDGETS = (1, 3, 7, 15, 31)


def budget_sweep(weights, prompts, args, device, dtype) -> dict:
    """DDTree alone at each budget of SWEEP_BUDGETS: budget -> Result."""
    from . import decode

    return {
        budget: decode.speculative(
            new_engine(weights, prompts, args, device, dtype, budget),
            new_stepper(weights, prompts, args, device, budget),
            prompts,
            args.max_new_tokens,
            args.depth,
            args.temperature,
        )  # fmt: skip
        for budget in SWEEP_BUDGETS
    }


def plot_budgets(sweep: dict, path: str) -> None:
    """Mean accepted length by budget, and the round's time split per budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = list(sweep)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    lens = [sum(r.accept_lens) / len(r.accept_lens) for r in sweep.values()]
    left.plot(budgets, lens, marker="o")
    left.set_xscale("log", base=2)
    left.set_xlabel("budget B (nodes)")
    left.set_ylabel("mean accepted length per round")
    left.set_title("DDTree: accepted length by budget")
    stages = ("draft", "build", "verify", "accept_commit")
    bottom = [0.0] * len(budgets)
    for stage in stages:
        ms = [1000 * r.split.get(stage, 0.0) / max(r.rounds, 1) for r in sweep.values()]
        right.bar([str(b) for b in budgets], ms, bottom=bottom, label=stage)
        bottom = [a + b for a, b in zip(bottom, ms, strict=True)]
    right.set_xlabel("budget B")
    right.set_ylabel("ms per round")
    right.set_title("a round's time split")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"# wrote {path}", file=sys.stderr)
