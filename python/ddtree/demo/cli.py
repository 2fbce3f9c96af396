"""Decode a real model (SmolLM2-135M-Instruct, shipped on PyPI as a GGUF file) with several
decoders over one batch of chat prompts, in one engine, and compare them:

  greedy     one token per round
  chain      chain speculation (one draft per depth, B = L)
  ddtree     DDTree: ddtree's GPU tree build (Stepper.step), tree-attention verify,
             Stepper.accept and compact_kv, the whole round one CUDA graph
  cpu-build  the same DDTree round with the tree built on the host, as SGLang's DDTree
             port (sgl-project/sglang#29907) builds it

On CUDA every decode round is a replayed CUDA graph and the host queues rounds without
reading the device; tokens/s counts the generated tokens over the decode (prefill left
out). The drafter is the shipped two-layer DFlash drafter (``weights/``, trained with
``python -m ddtree.demo.train_drafter``); ``--drafter early-exit`` drafts with the target's
own first 24 of 30 layers instead, which costs most of a round. In float32 (the CPU default)
every decoder produces greedy's tokens; in bfloat16 they can part at near-ties, which the
report names with greedy's top-1 minus top-2 logit.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import sys
import time

import torch

# The demo's DFlash drafter (weights/README.md: how it was trained, what it accepts).
SHIPPED_WEIGHTS = pathlib.Path(__file__).parent / "weights" / "dflash-smollm2-135m.safetensors"
SHIPPED_SHA256 = "c3a8f6b22c1ec140165ef58e86c5e4dead36d640b3d7564032b1cae27b7b8da6"

PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers and explain briefly why each one is prime.",
)
# Appended in turn to `--bs N`'s story prompts, so a batch's prompts differ in length.
EXTRAS = (
    "",
    "Make it short.",
    "It lives in a cave by the sea and guards an old library.",
    "Use simple words.",
    "The dragon is afraid of the dark, and a small girl helps it find its way home.",
    "Give it a name.",
    "Include a wizard, a river and a broken bridge, and end with a lesson about patience.",
)
DECODERS = ("greedy", "chain", "ddtree", "cpu-build")
STAGES = ("draft", "build", "verify", "accept_commit")


# The prompts train_drafter holds out of the shipped drafter's training (every tenth).
HELD_OUT = 198


def held_out_prompts(n: int) -> list[str]:
    """`n` of the held-out prompts, evenly spaced (all of them for n = HELD_OUT): prompts
    like the drafter's training ones that it never saw, where its acceptance is judged."""
    from .train_drafter import prompts, split

    held = split(prompts())[1]
    return [held[i * len(held) // n] for i in range(n)]


def prompt_texts(args) -> list[str]:
    """The user messages a run decodes: --prompt's, --bs's stories, --held-out's, or the
    three built-in ones."""
    if args.held_out:
        return held_out_prompts(args.held_out)
    if args.bs:
        return story_prompts(args.bs)
    return list(args.prompt or PROMPTS)


def story_prompts(bs: int) -> list[str]:
    return [
        f"Tell me a story about dragon number {i + 1}. {EXTRAS[i % len(EXTRAS)]}".strip()
        for i in range(bs)
    ]


def ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        msg = f"expected comma-separated integers, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None


def names(text: str) -> tuple[str, ...]:
    got = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in got if x not in DECODERS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown decoder {bad[0]!r} (of {', '.join(DECODERS)})")
    return got


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--prompt", action="append", help="a user message (repeatable; default: "
                   "three built-in prompts)")  # fmt: skip
    p.add_argument("--bs", type=int, help="instead of --prompt: N built-in story prompts")
    p.add_argument("--held-out", type=int, metavar="N", help="instead of --prompt: N of the "
                   f"shipped drafter's {HELD_OUT} held-out prompts (never trained on), evenly "
                   "spaced")  # fmt: skip
    p.add_argument("--max-new-tokens", type=int, help="tokens per prompt (default: 128, each "
                   "prompt ending at its end of turn); given, every prompt gets exactly that "
                   "many, past its end-of-turn token unless --stop-at-eos")  # fmt: skip
    p.add_argument("--stop-at-eos", action="store_true", help="stop a prompt at its "
                   "end-of-turn token (the default without --max-new-tokens)")  # fmt: skip
    p.add_argument("--budget", type=ints, help="DDTree node budgets B, comma-separated "
                   "(default: 3 on the CPU, 15,31,63 on CUDA)")  # fmt: skip
    p.add_argument("--decoders", type=names, default=DECODERS, help="which decoders, "
                   f"comma-separated (default: {','.join(DECODERS)})")  # fmt: skip
    p.add_argument("--depth", type=int, default=4,
                   help="draft depth L of the early-exit drafter (default: 4)")  # fmt: skip
    p.add_argument("--drafter", choices=["dflash", "early-exit"], default="dflash",
                   help="default: dflash (the shipped weights, or --draft-weights)")  # fmt: skip
    p.add_argument("--draft-weights", metavar="FILE", help="a DFlash drafter's weights, as "
                   "python -m ddtree.demo.train_drafter writes them (drafter.safetensors; "
                   "default: the shipped ones); its block size sets --depth")  # fmt: skip
    p.add_argument("--draft-layers", type=int, default=24,
                   help="layers of the early-exit drafter, of 30 (default: 24)")  # fmt: skip
    p.add_argument("--page-size", type=int, default=16, help="KV pool page size (default: 16)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"],
                   help="default: float32 on the CPU, bfloat16 on CUDA")  # fmt: skip
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 decodes greedily (default: 0)")  # fmt: skip
    p.add_argument("--repeats", type=int, help="timed decodes per decoder, in passes over "
                   "the decoders; each keeps its fastest (default: 2 on the CPU, whose "
                   "shared cores' load moves a single timing; 1 on CUDA)")  # fmt: skip
    p.add_argument("--no-profile", action="store_true", help="CUDA: skip the two profiled "
                   "decodes per decoder (GPU idle; round split and top kernels)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object on stdout (prompt_ids, "
                   "ar_ids, ddtree_ids, accept_lens, and every decoder's row)")  # fmt: skip


def check_args(args) -> str | None:
    """The first bad flag, as a one-line message, or None. Nothing has run yet."""
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        return f"--device: expected cpu or cuda, got {args.device!r}"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        return "--device: cuda asked for, but torch sees no CUDA GPU"
    cuda = args.device.startswith("cuda")
    if args.max_new_tokens is None:
        # Without a length the demo answers like a chat (each prompt ends at its end of
        # turn); with one, every prompt decodes exactly that many tokens.
        # 128, the drafter's goal length, on the CPU too: over 16 tokens two cores' timing
        # noise decided the ratio (BENCHMARKS.md, session 18: 1.06-1.51x in four runs).
        args.stop_at_eos = True
        args.max_new_tokens = 128
    if args.budget is None:
        # On two CPU cores a verify token costs a fair share of a forward, so a small tree
        # pays (BENCHMARKS.md, session 18, 128 tokens: B = 3 1.62× greedy, B = 7 1.62×; a
        # B = 3 round is the cheaper one, so shorter answers gain more); on the H200 B = 15
        # (held-out prompts, bs 1 / 8 / 32: 2.72 / 2.15 / 1.55×, session 19), 31 and 63 to
        # show a larger tree's cost and gain.
        args.budget = (15, 31, 63) if cuda else (3,)
    if args.repeats is None:
        args.repeats = 1 if cuda else 2
    if args.prompt and args.bs is not None:
        return "--bs: give either --prompt or --bs, not both"
    if args.held_out is not None and (args.prompt or args.bs is not None):
        return "--held-out: give one of --prompt, --bs and --held-out"
    checks = [
        ("--bs", args.bs is None or args.bs >= 1, "must be at least 1"),
        ("--repeats", args.repeats >= 1, "must be at least 1"),
        ("--held-out", args.held_out is None or 1 <= args.held_out <= HELD_OUT,
         f"must be in 1..{HELD_OUT}"),
        ("--max-new-tokens", args.max_new_tokens >= 1, "must be at least 1"),
        ("--budget", bool(args.budget) and all(1 <= b <= 1023 for b in args.budget),
         "each budget must be in 1..1023"),
        ("--depth", 1 <= args.depth <= 20, "must be in 1..20"),
        ("--draft-layers", 1 <= args.draft_layers <= 30, "must be in 1..30"),
        ("--page-size", args.page_size >= 1 and args.page_size & (args.page_size - 1) == 0,
         "must be a power of two"),
        ("--temperature", args.temperature >= 0, "must be 0 or more"),
        ("--decoders", bool(args.decoders), "name at least one decoder"),
    ]  # fmt: skip
    for flag, ok, why in checks:
        if not ok:
            value = getattr(args, flag[2:].replace("-", "_"))
            return f"{flag}: {why}, got {value if not isinstance(value, tuple) else value}"
    if args.draft_weights and args.drafter != "dflash":
        return "--draft-weights: given with --drafter early-exit"
    if args.drafter == "dflash" and not args.draft_weights:
        args.draft_weights = str(SHIPPED_WEIGHTS)
    if args.draft_weights and not os.path.isfile(args.draft_weights):
        return f"--draft-weights: no such file {args.draft_weights!r}"
    if args.temperature > 0 and "cpu-build" in args.decoders:
        return "--temperature: the cpu-build decoder walks greedily only; drop it or use 0"
    return None


def log(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


def run(args) -> int:
    error = check_args(args)
    if error:
        print(f"demo: {error}", file=sys.stderr)
        return 2
    if args.drafter == "dflash":  # the drafter's block is the draft depth
        from .train_drafter import draft_block

        args.depth = draft_block(args.draft_weights)
    from .model import load_tokenizer, load_weights  # gguf and tokenizers: only for the demo

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("float32" if device.type == "cpu" else "bfloat16"))
    tok = load_tokenizer()
    texts = prompt_texts(args)
    if not args.json:
        for b, text in enumerate(texts):
            log(f"prompt {b}: {text}")
    weights = load_weights(dtype=dtype).to(device=device)
    prompts = [tok.chat(p) for p in texts]
    results = decode_all(weights, prompts, args, device)
    if args.json:
        print(json.dumps(as_json(texts, prompts, results, args, device, dtype)))
        return 0
    report(tok, prompts, results, args, device, dtype)
    return 0


def new_engine(weights, prompts, args, device):
    """One engine (weights, paged pool) for every decoder of the run: each decode prefills
    its prompts into the pool again."""
    from .engine import Engine, Pool

    # A request stops growing once finished; a round commits up to L+1 tokens and needs a
    # window of Q = B+1 slots past its prefix.
    capacity = max(map(len, prompts)) + args.max_new_tokens + 2 * (args.depth + 2)
    capacity += max(args.budget) + 1
    pool = Pool(weights, len(prompts), capacity, args.page_size, device, weights.embed.dtype)
    return Engine(weights, pool, args.draft_layers)


def plan(args) -> list[tuple[str, int | None]]:
    """(decoder, budget) in the order they run; greedy first, the reference."""
    rows = [("greedy", None)] if "greedy" in args.decoders else []
    if "chain" in args.decoders:
        rows.append(("chain", args.depth))
    for name in ("ddtree", "cpu-build"):
        if name in args.decoders:
            rows += [(name, b) for b in args.budget]
    return rows


def make_decoder(engine, name, budget, bs, args):
    from . import decode

    # No token id is -1: a decoder given it never stops before max_new_tokens.
    eos, t = engine.cfg.eos_id if args.stop_at_eos else -1, args.temperature
    if name == "greedy":
        return decode.Greedy(engine, bs, args.max_new_tokens, eos, t)
    # A tree of B nodes is at most B deep: the drafter drafts min(L, B) depths.
    depth = args.depth if name == "chain" else min(args.depth, budget)
    drafter = new_drafter(engine, bs, args, depth)
    if name == "cpu-build":
        return decode.CpuBuild(engine, bs, args.max_new_tokens, eos, drafter, budget, t)
    topk = 1 if name == "chain" else None
    return decode.Speculative(engine, bs, args.max_new_tokens, eos, drafter, budget, topk, t)


def new_drafter(engine, bs, args, depth=None):
    """The drafter `--drafter` names, for `bs` requests over `engine`, drafting `depth`
    positions (default and at most: --depth, the DFlash block)."""
    from . import decode

    depth = args.depth if depth is None else depth
    if args.drafter != "dflash":
        return decode.EarlyExitDrafter(engine, bs, depth)
    from .dflash import DFlashDrafter

    w, cfg = draft_weights(args.draft_weights, engine)
    return DFlashDrafter(engine, w, cfg, bs, depth)


@functools.lru_cache(maxsize=2)
def draft_weights(path: str, engine):
    """A DFlash weights file on `engine`'s device and dtype, read once for every decoder of
    the run (the drafters share the weights; each has its own context pool)."""
    from .train_drafter import load_weights

    w, cfg, _ = load_weights(path, engine.cfg, engine.device, engine.w.embed.dtype)
    return w, cfg


def decode_all(weights, prompts, args, device) -> list[dict]:
    """Every (decoder, budget) of `plan` on one engine, in `--repeats` passes over the plan
    (each row keeps its fastest timed decode: a burst of load on a shared machine then
    slows one pass, not one decoder's only decode), and on CUDA unless --no-profile, in the
    first pass, a profiled decode for the GPU idle fraction and one for the round split."""
    engine = new_engine(weights, prompts, args, device)
    if device.type == "cuda":  # untimed: first kernel loads, cuBLAS handles
        make_decoder(engine, "greedy", None, len(prompts), args).decode(prompts)
    rows = [{"decoder": name, "budget": budget, "result": None} for name, budget in plan(args)]
    for rep in range(args.repeats):
        for row in rows:
            keep_faster(row, timed_decode(engine, row, prompts, args, rep == 0))
    return rows


def timed_decode(engine, row, prompts, args, first: bool):
    """One decode of `row`'s decoder; on CUDA in the first pass, unless --no-profile, its
    profiled decodes too."""
    name, budget = row["decoder"], row["budget"]
    t = time.perf_counter()
    dec = make_decoder(engine, name, budget, len(prompts), args)
    r = dec.decode(prompts)
    if first and engine.device.type == "cuda" and not args.no_profile:
        profile(dec, prompts, r)
    label = name if budget is None else f"{name} B={budget}"
    log(f"{label}: {r.tokens_per_s():.1f} tokens/s, {r.accepted:.2f} tokens/round "
        f"({time.perf_counter() - t:.1f} s)")  # fmt: skip
    return r


def keep_faster(row, r) -> None:
    """`r` becomes the row's result if it is the first or the faster; the profile's fields
    stay the first pass's."""
    best = row["result"]
    if best is not None and r.seconds >= best.seconds:
        return
    if best is not None:
        r.idle, r.split, r.kernels = best.idle, best.split, best.kernels
    row["result"] = r


def profile(dec, prompts, r) -> None:
    """GPU idle of a profiled decode, and each stage's time per round from another whose
    rounds mark their stages (measure.py)."""
    from . import measure

    r.idle = measure.gpu_idle(lambda mark: dec.decode(prompts, on_decode_start=mark))
    stages = [name for name, _ in dec.stages()]
    r.split, r.kernels = measure.profiled_split(
        lambda: dec.decode(prompts, marked=True), tuple(stages)
    )


def greedy_row(rows):
    return next((row["result"] for row in rows if row["decoder"] == "greedy"), None)


def as_json(texts, prompts, rows, args, device, dtype) -> dict:
    from .measure import first_divergence

    greedy = greedy_row(rows)

    def entry(row):
        r = row["result"]
        div = None
        if greedy is not None and args.temperature <= 0:
            div = [first_divergence(g, o, m) for g, o, m in
                   zip(greedy.tokens, r.tokens, greedy.margins, strict=True)]  # fmt: skip
        return {
            "decoder": row["decoder"], "budget": row["budget"], "ids": r.tokens,
            "tokens_per_s": r.tokens_per_s(), "generated": r.generated,
            "seconds": r.seconds, "rounds": r.rounds, "accepted": r.accepted,
            "ms_per_round": 1000 * r.seconds / max(r.rounds, 1), "gpu_idle": r.idle,
            "split_ms": r.split, "kernels": r.kernels, "divergence": div,
            "queued_ahead": r.queued_ahead,
        }  # fmt: skip

    # The contract's summary keys: greedy's ids, and the first DDTree decode's ids and
    # tokens committed per round, per prompt.
    tree = next((row for row in rows if row["decoder"] == "ddtree"), None)
    return {
        "device": str(device), "dtype": str(dtype).removeprefix("torch."), "bs": len(prompts),
        "max_new_tokens": args.max_new_tokens, "stop_at_eos": args.stop_at_eos,
        "depth": args.depth,
        "ar_ids": greedy.tokens if greedy else None,
        "ddtree_ids": tree["result"].tokens if tree else None,
        "ddtree_budget": tree["budget"] if tree else None,
        "accept_lens": tree["result"].accept_lens if tree else None,
        "draft_layers": args.draft_layers, "temperature": args.temperature,
        "prompts": texts, "prompt_ids": prompts,
        "greedy_margins": greedy.margins if greedy else None,
        "decoders": [entry(row) for row in rows],
    }  # fmt: skip


def idle_estimate(d: dict) -> str:
    """1 - (GPU busy per round, profiled) / (ms per round, unprofiled): the idle of the
    timed decode, without the gaps the profiler itself adds between a graph's kernels."""
    idle = d["gpu_idle"]
    if idle is None or not d["ms_per_round"]:
        return "-"
    return f"{max(0.0, 1 - idle['busy_ms'] / d['ms_per_round']):.1%}"


def table(doc: dict) -> str:
    """The aligned table of a demo document (as_json's)."""
    base = next((d["tokens_per_s"] for d in doc["decoders"] if d["decoder"] == "greedy"), None)
    greedy_ids = next((d["ids"] for d in doc["decoders"] if d["decoder"] == "greedy"), None)
    head = ("decoder", "B", "tokens/s", "x greedy", "tokens/round", "rounds", "ms/round",
            "GPU idle", "idle est.", "draft / build / verify / accept ms",
            "same as greedy")  # fmt: skip
    lines = [head]
    for d in doc["decoders"]:
        split = d["split_ms"] or {}
        cells = " / ".join(f"{split[s]:.2f}" if s in split else "-" for s in STAGES)
        same = "-" if greedy_ids is None else (
            f"{sum(a == b for a, b in zip(greedy_ids, d['ids'], strict=True))} of "
            f"{len(d['ids'])}")  # fmt: skip
        idle = d["gpu_idle"]
        lines.append((
            d["decoder"], "-" if d["budget"] is None else str(d["budget"]),
            f"{d['tokens_per_s']:.1f}", "-" if not base else f"{d['tokens_per_s'] / base:.2f}",
            f"{d['accepted']:.2f}", str(d["rounds"]), f"{d['ms_per_round']:.2f}",
            "-" if idle is None else f"{idle['idle']:.1%}", idle_estimate(d),
            cells if split else "-", same,
        ))  # fmt: skip
    # Columns with nothing measured (the CUDA-only ones, on the CPU) are left out.
    keep = [i for i in range(len(head)) if any(line[i] != "-" for line in lines[1:])]
    lines = [tuple(line[i] for i in keep) for line in lines]
    widths = [max(len(line[i]) for line in lines) for i in range(len(keep))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)  # fmt: skip


CUDA_NOTE = (
    " GPU idle: over a profiled decode's rounds; idle est.: the timed decode's, from its "
    "ms/round and the GPU's busy time per round (the profiler adds gaps between a graph's "
    "kernels); the split: a profiled decode with a marker before each stage."
)


DRAFTER_NOTE = {
    "dflash": " The drafter: a DFlash block drafter (the shipped one's file, training and "
    "acceptance: python/ddtree/demo/weights/README.md); the H200 numbers are in BENCHMARKS.md.",
    "early-exit": " The early-exit drafter costs most of a round, so DDTree with it cannot "
    "beat greedy; the H200 numbers are in BENCHMARKS.md.",
}


def report(tok, prompts, rows, args, device, dtype) -> None:
    doc = as_json([], prompts, rows, args, device, dtype)
    greedy = greedy_row(rows)
    print(f"ddtree demo: SmolLM2-135M-Instruct on {device} ({doc['dtype']}), {len(prompts)} "
          f"prompts, up to {args.max_new_tokens} new tokens each, L = {args.depth}")  # fmt: skip
    if greedy is not None:
        for b, ids in enumerate(greedy.tokens):
            print(f"\n[{b}] {tok.decode(ids, skip_special=True)!r}")
    print()
    print(table(doc))
    print(
        "\ntokens/s: generated tokens over the decode, prefill left out; tokens/round: "
        "tokens committed per round (the bonus included)."
        + (CUDA_NOTE if device.type == "cuda" else " --device cuda adds GPU idle and "
           "each round's split.")
        + DRAFTER_NOTE[args.drafter]
    )  # fmt: skip
    report_kernels(doc)
    if args.temperature <= 0 and greedy is not None:
        report_divergences(tok, doc)


def report_kernels(doc, top: int = 6) -> None:
    """Where a round's time goes, for greedy and the first DDTree row (profiled, CUDA)."""
    for d in doc["decoders"]:
        first_tree = d["decoder"] == "ddtree" and d["budget"] == min(
            e["budget"] for e in doc["decoders"] if e["decoder"] == "ddtree"
        )
        if not d["kernels"] or not (d["decoder"] == "greedy" or first_tree):
            continue
        name = d["decoder"] + ("" if d["budget"] is None else f" B={d['budget']}")
        cells = ", ".join(
            f"{k['kernel'][:40]} {k['us_per_round']:.0f} us ({k['calls_per_round']:.0f}x)"
            for k in d["kernels"][:top]
        )
        ahead = d["queued_ahead"]
        queued = "" if ahead is None else f"; next round already queued at {ahead:.0%} of ends"
        print(f"# {name}, top kernels per round: {cells}{queued}")


def report_divergences(tok, doc) -> None:
    """A line per prompt whose tokens part from greedy's."""
    for d in doc["decoders"]:
        for b, div in enumerate(d["divergence"] or []):
            if div is not None:
                name = d["decoder"] + ("" if d["budget"] is None else f" B={d['budget']}")
                print(f"# {name} parts from greedy: {divergence_text(tok, b, div)}")


def divergence_text(tok, b: int, d: dict) -> str:
    """One prompt's first divergence: where, the two tokens, greedy's top-2 margin there."""

    def token(t):
        return "(none)" if t is None else repr(tok.decode([t]))

    margin = "?" if d["greedy_margin"] is None else f"{d['greedy_margin']:.3f}"
    return (
        f"prompt {b}, generated token {d['index']}: {token(d['other_token'])} where greedy "
        f"has {token(d['greedy_token'])} (greedy's top-1 minus top-2 logit there: {margin})"
    )
