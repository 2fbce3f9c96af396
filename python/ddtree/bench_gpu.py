"""``python -m ddtree bench --device cuda``: the GPU build (SPEC stages 1–3) against the
paths it replaces, measured in one run.

Per (bs, B): GPU time of each stage (stage 1 both ways where few rows spread each row over
a cluster of blocks: clustered and one block a row; the selection as launched and both
ways: the parallel threshold search and the best-first warp, which the launcher takes up to
B = 31) and of the whole build (CUDA events
around replays of a captured graph, median), host time per ``Stepper.step()`` call, and,
in the same run: stock ``torch.topk`` + ``torch.logsumexp``; the CPU path SGLang runs
today (top-K and logsumexp on the GPU, copy to host, a Python heap and visibility mask per
request, copy back); the Rust CPU path of this package on host copies of the logits; and,
where SGLang 0.5.23's UNO builder is found (``--uno``; `bench_uno`) and its limits allow
the shape (Q ≤ 128, Q·K ≤ 2048), UNO's whole build with K candidates per depth, its top-k
alone, and ddtree's whole build with the same top-k cap K.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch

from . import _core, _cuda, _partials, bench_uno, reference
from .bench import HelpFormatter
from .stepper import Stepper

# (column, stage bits of launch_build): 8 forces the best-first warp, 32 the parallel
# selection (the launcher picks by budget), 16 stage 1 one block a row where few rows would
# spread over clusters, each timed in the same run for the ratio.
STAGES = (
    ("candidates", 1),
    ("candidates_one_block", 1 | 16),
    ("select", 2),
    ("select_parallel", 2 | 32),
    ("select_best_first", 2 | 8),
    ("emit", 4),
    ("build", 7),
)


def peaked_logits(bs, depth, vocab, seed, device, shift: float = 0.0) -> torch.Tensor:
    """DFlash-like rows: Gaussian noise, a few strong tokens, flatter with depth (bf16),
    every logit moved by ``shift`` (the tree is the same; Z moves, and with it which rows
    the GPU's normaliser sums in its precise grade: maxima in (-25.5, 4))."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(bs, depth, vocab, device=device, generator=g) * 2.0
    hot = torch.randint(0, vocab, (bs, depth, 4), device=device, generator=g)
    strength = torch.linspace(14.0, 6.0, depth, device=device).view(1, depth, 1)
    boost = strength * torch.rand(bs, depth, 4, device=device, generator=g).add(0.5)
    x.scatter_(2, hot, boost)
    return (x + shift).to(torch.bfloat16)


PRECISE_MAX = (-25.5, 4.0)  # fixed_sum.cuh: rows whose maximum lies between sum precisely


def precise_share(x: torch.Tensor) -> float:
    """The share of rows whose normaliser the GPU sums in its precise (float64) grade."""
    m = x.float().amax(dim=-1)
    return ((m > PRECISE_MAX[0]) & (m < PRECISE_MAX[1])).float().mean().item()


SPIN_CYCLES = 40_000_000  # ~20 ms: longer than the host takes to queue the replays


def graph_time_us(fn, replays: int) -> float:
    """Median GPU time of one replay of a graph that captured ``fn``.

    A spin kernel first holds the GPU while the host queues every replay, so a replay's
    time is its own and not the host's submission latency (which would put a floor of
    ~10 µs under every kernel)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(replays)
    ]
    torch.cuda._sleep(SPIN_CYCLES)
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events) * 1000.0


def eager_time_us(fn, reps: int, before=None) -> float:
    """Median µs of eager calls of `fn` (CUDA events around each); `before()` runs ahead of
    every timed call, outside the events (e.g. an L2 flush)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def host_step_us(stepper, x, roots, prefix, calls: int) -> float:
    """Host time of one ``step()`` call (launches only; the GPU runs behind)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        stepper.step(x, roots, prefix)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def seed_cpu_path_us(x, roots, prefix, budget: int) -> float:
    """What SGLang does today: GPU top-K + logsumexp, host heap and mask, copy back."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    k = min(budget, x.shape[2])
    xf = x.float()
    top = torch.topk(xf, k, dim=-1)
    lp = (top.values - torch.logsumexp(xf, dim=-1, keepdim=True)).cpu().numpy()
    ids = top.indices.cpu().numpy()
    roots_h, prefix_h = roots.tolist(), prefix.tolist()
    outs = []
    for b in range(x.shape[0]):
        eligible = np.isfinite(lp[b]).sum(axis=1)
        nodes = reference.select(lp[b], eligible, budget)
        t = reference.emit(nodes, ids[b], roots_h[b], prefix_h[b], budget)
        outs.append(t)
    for key in ("verify_ids", "positions", "parents", "ancestor_bits"):
        torch.from_numpy(np.stack([o[key] for o in outs])).to(x.device)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6


def rust_cpu_us(x_host, roots, prefix, budget: int) -> tuple[float, object]:
    from . import build_tree

    t0 = time.perf_counter()
    tree = build_tree(x_host, roots, prefix, budget=budget)
    return (time.perf_counter() - t0) * 1e6, tree


STAT_NAMES = (
    "parallel",
    "prunes",
    "bisect",
    "store",
    "ties",
    "levels",
    "count",
    "prune",
    "grow",
    "choose",
    "order",
    "write",
    "first",
)


SELECT_SLOTS = 16  # the selection's slots a request (params.h: kSelectStatSlots)


def selection_stats(tree, scratch, x, roots, prefix, budget, k) -> dict:
    """The selection kernel's own diagnostics (kernels/include/ddtree/select_parallel.cuh,
    `SelectStat`), averaged over the batch: what it did and thread 0's clock cycles per
    phase."""
    bs = x.shape[0]
    stats = torch.zeros(bs, SELECT_SLOTS, dtype=torch.int64, device=x.device)
    _cuda.launch_build(tree, dict(scratch, stats=stats), x, roots, prefix, budget, k, 1 | 2)
    s = stats[:, : len(STAT_NAMES)].double().mean(dim=0).tolist()
    out = dict(zip(STAT_NAMES, s, strict=True))
    out["parallel"] = float((stats[:, 0] == 1).double().mean())
    return out


# Stage 1's phases in the diagnostics build (DDTREE_STAGE1_CLOCKS=1 at build time;
# kernels/include/ddtree/candidates.cuh, `CandPhase`): each row's slots hold thread 0's
# clock64 at the end of each phase it passed (0 where it did not), then %globaltimer at its
# start and end (ns) and its SM.
PHASES = (
    "start",
    "first floor",
    "one read",
    "reduce",
    "row floor",
    "keep",
    "second read",
    "max pass",
    "floor",
    "sum+collect",
    "select",
    "normaliser",
    "write",
)
PHASE_SLOTS = 16
START_NS, END_NS, SM = len(PHASES), len(PHASES) + 1, len(PHASES) + 2


def stage1_phases(slots: torch.Tensor) -> dict | None:
    """Where stage 1's rows spent their cycles, from the diagnostics slots `[rows, 16]`
    (None where the kernels are the release build: nothing written). A row's marks are
    sorted by clock; each gap goes to the later mark's phase. Also: the kernel's span from
    the global timer, the mean row's time, how many rows were open at once on average
    (sum of row times ÷ span), and the rows an SM ran."""
    slots = slots.cpu().to(torch.int64)
    if not bool((slots[:, 0] != 0).any()):
        return None
    cycles = {name: 0.0 for name in PHASES[1:]}
    taken = dict.fromkeys(PHASES[1:], 0)
    rows = slots.shape[0]
    row_cycles = 0
    for r in slots.tolist():
        marks = sorted((c, i) for i, c in enumerate(r[: len(PHASES)]) if c != 0)
        row_cycles += marks[-1][0] - marks[0][0]  # a rejected row stops before the write
        for (c0, _), (c1, i) in zip(marks, marks[1:], strict=False):
            cycles[PHASES[i]] += c1 - c0
            taken[PHASES[i]] += 1
    ns = (slots[:, END_NS] - slots[:, START_NS]).double()
    span = float(slots[:, END_NS].max() - slots[:, START_NS].min())
    per_sm = torch.bincount(slots[:, SM])
    return {
        "cycles": {n: c / rows for n, c in cycles.items()},
        "taken": taken,
        "rows": rows,
        "row_cycles": row_cycles / rows,
        "row_us": float(ns.mean()) / 1e3,
        "span_us": span / 1e3,
        "open": float(ns.sum()) / span if span > 0 else 0.0,
        "sm_rows": (int(per_sm[per_sm > 0].min()), int(per_sm.max())),
    }


def stage1_clocks(tree, scratch, x, roots, prefix, budget, k) -> dict | None:
    """Stage 1 alone with its diagnostics slots (`stage1_phases`), launched as the build
    launches it; where that is the clustered kernel (which keeps no slots), one block a row
    of whole blocks instead (bit 16), and the result says so (`forced`)."""
    bs, depth, _ = x.shape
    for bits in (1, 1 | 16):
        flat = torch.zeros(bs * SELECT_SLOTS + bs * depth * PHASE_SLOTS, dtype=torch.int64,
                           device=x.device)  # fmt: skip
        _cuda.launch_build(tree, dict(scratch, stats=flat), x, roots, prefix, budget, k, bits)
        torch.cuda.synchronize()
        phases = stage1_phases(flat[bs * SELECT_SLOTS :].view(bs * depth, PHASE_SLOTS))
        if phases is not None:
            return dict(phases, forced=bits != 1)
    return None


def print_stage1_phases(rows) -> None:
    """The diagnostics build's stage-1 table (nothing for a release build)."""
    have = [r for r in rows if r.get("stage1")]
    if not have:
        return
    print("\n# stage 1 by phase (diagnostics build; mean cycles a row, thread 0's clock64;")
    print("# open = rows in flight on average; rows an SM: least, most)")
    names = PHASES[1:]
    print("bs | B | " + " | ".join(names) + " | row cycles | row µs | span µs | open | rows an SM")
    for r in have:
        p = r["stage1"]
        cells = [f"{p['cycles'][n]:.0f}" for n in names]
        lo, hi = p["sm_rows"]
        forced = " (one block a row, forced)" if p.get("forced") else ""
        print(
            f"{r['bs']} | {r['B']} | " + " | ".join(cells) + f" | {p['row_cycles']:.0f} | "
            f"{p['row_us']:.1f} | {p['span_us']:.1f} | {p['open']:.1f} | {lo}–{hi}{forced}"
        )


def uno_columns(uno, tree, scratch, x, roots, prefix, budget, replays) -> dict:
    """UNO's build at Q = B + 1 with K = `bench_uno.uno_k`, its top-k alone, and ddtree's
    build with top-k cap K; {} where there is no UNO or its limits refuse the shape."""
    bs, depth, vocab = x.shape
    k = bench_uno.uno_k(budget + 1, depth, vocab) if uno else None
    if k is None or k > budget:  # ddtree's build takes a top-k cap up to B
        return {}
    ws: dict = {}
    flat = x.view(bs * depth, vocab)
    # Its top-k's values against torch.topk's (ids may differ on ties: flashinfer's are not
    # ordered among equal values), so a wrong library shows before its time is read.
    same = torch.equal(uno.topk(flat, k, sorted=True)[0], torch.topk(flat, k, sorted=True)[0])
    return {
        "uno_k": k,
        "uno_own_topk": uno.own_topk,
        "uno_topk_same": same,
        "uno": graph_time_us(
            lambda: uno.build(
                roots, x, max_nodes=budget + 1, candidate_top_k=k, temperature=0.0, workspace=ws
            ),  # fmt: skip
            replays,
        ),
        "uno_topk": graph_time_us(lambda: uno.topk(flat, k, sorted=True), replays),
        # A plain read of the logits (a row maximum each): what any top-k run as its own
        # pass, as UNO runs one, costs at least.
        "read_floor": graph_time_us(lambda: torch.amax(flat, dim=-1), replays),
        "build_at_k": graph_time_us(
            lambda: _cuda.launch_build(tree, scratch, x, roots, prefix, budget, k, 7), replays
        ),
        # Where build@K's time goes: its stage 1 and its selection (of the stage-1 outputs
        # the replays above left), and the selection's own diagnostics at K.
        "cand_at_k": graph_time_us(
            lambda: _cuda.launch_build(tree, scratch, x, roots, prefix, budget, k, 1), replays
        ),
        "select_at_k": graph_time_us(
            lambda: _cuda.launch_build(tree, scratch, x, roots, prefix, budget, k, 2), replays
        ),
        "stats_at_k": selection_stats(tree, scratch, x, roots, prefix, budget, k),
    }


def parts_columns(tree, x, k: int, replays: int) -> dict:
    """Stage 1 as partials (`ddtree._partials`: parts of a size that fills the GPU, their
    sums, the merge), timed like the stages, and whether it equals the row kernel's."""
    bs, depth, vocab = x.shape
    chunk = _partials.chunk_for(vocab, k, bs * depth, x.device)
    arrays = _partials.part_arrays(bs * depth, -(-vocab // chunk), k, x.device)
    out = _partials.merge_outputs(bs * depth, k, x.device)

    def run():
        _partials.parts(x, chunk, arrays, "parts")
        _partials.parts(x, chunk, arrays, "sums")
        _partials.merge(arrays, out)

    us = graph_time_us(run, replays)
    same = torch.equal(out[0].view(torch.int32), tree.topk_logprobs.flatten(0, 1).view(torch.int32))
    same = same and torch.equal(out[1], tree.topk_ids.flatten(0, 1))
    return {"parts": us, "parts_chunk": chunk, "parts_match": same}


def bench_one(bs, budget, depth, vocab, replays, seed, uno=None, shift=0.0) -> dict:
    dev = torch.device("cuda")
    x = peaked_logits(bs, depth, vocab, seed, dev, shift)
    roots = torch.randint(0, vocab, (bs,), device=dev)
    prefix = torch.randint(0, 4000, (bs,), device=dev)
    stepper = Stepper(max_batch=bs, budget=budget, depth=depth, vocab=vocab, device=dev)
    stepper.step(x, roots, prefix)
    k = min(budget, vocab)
    tree = stepper.step(x, roots, prefix)
    scratch = {n: t[: bs * depth] for n, t in stepper._scratch.items()}
    row = {"bs": bs, "B": budget, "precise": precise_share(x)}
    for name, bits in STAGES:
        row[name] = graph_time_us(
            lambda bits=bits: _cuda.launch_build(tree, scratch, x, roots, prefix, budget, k, bits),
            replays,
        )
    row.update(parts_columns(tree, x, k, replays))
    row.update(uno_columns(uno, tree, scratch, x, roots, prefix, budget, replays))
    row["stats"] = selection_stats(tree, scratch, x, roots, prefix, budget, k)
    row["stage1"] = stage1_clocks(tree, scratch, x, roots, prefix, budget, k)
    row["host_step"] = host_step_us(stepper, x, roots, prefix, 200)
    xf = x.float()
    row["torch_topk_lse"] = eager_time_us(
        lambda: (torch.topk(xf, k, dim=-1), torch.logsumexp(xf, dim=-1)), 20
    )
    row["seed_cpu"] = statistics.median(
        seed_cpu_path_us(x, roots, prefix, budget) for _ in range(2)
    )
    x_host, roots_h, prefix_h = x.cpu(), roots.cpu(), prefix.cpu()
    row["rust_cpu"], cpu_tree = rust_cpu_us(x_host, roots_h, prefix_h, budget)
    gpu = stepper.step(x, roots, prefix)
    row["match"] = bool(
        torch.equal(gpu.topk_ids.cpu(), cpu_tree.topk_ids)
        and torch.equal(gpu.num_nodes.cpu(), cpu_tree.num_nodes)
    )
    row["exact"] = bool(torch.equal(gpu.verify_ids.cpu(), cpu_tree.verify_ids))
    stepper.close()
    return row


COLUMNS = (
    ("bs", "bs", "{:>4}"),
    ("B", "B", "{:>5}"),
    ("precise", "precise rows", "{:>12.0%}"),
    ("candidates", "cand µs", "{:>8.1f}"),
    ("candidates_one_block", "cand 1 block/row µs", "{:>19.1f}"),
    ("parts", "parts µs", "{:>8.1f}"),
    ("parts_chunk", "part", "{:>6}"),
    ("parts_match", "== cand", "{!s:>7}"),
    ("select", "select µs", "{:>9.1f}"),
    ("select_parallel", "parallel µs", "{:>11.1f}"),
    ("select_best_first", "best-first µs", "{:>13.1f}"),
    ("x_parallel", "best-first / parallel", "{:>21.1f}x"),
    ("emit", "emit µs", "{:>8.1f}"),
    ("build", "build µs", "{:>9.1f}"),
    ("host_step", "host/step µs", "{:>12.1f}"),
    ("torch_topk_lse", "torch topk+lse µs", "{:>17.1f}"),
    ("seed_cpu", "SGLang CPU path µs", "{:>18.0f}"),
    ("rust_cpu", "Rust CPU µs", "{:>11.0f}"),
    ("x_seed", "CPU path / build", "{:>16.0f}x"),
    ("x_rust", "Rust CPU / build", "{:>16.1f}x"),
    ("x_torch", "torch / cand", "{:>12.2f}x"),
    ("match", "== CPU", "{!s:>6}"),
    ("uno_k", "UNO K", "{:>5}"),
    ("uno", "UNO µs", "{:>8.1f}"),
    ("uno_topk", "its top-k µs", "{:>12.1f}"),
    ("build_at_k", "build@K µs", "{:>10.1f}"),
    ("cand_at_k", "cand@K µs", "{:>9.1f}"),
    ("select_at_k", "select@K µs", "{:>11.1f}"),
    ("x_uno", "UNO−top-k / build@K", "{:>19.2f}x"),
    ("read_floor", "read µs", "{:>7.1f}"),
    ("x_uno_floor", "UNO−top-k+read / build@K", "{:>24.2f}x"),
    ("x_uno_own", "UNO / build@K", "{:>13.2f}x"),
    ("uno_topk_same", "top-k == torch", "{!s:>14}"),
)


def cell(r: dict, key: str, fmt: str) -> str:
    """A formatted value, or a dash right-aligned to the header's width where the row has
    none (no UNO column for shapes over its limits)."""
    return fmt.format(r[key]) if key in r else "-".rjust(len(fmt.format(0)))


def print_table(rows) -> None:
    print(" | ".join(h for _, h, _ in COLUMNS))
    for r in rows:
        r = dict(
            r,
            x_seed=r["seed_cpu"] / r["build"],
            x_rust=r["rust_cpu"] / r["build"],
            x_torch=r["torch_topk_lse"] / r["candidates"],
            x_parallel=r["select_best_first"] / r["select_parallel"],
            match=r["match"] and r["exact"],
        )
        if "uno" in r:
            r["x_uno"] = (r["uno"] - r["uno_topk"]) / r["build_at_k"]
            # UNO with a top-k that costs only its read
            r["x_uno_floor"] = (r["uno"] - r["uno_topk"] + r["read_floor"]) / r["build_at_k"]
            if r.get("uno_own_topk"):  # UNO's whole time is its own only with flashinfer's top-k
                r["x_uno_own"] = r["uno"] / r["build_at_k"]
        print(" | ".join(cell(r, key, fmt) for key, _, fmt in COLUMNS))
    print("\n# selection diagnostics (batch means; cycles are thread 0's clock64 per phase)")
    print("bs | B | " + " | ".join(STAT_NAMES))
    for r in rows:
        cells = [f"{r['stats'][n]:.{2 if n == 'parallel' else 0}f}" for n in STAT_NAMES]
        print(f"{r['bs']} | {r['B']} | " + " | ".join(cells))
        if "stats_at_k" in r:  # the same at UNO's K (build@K)
            at_k = r["stats_at_k"]
            cells = [f"{at_k[n]:.{2 if n == 'parallel' else 0}f}" for n in STAT_NAMES]
            print(f"{r['bs']} | {r['B']} (K = {r['uno_k']}) | " + " | ".join(cells))
    print_stage1_phases(rows)


def check_limits(p: argparse.ArgumentParser, budgets, depth: int) -> None:
    """The Stepper's CUDA limits as argument errors, before any GPU work (else a traceback
    mid-run); a single ``budgets`` value may be given as an int."""
    for budget in budgets if isinstance(budgets, list) else [budgets]:
        if not 1 <= budget <= _core.CUDA_MAX_BUDGET:
            p.error(f"--budget must be in 1..{_core.CUDA_MAX_BUDGET} on CUDA, got {budget}")
    if not 1 <= depth <= _core.CUDA_MAX_DEPTH:
        p.error(f"--depth must be in 1..{_core.CUDA_MAX_DEPTH} on CUDA, got {depth}")


def load_uno(p: argparse.ArgumentParser, path: str | None, topk_lib: str | None = None):
    """`bench_uno.load`, and the header line that says what UNO the run has: a --uno file
    that cannot be loaded is an argument error; one found on its own (an installed sglang
    of another release, a broken flashinfer) is reported and the UNO columns left out."""
    if path == "none":
        print("# UNO: left out (--uno none)")
        return None
    try:
        uno = bench_uno.load(path, topk_lib)
    except bench_uno.TopKLibraryError as e:
        p.error(f"--uno-topk: {e}")
    except (ImportError, AttributeError, OSError, SyntaxError, ValueError) as e:
        if path or os.environ.get("DDTREE_SGLANG_WHEEL"):
            p.error(f"--uno: {e}")
        print(f"# UNO: could not load it ({type(e).__name__}: {e}); no UNO columns")
        return None
    if uno is None:
        print("# UNO: not found (--uno PATH, $DDTREE_SGLANG_WHEEL or an installed sglang)")
    else:
        print(f"# UNO: {uno.source}; its top-k: {uno.topk_name}; UNO−top-k / build@K is UNO's "
              "time without its top-k over ddtree's whole build with the same K")  # fmt: skip
        print(
            "# UNO−top-k+read / build@K: the same with a top-k that costs only one read of the "
            "logits (read µs: torch.amax over each row), the least a top-k pass can cost"
        )
        if uno.own_topk:
            print("# UNO / build@K: UNO's whole build, its own top-k included, over ddtree's")
    return uno


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ddtree bench --device cuda",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    p.add_argument("--bs", type=int, nargs="+", default=[1, 8, 64], help="batch sizes")
    p.add_argument("--budget", type=int, nargs="+", default=[63, 255, 1023], help="budgets B")
    p.add_argument("--depth", type=int, default=15, help="depth limit L")
    p.add_argument("--vocab", type=int, default=151936, help="vocabulary V")
    p.add_argument(
        "--replays", type=int, default=200, help="timed graph replays, their median reported"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic logits")
    p.add_argument(
        "--shift",
        type=float,
        default=0.0,
        help="added to every logit: the same trees, another Z (unshifted, every row is in the "
        "normaliser's absolute grade; 30 or -20 put every row in its fast or precise grade)",
    )
    p.add_argument(
        "--uno",
        metavar="PATH",
        help="SGLang 0.5.23's uno_tree.py or an sglang wheel (default: $DDTREE_SGLANG_WHEEL, "
        "else an installed sglang; 'none' leaves the UNO columns out)",
    )
    p.add_argument(
        "--uno-topk",
        metavar="LIB",
        help="without flashinfer installed: UNO's top-k from this build of flashinfer's radix "
        "top-k (tests/flashinfer_topk/build.sh; default: $DDTREE_FLASHINFER_TOPK, else "
        "torch.topk stands in)",
    )
    args, _ = p.parse_known_args(argv)
    check_limits(p, args.budget, args.depth)
    if not torch.cuda.is_available():
        print("bench --device cuda: no CUDA device here", file=sys.stderr)
        return 2
    print(
        f"# ddtree GPU bench, {datetime.datetime.now().isoformat(timespec='seconds')}, "
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"host {platform.processor() or platform.machine()}"
    )
    print(
        f"# L={args.depth} V={args.vocab} bf16 logits; GPU times: median of {args.replays} "
        f"graph replays (CUDA events); command: {' '.join(sys.argv)}"
    )
    uno = load_uno(p, args.uno, args.uno_topk)
    rows = []
    for bs in args.bs:
        for budget in args.budget:
            print(f"... bs={bs} B={budget}", file=sys.stderr, flush=True)
            rows.append(
                bench_one(
                    bs, budget, args.depth, args.vocab, args.replays, args.seed, uno, args.shift
                )
            )
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
