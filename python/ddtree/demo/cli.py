"""Decode a real model (SmolLM2-135M-Instruct, shipped on PyPI as a GGUF file) three ways
over one batch of prompts — plain greedy, chain speculation and DDTree — and print the
texts, tokens per second, mean accepted length, rounds and the per-round time split.
DDTree runs the whole round through ddtree: ``Stepper.step`` builds the tree from the
early-exit drafter's per-depth distributions, the verify forward attends with
``ddtree.tree_attention`` over the paged KV pool, ``Stepper.accept`` walks it and
``Stepper.compact_kv`` keeps the accepted path's K/V. In float32 (the CPU default) all
three decoders produce the same greedy tokens; where a decoder's tokens part from greedy's
(bfloat16 on the GPU), the report names the first differing token and greedy's top-1 minus
top-2 logit there. ``--idle`` (CUDA) adds the GPU idle fraction of a DDTree decode.
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
        "--idle",
        action="store_true",
        help="CUDA: decode with DDTree once more, untimed, under the torch profiler and report "
        "the GPU idle fraction of its rounds (prefill left out); skipped on the CPU",
    )
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
    idle = measure_idle(weights, prompts, args, device, dtype) if args.idle else None
    if args.plot:
        sweep = budget_sweep(weights, prompts, args, device, dtype)
        plot_budgets(sweep, args.plot)
        for budget, r in sweep.items():  # the plotted numbers, beside the main table
            mean = sum(r.accept_lens) / len(r.accept_lens)
            ms = 1000 * sum(r.split.values()) / max(r.rounds, 1)
            print(f"# budget {budget}: mean accepted length {mean:.2f}, {ms:.0f} ms/round",
                  file=sys.stderr)  # fmt: skip
    if args.json:
        print(json.dumps(as_json(prompts, results, args, idle)))
        return 0
    report(tok, prompts, results, args, device, dtype, idle)
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


def baselines(weights, prompts, args, device, dtype) -> dict:
    """Plain greedy and chain speculation (neither depends on the DDTree budget), each on a
    fresh pool."""
    from . import decode

    def engine():
        return new_engine(weights, prompts, args, device, dtype, args.budget)

    n, d, t = args.max_new_tokens, args.depth, args.temperature
    chain = new_stepper(weights, prompts, args, device, d, topk=1)
    return {
        "ar": decode.greedy(engine(), prompts, n, t),
        "chain": decode.speculative(engine(), chain, prompts, n, d, t),
    }


def ddtree_decode(weights, prompts, args, device, dtype, budget: int, on_decode_start=None):
    """DDTree at `budget` nodes, on a fresh pool."""
    from . import decode

    return decode.speculative(
        new_engine(weights, prompts, args, device, dtype, budget),
        new_stepper(weights, prompts, args, device, budget),
        prompts, args.max_new_tokens, args.depth, args.temperature,
        on_decode_start=on_decode_start,
    )  # fmt: skip


def decode_all(weights, prompts, args, device, dtype) -> dict:
    """The three decoders, each on a fresh pool of the same shape."""
    results = baselines(weights, prompts, args, device, dtype)
    results["ddtree"] = ddtree_decode(weights, prompts, args, device, dtype, args.budget)
    return results


def measure_idle(weights, prompts, args, device, dtype) -> dict | None:
    """GPU idle fraction of a separate DDTree decode at args.budget (None off CUDA)."""
    from . import measure

    if device.type != "cuda":
        print("# --idle needs --device cuda: GPU idle not measured", file=sys.stderr)
        return None
    return measure.gpu_idle(
        lambda mark: ddtree_decode(weights, prompts, args, device, dtype, args.budget, mark)
    )


def as_json(prompts, results, args, idle=None) -> dict:
    from .measure import divergences

    return {
        "bs": len(prompts),
        "budget": args.budget,
        "depth": args.depth,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "prompt_ids": prompts,
        "ar_ids": results["ar"].tokens,
        "chain_ids": results["chain"].tokens,
        "ddtree_ids": results["ddtree"].tokens,
        "accept_lens": results["ddtree"].accept_lens,
        "chain_accept_lens": results["chain"].accept_lens,
        "tokens_per_s": {k: r.tokens_per_s() for k, r in results.items()},
        "rounds": {k: r.rounds for k, r in results.items()},
        "split_s": {k: r.split for k, r in results.items() if r.split},
        "ar_margins": results["ar"].margins,
        # Per decoder, per prompt: null, or where its tokens first part from greedy's (only
        # when decoding greedily: sampled tokens part by design).
        "divergence": divergences(results) if args.temperature <= 0 else None,
        "gpu_idle": idle,
    }


def report(tok, prompts, results, args, device, dtype, idle=None) -> None:
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
    if args.temperature <= 0:
        report_divergences(tok, results)
    if idle is not None:
        print(f"# {idle_text(idle, args.budget)}")


def report_divergences(tok, results) -> None:
    """A line per prompt whose tokens part from greedy's, and greedy's margins for scale."""
    from .measure import divergences

    found = False
    for name, per_prompt in divergences(results).items():
        for b, d in enumerate(per_prompt):
            if d is not None:
                found = True
                print(f"# {name} parts from greedy: {divergence_text(tok, b, d)}")
    if found:
        margins = sorted(m for row in results["ar"].margins for m in row)
        print(f"# greedy's top-1 minus top-2 logit over all its tokens: min {margins[0]:.3f}, "
              f"median {margins[len(margins) // 2]:.3f}")  # fmt: skip


def divergence_text(tok, b: int, d: dict) -> str:
    """One prompt's first divergence: where, the two tokens, greedy's top-2 margin there."""

    def token(t):
        return "(none)" if t is None else repr(tok.decode([t]))

    margin = "?" if d["greedy_margin"] is None else f"{d['greedy_margin']:.3f}"
    return (
        f"prompt {b}, generated token {d['index']}: {token(d['other_token'])} where greedy "
        f"has {token(d['greedy_token'])} (greedy's top-1 minus top-2 logit there: {margin})"
    )


def idle_text(idle: dict, budget: int) -> str:
    window = "rounds, prefill left out" if idle["prefill_excluded"] else "whole decode"
    if idle["profiled"] != "cuda":
        window += ", host ops profiled too"
    per_round = idle["span_ms"] / max(idle["rounds"], 1)
    return (
        f"GPU idle in a separate, profiled DDTree decode (B={budget}, {window}): "
        f"{idle['idle']:.1%}; GPU busy {idle['busy_ms']:.2f} ms of {per_round:.2f} ms per round"
    )


SWEEP_BUDGETS = (1, 3, 7, 15, 31)


def budget_sweep(weights, prompts, args, device, dtype) -> dict:
    """DDTree alone at each budget of SWEEP_BUDGETS: budget -> Result."""
    return {b: ddtree_decode(weights, prompts, args, device, dtype, b) for b in SWEEP_BUDGETS}


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
