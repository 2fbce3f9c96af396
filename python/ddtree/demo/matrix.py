"""The demo's measurement matrix (issue 11): batches of story prompts of ragged lengths
decoded by greedy, chain and DDTree at several budgets, one ``--json`` document per
(bs, B); and the summary of such documents as a markdown table and a plot. On the H200,
``tests/gpu_demo.sh`` runs both.

    python -m ddtree.demo.matrix run --bs 8 --budgets 15,63,255 --idle-budgets 63 --out DIR
    python -m ddtree.demo.matrix summary DIR --md summary.md --json all.json --plot matrix.png

``run`` loads the model once per process, runs greedy and chain once per batch (neither
depends on B; their numbers repeat across that batch's rows) and DDTree once per budget,
and on CUDA first decodes one short batch untimed, so that the first timed decoder does
not pay for loading kernels and making library handles.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import torch

from . import cli

# Appended to the prompts in turn, so that a batch's prompts differ in length (ragged
# prefixes); the first prompt has none: it is the one earlier single-prompt runs used.
EXTRAS = (
    "",
    "Make it short.",
    "It lives in a cave by the sea and guards an old library.",
    "Use simple words.",
    "The dragon is afraid of the dark, and a small girl helps it find its way home.",
    "Give it a name.",
    "Include a wizard, a river and a broken bridge, and end with a lesson about patience.",
)
STAGES = ("draft", "build", "verify", "accept_commit")


def story_prompts(bs: int) -> list[str]:
    return [
        f"Tell me a story about dragon number {i + 1}. {EXTRAS[i % len(EXTRAS)]}".strip()
        for i in range(bs)
    ]


def demo_args(device: str, max_new_tokens: int) -> argparse.Namespace:
    """The demo's own arguments and defaults (depth, drafter layers, page size...)."""
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    return p.parse_args(["--device", device, "--max-new-tokens", str(max_new_tokens)])


def run(bs: int, budgets, idle_budgets, max_new_tokens: int, device: str, out) -> list:
    """Decode `bs` story prompts; write bs{bs}_B{budget}.json under `out` per budget, each
    as soon as it is measured. Returns the paths."""
    from .model import load_tokenizer, load_weights

    args = demo_args(device, max_new_tokens)
    dev = torch.device(device)
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    tok = load_tokenizer()
    weights = load_weights(dtype=dtype).to(device=dev)
    prompts = [tok.chat(p) for p in story_prompts(bs)]
    if dev.type == "cuda":  # untimed: first launches load kernels and make library handles
        cli.decode_all(weights, prompts[:1], demo_args(device, 4), dev, dtype)
    t = time.perf_counter()
    base = cli.baselines(weights, prompts, args, dev, dtype)
    print(f"# bs={bs}: greedy and chain in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    paths = []
    for budget in budgets:
        t = time.perf_counter()
        args.budget = budget
        results = {**base, "ddtree": cli.ddtree_decode(weights, prompts, args, dev, dtype, budget)}
        idle = None
        if budget in idle_budgets:
            idle = cli.measure_idle(weights, prompts, args, dev, dtype)
        doc = cli.as_json(prompts, results, args, idle)
        path = pathlib.Path(out) / f"bs{bs}_B{budget}.json"
        path.write_text(json.dumps(doc))
        paths.append(path)
        print(f"# {row_text(summarize(doc))} ({time.perf_counter() - t:.1f} s)", file=sys.stderr)
    return paths


def load(folder) -> list[dict]:
    """Every bs*_B*.json document under `folder`, by (bs, budget)."""
    docs = [json.loads(p.read_text()) for p in pathlib.Path(folder).glob("bs*_B*.json")]
    return sorted(docs, key=lambda d: (d["bs"], d["budget"]))


def mean(xs) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def summarize(doc: dict) -> dict:
    """The numbers of one (bs, B) row."""
    n = len(doc["ar_ids"])
    split = doc["split_s"]["ddtree"]
    total = sum(split.values()) or 1.0
    margins = [m for row in doc["ar_margins"] for m in row]
    at_divergence = [
        d["greedy_margin"]
        for d in (doc.get("divergence") or {}).get("ddtree", [])
        if d is not None and d["greedy_margin"] is not None
    ]
    idle = doc.get("gpu_idle")
    rounds = max(doc["rounds"]["ddtree"], 1)
    return {
        "bs": doc["bs"],
        "budget": doc["budget"],
        "tokens_per_s": [doc["tokens_per_s"][k] for k in ("ar", "chain", "ddtree")],
        "accepted": [mean(doc["chain_accept_lens"]), mean(doc["accept_lens"])],
        "rounds": [doc["rounds"]["chain"], doc["rounds"]["ddtree"]],
        "idle": None if idle is None else idle["idle"],
        "ddtree_same": sum(a == b for a, b in zip(doc["ar_ids"], doc["ddtree_ids"], strict=True)),
        "chain_same": sum(a == b for a, b in zip(doc["ar_ids"], doc["chain_ids"], strict=True)),
        "n": n,
        "split": [split.get(s, 0.0) / total for s in STAGES],
        "ms_per_round": {s: 1000 * split.get(s, 0.0) / rounds for s in STAGES},
        "divergence_margin_max": max(at_divergence) if at_divergence else None,
        "margin_median": statistics.median(margins) if margins else None,
    }


def row_text(r: dict) -> str:
    """One line for the progress log."""
    tps = " / ".join(f"{x:.1f}" for x in r["tokens_per_s"])
    idle = "" if r["idle"] is None else f", GPU idle {r['idle']:.1%}"
    return (
        f"bs={r['bs']} B={r['budget']}: tokens/s greedy / chain / DDTree {tps}, accepted "
        f"{r['accepted'][0]:.2f} / {r['accepted'][1]:.2f}, DDTree == greedy "
        f"{r['ddtree_same']} of {r['n']}{idle}"
    )


HEADER = (
    "| bs | B | tokens/s greedy / chain / DDTree | accepted per round chain / DDTree "
    "| rounds chain / DDTree | GPU idle (DDTree) | DDTree == greedy | chain == greedy "
    "| DDTree round: draft / build / verify / accept+commit "
    "| greedy margin at DDTree's divergences: max (median over all tokens) |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def markdown(docs: list[dict]) -> str:
    """The summary table, one row per (bs, B)."""
    lines = [HEADER]
    for r in map(summarize, docs):
        idle = "—" if r["idle"] is None else f"{r['idle']:.1%}"
        split = " / ".join(f"{x:.0%}" for x in r["split"])
        worst = r["divergence_margin_max"]
        margin = "—" if worst is None else f"{worst:.3f} ({r['margin_median']:.3f})"
        lines.append(
            f"| {r['bs']} | {r['budget']} | "
            + " / ".join(f"{x:.1f}" for x in r["tokens_per_s"])
            + f" | {r['accepted'][0]:.2f} / {r['accepted'][1]:.2f} | "
            f"{r['rounds'][0]} / {r['rounds'][1]} | {idle} | {r['ddtree_same']} of {r['n']} | "
            f"{r['chain_same']} of {r['n']} | {split} | {margin} |"
        )
    return "\n".join(lines) + "\n"


def plot(docs: list[dict], path: str) -> None:
    """Left: DDTree's mean accepted length by budget, one line per bs (chain dashed).
    Right: DDTree's round time split, ms per round, one bar per (bs, B)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [summarize(d) for d in docs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    for i, bs in enumerate(sorted({r["bs"] for r in rows})):
        mine = [r for r in rows if r["bs"] == bs]
        color = f"C{i}"
        budgets = [r["budget"] for r in mine]
        left.plot(budgets, [r["accepted"][1] for r in mine], "o-", color=color, label=f"bs={bs}")
        left.axhline(mine[0]["accepted"][0], color=color, linestyle="--", linewidth=0.8)
    left.set_xscale("log", base=2)
    budgets = sorted({r["budget"] for r in rows})
    left.set_xticks(budgets, labels=[str(b) for b in budgets])
    left.set_xlabel("budget B (nodes)")
    left.set_ylabel("mean accepted length per round")
    left.set_title("DDTree by budget (dashed: chain)")
    left.legend(fontsize=8)
    labels = [f"bs{r['bs']}\nB{r['budget']}" for r in rows]
    bottom = [0.0] * len(rows)
    for stage in STAGES:
        ms = [r["ms_per_round"][stage] for r in rows]
        right.bar(labels, ms, bottom=bottom, label=stage)
        bottom = [a + b for a, b in zip(bottom, ms, strict=True)]
    right.set_ylabel("ms per round")
    right.set_title("DDTree's round time split")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddtree.demo.matrix", description=__doc__)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="decode one batch size at several budgets")
    r.add_argument("--bs", type=int, required=True)
    r.add_argument("--budgets", type=ints, default=(15, 63, 255))
    r.add_argument("--idle-budgets", type=ints, default=(), help="budgets also profiled")
    r.add_argument("--max-new-tokens", type=int, default=64)
    r.add_argument("--device", default="cuda")
    r.add_argument("--out", required=True, help="folder of the JSON documents")
    s = sub.add_parser("summary", help="markdown table (stdout) and plot of run's documents")
    s.add_argument("folder")
    s.add_argument("--md", help="also write the table here")
    s.add_argument("--json", help="write all documents here, as one JSON list")
    s.add_argument("--plot", help="write the plot here (PNG)")
    a = p.parse_args(argv)
    if a.command == "run":
        pathlib.Path(a.out).mkdir(parents=True, exist_ok=True)
        run(a.bs, a.budgets, a.idle_budgets, a.max_new_tokens, a.device, a.out)
        return 0
    docs = load(a.folder)
    if not docs:
        print(f"no bs*_B*.json under {a.folder}", file=sys.stderr)
        return 1
    table = markdown(docs)
    print(table)
    if a.md:
        pathlib.Path(a.md).write_text(table)
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(docs))
    if a.plot:
        plot(docs, a.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
