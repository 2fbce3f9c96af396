"""Benchmark one DDTree round, per SPEC stage: the pure-Python reference vs the Rust CPU path.

Synthetic, DFlash-like draft logits (a few peaked tokens over Gaussian noise, flatter with
depth) go through ``ddtree.reference`` one request at a time and through ``ddtree.build_tree``
/ ``ddtree.accept_tree`` as a whole batch. Target logits are made so that the greedy walk
accepts several tokens. Times are microseconds per request.

``--device cuda`` times the GPU build instead (``ddtree/bench_gpu.py``) and ``--loop`` a
synthetic decode loop on the GPU (``ddtree/bench_loop.py``), ``--attention`` the tree verify
attention (``ddtree/bench_attention.py``), ``--host`` the host time of each eager ``Stepper``
call (``ddtree/bench_host.py``), ``--vocab-parallel`` the vocab-parallel build on CPU ranks
(``ddtree/bench_vocab_parallel.py``); each takes its own flags (``bench --loop --help``, ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import shlex
import statistics
import sys
import time

import numpy as np
import torch

import ddtree
from ddtree import _buffers, _cpu, _validate, reference

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# Draft logits: noise everywhere plus 1..MAX_HOT boosted tokens per row; the boost shrinks
# linearly from 100% at depth 1 to LAST_DEPTH_BOOST at depth L (a block-diffusion drafter is
# less sure about later positions, so deeper rows are flatter).
NOISE_STD = 1.0
MAX_HOT = 8
BOOST_RANGE = (8.0, 15.0)
LAST_DEPTH_BOOST = 0.7

# Target logits: at each node the posterior token is the first child's token with probability
# P_FIRST, another child's with P_OTHER, and otherwise nothing in the tree (the walk stops).
P_FIRST = 0.7
P_OTHER = 0.2
TARGET_PEAK = 40.0  # far above any noise value, so the argmax is the chosen child's token

# Chunk size of the draft-logit generator, in fp32 elements: bounds the transient memory.
GEN_CHUNK_ELEMS = 1 << 24


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The benchmarks' ``--help``: the description's line breaks kept, and each flag's help
    ending with its default (except None and False: a flag that is off unless given)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if (
            action.option_strings
            and d is not None
            and d is not False
            and d != argparse.SUPPRESS
            and "%(default)" not in text
        ):
            text += " (default: %(default)s)"
        return text


def add_round_shape(p: argparse.ArgumentParser) -> None:
    """The round shape every single-shape benchmark takes (bench, --loop, --host)."""
    p.add_argument("--bs", type=int, default=64, help="requests in the batch")
    p.add_argument("--budget", type=int, default=255, help="node budget B")
    p.add_argument("--depth", type=int, default=15, help="depth limit L")
    p.add_argument("--vocab", type=int, default=151936, help="vocabulary V")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_round_shape(p)
    p.add_argument("--topk", type=int, default=None, help="candidate cap (default: none)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="logits dtype")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic logits")
    p.add_argument("--repeats", type=int, default=5, help="timed Rust runs, their median reported")
    p.add_argument("--ref-requests", type=int, default=4, help="requests the reference runs")
    p.add_argument(
        "--target-gb",
        type=float,
        default=2.0,
        help="memory cap of the [n, Q, V] target logits; accept runs on the n that fit",
    )
    p.add_argument(
        "--loop",
        action="store_true",
        help="the GPU decode-loop benchmark in four modes, with its own flags (see "
        "ddtree/bench_loop.py; `python -m ddtree` routes it there before parsing)",
    )
    p.add_argument(
        "--attention",
        action="store_true",
        help="the GPU tree verify attention against torch SDPA, with its own flags (see "
        "ddtree/bench_attention.py; routed there before parsing like --loop)",
    )
    p.add_argument(
        "--host",
        action="store_true",
        help="host time per eager Stepper call on CUDA against one torch op's launch, with "
        "its own flags (see ddtree/bench_host.py; routed there before parsing like --loop)",
    )
    p.add_argument(
        "--vocab-parallel",
        action="store_true",
        help="the vocab-parallel build (group=) on CPU ranks against gathering the logits, "
        "with its own flags (see ddtree/bench_vocab_parallel.py; routed there like --loop)",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu or cuda: the GPU build against the CPU paths, over a sweep of --bs and "
        "--budget values, with its own flags (see ddtree/bench_gpu.py)",
    )


def check_args(args: argparse.Namespace) -> str | None:
    """An error message for arguments the benchmark cannot run with, else None."""
    positive = ("bs", "depth", "vocab", "budget", "repeats", "ref_requests")
    for name in positive:
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be ≥ 1"
    for name, limit in (("depth", _validate.MAX_DEPTH), ("budget", _validate.MAX_BUDGET)):
        if getattr(args, name) > limit:
            return f"--{name} must be ≤ {limit}, got {getattr(args, name)}"
    if args.topk is not None and args.topk < 1:
        return "--topk must be ≥ 1"
    if args.target_gb <= 0:
        return "--target-gb must be > 0"
    return None


def run(args: argparse.Namespace) -> int:
    if args.device.startswith("cuda"):
        from . import bench_gpu

        return bench_gpu.main(getattr(args, "argv", None))
    if args.device != "cpu":
        print(f"ddtree bench: unknown --device {args.device!r}; use cpu or cuda", file=sys.stderr)
        return 2
    error = check_args(args)
    if error:
        print(f"ddtree bench: {error}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    cfg = Config.from_args(args)
    print(header(cfg, getattr(args, "argv", sys.argv[1:])), flush=True)
    result = benchmark(cfg)
    print(report(cfg, result), flush=True)
    print(f"\ntotal wall time {time.perf_counter() - started:.1f} s")
    return 0


@dataclasses.dataclass(frozen=True)
class Config:
    bs: int
    depth: int
    vocab: int
    budget: int
    topk: int | None
    dtype: torch.dtype
    seed: int
    repeats: int
    ref_requests: int
    target_bytes: int

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> Config:
        return cls(
            bs=a.bs,
            depth=a.depth,
            vocab=a.vocab,
            budget=a.budget,
            topk=a.topk,
            dtype=DTYPES[a.dtype],
            seed=a.seed,
            repeats=a.repeats,
            ref_requests=min(a.ref_requests, a.bs),
            target_bytes=int(a.target_gb * 2**30),
        )

    @property
    def q(self) -> int:
        return self.budget + 1

    @property
    def k(self) -> int:
        return min(self.budget, self.vocab, self.topk or self.budget)

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()


def header(cfg: Config, argv: list[str]) -> str:
    machine = platform.processor() or platform.machine()
    rayon = os.environ.get("RAYON_NUM_THREADS", "default (all cores)")
    lines = [
        f"ddtree bench  {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"machine: {machine}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}; "
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"rayon threads: {rayon}",
        f"shapes: bs={cfg.bs} L={cfg.depth} V={cfg.vocab} B={cfg.budget} Q={cfg.q} K={cfg.k} "
        f"dtype={str(cfg.dtype).removeprefix('torch.')} seed={cfg.seed}",
        f"command: python -m ddtree {shlex.join(argv)}",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Progress bar (stderr; no dependency)
# ---------------------------------------------------------------------------------------------


class Progress:
    """``[#####.....] 5/10 label`` on stderr: redrawn in place on a terminal; elsewhere (a log,
    a pipe) only the finished bar is written, so logs stay one line per task."""

    WIDTH = 20

    def __init__(self, total: int, label: str):
        self.total = max(total, 1)
        self.label = label
        self.done = 0
        self.tty = sys.stderr.isatty()
        self._draw()

    def advance(self, n: int = 1) -> None:
        self.done = min(self.done + n, self.total)
        self._draw()

    def _draw(self) -> None:
        finished = self.done == self.total
        if not (self.tty or finished):
            return
        filled = self.WIDTH * self.done // self.total
        bar = "#" * filled + "." * (self.WIDTH - filled)
        line = f"[{bar}] {self.done}/{self.total} {self.label}"
        end = "\n" if finished else ""
        sys.stderr.write(("\r" if self.tty else "") + line + end)
        sys.stderr.flush()


# ---------------------------------------------------------------------------------------------
# Synthetic inputs
# ---------------------------------------------------------------------------------------------


def draft_logits(cfg: Config, gen: torch.Generator) -> torch.Tensor:
    """``[bs, L, V]`` peaked draft logits, generated a few requests at a time in fp32."""
    out = torch.empty((cfg.bs, cfg.depth, cfg.vocab), dtype=cfg.dtype)
    per_chunk = max(1, GEN_CHUNK_ELEMS // (cfg.depth * cfg.vocab))
    starts = range(0, cfg.bs, per_chunk)
    bar = Progress(len(starts), "generating draft logits")
    for b0 in starts:
        b1 = min(b0 + per_chunk, cfg.bs)
        out[b0:b1] = peaked_rows(b1 - b0, cfg.depth, cfg.vocab, gen).to(cfg.dtype)
        bar.advance()
    return out


def peaked_rows(n: int, depth: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """fp32 ``[n, depth, vocab]``: N(0, NOISE_STD²) plus 1..MAX_HOT boosted tokens per row."""
    x = torch.randn((n, depth, vocab), generator=gen)
    x.mul_(NOISE_STD)
    hot_ids = torch.randint(0, vocab, (n, depth, MAX_HOT), generator=gen)
    lo, hi = BOOST_RANGE
    boost = lo + (hi - lo) * torch.rand((n, depth, MAX_HOT), generator=gen)
    boost *= depth_decay(depth).view(1, depth, 1)
    # Row r keeps only its first hot_count[r] boosts (1..MAX_HOT of them).
    hot_count = torch.randint(1, MAX_HOT + 1, (n, depth, 1), generator=gen)
    boost *= torch.arange(MAX_HOT).view(1, 1, MAX_HOT) < hot_count
    x.scatter_add_(2, hot_ids, boost)
    return x


def depth_decay(depth: int) -> torch.Tensor:
    """Boost factor per depth: 1 at depth 1, LAST_DEPTH_BOOST at depth L."""
    if depth == 1:
        return torch.ones(1)
    return torch.linspace(1.0, LAST_DEPTH_BOOST, depth)


def accept_requests(cfg: Config) -> int:
    """How many requests' ``[Q, V]`` target logits fit in the memory cap (at least 1)."""
    per_request = cfg.q * cfg.vocab * cfg.itemsize
    return max(1, min(cfg.bs, cfg.target_bytes // per_request))


def first_requests(tree: ddtree.Tree, n: int) -> ddtree.Tree:
    """The first ``n`` requests of ``tree`` (contiguous views along the batch axis)."""
    fields = dataclasses.fields(tree)
    return ddtree.Tree(**{f.name: getattr(tree, f.name)[:n] for f in fields})


def sibling_ranks(parents: torch.Tensor) -> torch.Tensor:
    """``[n, Q]``: node j's position among its parent's children (children are in index order,
    so it is the number of smaller indices with the same parent). Root and pads get 0."""
    q = parents.shape[1]
    same_parent = parents.unsqueeze(2) == parents.unsqueeze(1)  # [n, Q(j), Q(j')]
    earlier = torch.ones(q, q, dtype=torch.bool).tril(diagonal=-1)  # j' < j
    return (same_parent & earlier).sum(dim=2)


def posterior_tokens(tree: ddtree.Tree, gen: torch.Generator) -> torch.Tensor:
    """``[n, Q]`` token the target will prefer at each node, or -1 for "no child's token".

    First child with probability P_FIRST, a uniformly chosen later sibling of it with P_OTHER
    (the first child again when there is none), else -1. Leaves get -1.
    """
    parents, ids = tree.parents, tree.verify_ids
    n, q = parents.shape
    is_node = parents >= 0  # root and pads have parent -1
    parent_slot = parents.clamp(min=0)
    children = torch.zeros(n, q, dtype=torch.int64)
    children.scatter_add_(1, parent_slot, is_node.long())
    u = torch.rand((n, q), generator=gen)
    other = 1 + (torch.rand((n, q), generator=gen) * (children - 1).clamp(min=0)).long()
    want_rank = torch.where(u < P_FIRST, 0, torch.where(children > 1, other, 0))
    want_rank = torch.where(u < P_FIRST + P_OTHER, want_rank, -1)
    # A node is "the chosen child" iff its sibling rank is the rank its parent wants.
    chosen = is_node & (sibling_ranks(parents) == want_rank.gather(1, parent_slot))
    tokens = torch.full((n, q), -1, dtype=torch.int64)
    b, j = chosen.nonzero(as_tuple=True)
    tokens[b, parents[b, j]] = ids[b, j]
    return tokens


def target_logits(tree: ddtree.Tree, cfg: Config, gen: torch.Generator) -> torch.Tensor:
    """``[n, Q, V]`` target logits whose argmax at each node is its ``posterior_tokens``.

    The noise comes from one ``[Q, V]`` bank, row-shuffled per request: drawing 2 GB of fresh
    Gaussians takes ~15 s on two cores, and the walk's cost does not depend on which noise it
    reads (it takes an argmax over every visited row either way).
    """
    n, q = tree.verify_ids.shape
    bank = (torch.randn((q, cfg.vocab), generator=gen) * NOISE_STD).to(cfg.dtype)
    tokens = posterior_tokens(tree, gen)
    out = torch.empty((n, q, cfg.vocab), dtype=cfg.dtype)
    bar = Progress(n, "generating target logits")
    for b in range(n):
        out[b] = bank[torch.randperm(q, generator=gen)]
        rows = (tokens[b] >= 0).nonzero(as_tuple=True)[0]
        out[b, rows, tokens[b, rows]] = TARGET_PEAK
        bar.advance()
    return out


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


def timed(fn, *args, **kwargs):
    """(seconds, result) of one call."""
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - t0, result


def median_time(fn, repeats: int, label: str):
    """Warm up once (page faults, thread pool start), then the median of ``repeats`` runs."""
    bar = Progress(repeats + 1, label)
    _, result = timed(fn)
    bar.advance()
    times = []
    for _ in range(repeats):
        seconds, result = timed(fn)
        times.append(seconds)
        bar.advance()
    return statistics.median(times), result


@dataclasses.dataclass
class RustTimes:
    build_s: float  # whole batch, stages 1-3
    select_emit_s: float  # whole batch, stages 2-3 alone (from the stage-1 results)
    accept_s: float  # first n_accept requests, stage 4 (greedy: argmax at visited nodes)
    walk_s: float  # first n_accept requests, stage 4 with the posterior tokens given
    n_accept: int
    tree: ddtree.Tree
    acc: ddtree.Acceptance


def time_build(cfg: Config, logits, roots, prefix):
    """Median seconds of ``build_tree`` on the whole batch (stages 1-3), and the tree."""

    def build():
        return ddtree.build_tree(logits, roots, prefix, budget=cfg.budget, topk=cfg.topk)

    return median_time(build, cfg.repeats, "Rust build_tree (stages 1-3)")


def time_accept(cfg: Config, tree: ddtree.Tree, target: torch.Tensor):
    """Median seconds of greedy ``accept_tree`` (stage 4), and the acceptance."""
    return median_time(
        lambda: ddtree.accept_tree(tree, target), cfg.repeats, "Rust accept_tree (stage 4)"
    )


def time_select_emit(cfg: Config, tree: ddtree.Tree, roots, prefix):
    """Median seconds of stages 2-3 alone, from the stage-1 results ``tree`` holds."""
    eligible = torch.isfinite(tree.topk_logprobs).sum(-1).to(torch.int32)
    eligible[tree.status != 0] = -1
    eligible = eligible.flatten().contiguous()
    fields = dataclasses.fields(tree)
    scratch = ddtree.Tree(**{f.name: getattr(tree, f.name).clone() for f in fields})

    def run():
        _cpu.select_emit(scratch, eligible, roots, prefix, cfg.vocab)
        return scratch

    seconds, rebuilt = median_time(run, cfg.repeats, "Rust stages 2-3 alone")
    same = all(torch.equal(getattr(rebuilt, f.name), getattr(tree, f.name)) for f in fields)
    return seconds, same


def time_walk(cfg: Config, tree: ddtree.Tree, tokens: torch.Tensor):
    """Median seconds of the walk with every node's posterior token given."""
    acc = _buffers.new_acceptance(tree.batch_size, tree.depth, "cpu")

    def run():
        _cpu.accept_tokens_into(tree, tokens, acc)
        return acc

    return median_time(run, cfg.repeats, "Rust walk (posterior tokens given)")


STAGES = ("candidates", "select", "emit", "accept", "walk")


def reference_request(cfg, logits_np, target_np, tokens_np, root: int, prefix: int, b: int):
    """Per-stage seconds of the reference on one request, and its tree and acceptance."""
    t = {}
    t["candidates"], c = timed(reference.candidates, logits_np, cfg.k)
    t["select"], nodes = timed(reference.select, c.logprobs, c.eligible, cfg.budget)
    t["emit"], tree = timed(reference.emit, nodes, c.ids, root, prefix, cfg.budget)
    posterior = reference._LazyGreedy(target_np)  # argmax only at the nodes the walk visits
    t["accept"], acc = timed(reference.accept, tree, posterior, cfg.depth, request=b)
    t["walk"], _ = timed(reference.accept, tree, tokens_np, cfg.depth, request=b)
    return t, tree, acc


def time_reference(cfg, logits, roots, prefix, target, tokens):
    """Mean per-stage seconds per request over the first ``ref_requests`` requests.

    The bf16 → fp32 numpy conversion of each request's inputs is left out of the timing (the
    reference's batch helpers do it once, up front); the warm-up is request 0, untimed.
    """
    n = cfg.ref_requests
    bar = Progress(n + 1, "reference (stages 1-4, one request at a time)")
    totals = dict.fromkeys(STAGES, 0.0)
    trees, accs = [], []
    for i, b in enumerate([0, *range(n)]):
        x_np = logits[b].float().numpy()
        t_np = target[b].float().numpy()
        tok_np = tokens[b].numpy()
        t, tree, acc = reference_request(cfg, x_np, t_np, tok_np, int(roots[b]), int(prefix[b]), b)
        if i > 0:  # i == 0 is the warm-up
            for stage in STAGES:
                totals[stage] += t[stage]
            trees.append(tree)
            accs.append(acc)
        bar.advance()
    return {stage: s / n for stage, s in totals.items()}, trees, accs


def agreement(rust: RustTimes, ref_trees, ref_accs) -> str:
    """One line: do the reference and Rust agree on the requests both ran?"""
    same_tree = sum(
        bool(np.array_equal(rust.tree.verify_ids[b].numpy(), t["verify_ids"]))
        and bool(np.array_equal(rust.tree.parents[b].numpy(), t["parents"]))
        for b, t in enumerate(ref_trees)
    )
    same_acc = sum(
        bool(np.array_equal(rust.acc.accepted_nodes[b].numpy(), a["accepted_nodes"]))
        and int(rust.acc.bonus[b]) == a["bonus"]
        for b, a in enumerate(ref_accs)
    )
    n = len(ref_trees)
    verdict = "" if same_tree == same_acc == n else "   <-- MISMATCH"
    return (
        f"reference vs Rust on requests 0..{n - 1}: identical trees {same_tree}/{n}, "
        f"identical acceptances {same_acc}/{n}{verdict}"
    )


# ---------------------------------------------------------------------------------------------
# The whole run and its report
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    ref: dict  # stage -> seconds per request
    rust: RustTimes
    agreement: str
    gen_s: float
    ref_requests: int  # may be fewer than asked: the reference needs the requests' targets


def benchmark(cfg: Config) -> Result:
    gen = torch.Generator().manual_seed(cfg.seed)
    t0 = time.perf_counter()
    logits = draft_logits(cfg, gen)
    roots = torch.randint(0, cfg.vocab, (cfg.bs,), generator=gen)
    prefix = torch.randint(16, 4096, (cfg.bs,), generator=gen)
    n_acc = accept_requests(cfg)
    gen_s = time.perf_counter() - t0

    build_s, tree = time_build(cfg, logits, roots, prefix)
    select_emit_s, rebuilt_same = time_select_emit(cfg, tree, roots, prefix)
    # The target logits follow the tree's own child lists, so they are made after the build.
    small = first_requests(tree, n_acc)
    target = target_logits(small, cfg, gen)
    tokens = target.argmax(-1).contiguous()  # every node's greedy posterior, computed ahead
    accept_s, acc = time_accept(cfg, small, target)
    walk_s, walked = time_walk(cfg, small, tokens)
    rust = RustTimes(build_s, select_emit_s, accept_s, walk_s, n_acc, tree, acc)
    cfg = dataclasses.replace(cfg, ref_requests=min(cfg.ref_requests, n_acc))
    ref, ref_trees, ref_accs = time_reference(cfg, logits, roots, prefix, target, tokens)
    agree = agreement(rust, ref_trees, ref_accs)
    if not rebuilt_same or not torch.equal(walked.accepted_nodes, acc.accepted_nodes):
        agree += "   <-- MISMATCH (stages 2-3 alone or the given-token walk)"
    return Result(ref, rust, agree, gen_s, cfg.ref_requests)


def us(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e6:,.0f}"


def ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None else f"{a / b:,.1f}x"


def table_rows(result: Result):
    """(stage, reference s/request, Rust s/request or None) in print order."""
    r, rust = result.ref, result.rust
    bs = rust.tree.batch_size
    rust_build = rust.build_s / bs
    rust_se = rust.select_emit_s / bs
    rust_accept = rust.accept_s / rust.n_accept
    rust_walk = rust.walk_s / rust.n_accept
    return [
        ("1    candidates (Rust: build - stages 2-3)", r["candidates"], rust_build - rust_se),
        ("2    select", r["select"], None),
        ("3    emit", r["emit"], None),
        ("2-3  select+emit", r["select"] + r["emit"], rust_se),
        ("4    walk, posterior tokens given", r["walk"], rust_walk),
        ("4    accept, greedy (argmax of visited rows)", r["accept"], rust_accept),
        ("build+walk (2-3 + walk) *", r["select"] + r["emit"] + r["walk"], rust_se + rust_walk),
        ("1-3  build", r["candidates"] + r["select"] + r["emit"], rust_build),
        (
            "1-4  full round (greedy accept)",
            r["candidates"] + r["select"] + r["emit"] + r["accept"],
            rust_build + rust_accept,
        ),
    ]


def format_table(rows) -> str:
    columns = ("stage", "reference µs/request", "Rust CPU µs/request", "ratio (ref/Rust)")
    cells = [columns] + [(name, us(a), us(b), ratio(a, b)) for name, a, b in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(4)]
    lines = []
    for i, row in enumerate(cells):
        name = row[0].ljust(widths[0])
        nums = [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        lines.append(" | ".join([name, *nums]))
        if i == 0:
            lines.append("-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def tree_stats(rust: RustTimes) -> str:
    nodes = rust.tree.num_nodes.double()
    lens = rust.acc.accept_len
    hist = torch.bincount(lens, minlength=int(lens.max()) + 1)
    hist_text = " ".join(f"{n}:{int(c)}" for n, c in enumerate(hist.tolist()) if c)
    depth = rust.tree.depths.max(dim=1).values.double()
    return (
        f"Rust trees: num_nodes mean {nodes.mean():.1f} (min {int(nodes.min())}, "
        f"max {int(nodes.max())}); deepest node mean {depth.mean():.1f}\n"
        f"Rust walk:  accept_len mean {lens.double().mean():.2f} over {rust.n_accept} "
        f"requests (root included); histogram len:count {hist_text}"
    )


def report(cfg: Config, result: Result) -> str:
    rust = result.rust
    accept_note = (
        f"stage 4 ran on all {rust.n_accept} requests"
        if rust.n_accept == cfg.bs
        else f"stage 4 ran on the first {rust.n_accept} of {cfg.bs} requests only: "
        f"[{cfg.bs}, {cfg.q}, {cfg.vocab}] target logits would not fit in "
        f"--target-gb {cfg.target_bytes / 2**30:g} GiB"
    )
    threads = os.environ.get("RAYON_NUM_THREADS") or str(os.cpu_count())
    lines = [
        "",
        format_table(table_rows(result)),
        "",
        f"Rust batch times (median of {cfg.repeats}): build_tree {result.rust.build_s * 1e3:.1f} "
        f"ms for {cfg.bs} requests; accept_tree {rust.accept_s * 1e3:.2f} ms for "
        f"{rust.n_accept} requests ({accept_note}).",
        f"Reference: mean over {result.ref_requests} request(s), one pass, after one warm-up "
        "request; single-threaded Python/numpy.",
        tree_stats(rust),
        result.agreement,
        f"input generation {result.gen_s:.1f} s (draft logits) — not timed above.",
        "",
        "Notes:",
        "  Rust µs/request = batch time / requests, with rayon using "
        f"{threads} thread(s); the reference is one",
        "  request at a time on one thread. Rust stage 1 = its build_tree time minus its",
        "  stages 2-3 time (run alone on build_tree's own stage-1 results).",
        "  * build+walk: the heap build (stages 2-3) and the walk with every node's posterior",
        "    token given, on both sides: the same work. The greedy accept row adds the argmax",
        "    over the vocabulary at each visited node, which dominates stage 4 on both sides.",
        "  Reference stage 4 reads fp32 numpy target rows converted beforehand (not timed);",
        "  Rust reads the bf16/fp16/fp32 target tensor in place.",
    ]
    return "\n".join(lines)
