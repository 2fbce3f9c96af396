"""``python -m ddtree bench --loop``: the seed's experiment — a synthetic DDTree decode loop
on the GPU in four modes, measured in one run, to show where the GPU waits for the host.

Per round: a draft forward and a verify forward stood in for by bf16 GEMMs of a chosen GPU
time (``--draft-ms``, ``--verify-ms``), draft logits drawn from a pool of DFlash-like rows,
and target logits that accept each request's first-child chain down to a random depth of
3–7 (so 4–8 tokens per round, like DFlash). Modes:

1. ``cpu``: what SGLang does today — torch top-K + logsumexp, copy to host, a Python heap
   and verify inputs per request, copy back; after verify, argmax on the GPU, ``.cpu()``,
   a host walk, the bonus copied back;
2. ``eager``: ``Stepper.step()`` and ``Stepper.accept()`` between the forwards, the
   acceptance read back one round late with ``Stepper.readback()``;
3. ``graph``: the whole round (draft, build, verify, accept, readback copy) as one CUDA
   graph, replayed with ``Stepper.replay``;
4. ``caller``: the same round captured in the caller's own ``torch.cuda.graph`` and
   replayed with ``graph.replay()``, as SGLang's CUDA-graph runner does (the readback ring's
   cursor lives on the device, so these replays read back too).

Per mode: wall time per round, GPU busy time per round and the GPU idle fraction (union of
kernel and copy intervals from the torch profiler over ``--profile-rounds`` steady rounds,
after one that starts the queue), the part of that idle next to ddtree's own work, host
syncs per round (torch's sync-debug warnings), and how far the host runs ahead (rounds
enqueued but not finished when the host finishes enqueuing one). ``--plot FILE.png`` draws
GPU busy vs idle over time for the modes (matplotlib; without it, the intervals are
written to FILE.json and ``--plot-from FILE.json --plot FILE.png`` draws them elsewhere).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
import warnings
from functools import partial

import numpy as np
import torch

from . import reference
from ._api import accept_tree
from .bench import HelpFormatter, add_round_shape
from .bench_gpu import check_limits, graph_time_us, peaked_logits
from .stepper import Stepper

MODES = ("cpu", "eager", "graph", "caller")
AHEAD = 2  # rounds the host may run ahead before it waits on an older round's event


class Model:
    """GEMM stand-ins of the draft and verify forwards, and the synthetic logits."""

    def __init__(self, args, dev):
        self.args = args
        self.dev = dev
        n = 4096
        self.a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        self.b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        self.c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
        per = self._gemm_ms()
        self.draft_reps = max(1, round(args.draft_ms / per))
        self.verify_reps = max(1, round(args.verify_ms / per))
        bs, depth, vocab, q = args.bs, args.depth, args.vocab, args.budget + 1
        self.pool = [peaked_logits(bs, depth, vocab, seed, dev) for seed in range(4)]
        self.x = torch.empty_like(self.pool[0])
        g = torch.Generator(device=dev).manual_seed(1)
        self.depth_pool = torch.randint(3, 8, (16, bs), device=dev, generator=g)
        self.accept_depth = torch.empty(bs, dtype=torch.int64, device=dev)
        self.noise_tokens = torch.randint(0, vocab, (bs, q), device=dev, generator=g)
        self.target = torch.randn(bs, q, vocab, device=dev, generator=g).to(torch.bfloat16)
        self.flat = self.target.view(-1)
        self.peak_at = torch.zeros(bs * q, dtype=torch.int64, device=dev)
        self.peak_was = self.flat[self.peak_at].clone()
        self.row_base = torch.arange(bs * q, device=dev).view(bs, q) * vocab

    def _gemm_ms(self) -> float:
        for _ in range(3):
            torch.matmul(self.a, self.b, out=self.c)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            torch.matmul(self.a, self.b, out=self.c)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 10

    def feed(self, r: int) -> None:
        """This round's inputs: a pool entry of draft logits and the acceptance depths,
        written by elementwise kernels as the draft's own kernels would write them (a
        device-to-device memcpy runs on a copy engine, and the switch back to kernels left
        a 50-140 µs gap at every round boundary that belongs to no real decode loop)."""
        torch.mul(self.pool[r % len(self.pool)], 1, out=self.x)
        torch.mul(self.depth_pool[r % len(self.depth_pool)], 1, out=self.accept_depth)

    def draft(self) -> None:
        for _ in range(self.draft_reps):
            torch.matmul(self.a, self.b, out=self.c)

    def verify(self, verify_ids, first_child, depths) -> torch.Tensor:
        """The verify GEMMs, then target logits whose argmax at each node is its first
        child's token above the round's acceptance depth (noise below): the walk accepts
        the first-child chain. Touches only [bs, Q] entries of the static logits."""
        for _ in range(self.verify_reps):
            torch.matmul(self.a, self.b, out=self.c)
        self.flat.index_copy_(0, self.peak_at, self.peak_was)  # undo the last round's peaks
        child = first_child.clamp(min=0)
        follow = (first_child >= 0) & (depths < self.accept_depth.unsqueeze(1))
        tokens = torch.where(follow, torch.gather(verify_ids, 1, child), self.noise_tokens)
        self.peak_at.copy_((self.row_base + tokens).view(-1))
        self.peak_was.copy_(self.flat[self.peak_at])
        self.flat.index_fill_(0, self.peak_at, 30.0)
        return self.target


class LoopState:
    """Roots and prefix lengths carried from round to round on the device."""

    def __init__(self, bs, vocab, dev):
        self.roots = torch.randint(0, vocab, (bs,), device=dev)
        self.prefix = torch.full((bs,), 100, dtype=torch.int64, device=dev)


def verify_of(model: Model):
    return lambda tree: model.verify(tree.verify_ids, tree.first_child, tree.depths)


def advance(st: LoopState):
    """Next round's roots and prefix lengths, on the device."""

    def after(tree, acc):
        st.prefix.add_(acc.accept_len)
        st.roots.copy_(acc.bonus)

    return after


def stepper_round(model: Model, stepper: Stepper, st: LoopState) -> None:
    """Mode 2: draft, build, verify, accept (+ readback copy), next roots."""
    model.draft()
    tree = stepper.step(model.x, st.roots, st.prefix)
    acc = stepper.accept(verify_of(model)(tree))
    advance(st)(tree, acc)


def cpu_round(model: Model, st: LoopState, budget: int) -> None:
    """Mode 1: SGLang's CPU path around the same forwards."""
    model.draft()
    dev = model.x.device
    k = min(budget, model.x.shape[2])
    xf = model.x.float()
    top = torch.topk(xf, k, dim=-1)
    lp = (top.values - torch.logsumexp(xf, dim=-1, keepdim=True)).cpu().numpy()
    ids = top.indices.cpu().numpy()
    roots, prefix = st.roots.tolist(), st.prefix.tolist()
    trees = []
    for b in range(len(roots)):
        nodes = reference.select(lp[b], np.isfinite(lp[b]).sum(axis=1), budget)
        trees.append(reference.emit(nodes, ids[b], roots[b], prefix[b], budget))
    host = {key: np.stack([t[key] for t in trees]) for key in trees[0]}
    verify_ids = torch.from_numpy(host["verify_ids"]).to(dev)
    first_child = torch.from_numpy(host["first_child"]).to(dev)
    depths = torch.from_numpy(host["depths"]).to(dev)
    torch.from_numpy(host["positions"]).to(dev)  # the verify inputs SGLang copies back
    torch.from_numpy(host["parents"]).to(dev)
    target = model.verify(verify_ids, first_child, depths)
    posterior = target.argmax(dim=-1).cpu().numpy()
    bonus, lens = [], []
    for b, t in enumerate(trees):
        node, n = 0, 1
        while True:
            want, child = posterior[b, node], t["first_child"][node]
            while child >= 0 and t["verify_ids"][child] != want:
                child = t["next_sibling"][child]
            if child < 0 or n == model.x.shape[1] + 1:
                break
            node, n = child, n + 1
        bonus.append(int(posterior[b, node]))
        lens.append(n)
    st.roots.copy_(torch.tensor(bonus))
    st.prefix.add_(torch.tensor(lens).to(dev))


def make_runner(mode: str, model: Model, args, dev):
    """One round of `mode` as a callable, and the Stepper (None in mode 1)."""
    st = LoopState(args.bs, args.vocab, dev)
    if mode == "cpu":
        return (lambda: cpu_round(model, st, args.budget)), None
    stepper = Stepper(args.bs, args.budget, args.depth, args.vocab, device=dev)
    if mode == "eager":
        return (lambda: stepper_round(model, stepper, st)), stepper
    if mode == "caller":
        stepper_round(model, stepper, st)  # warm-up outside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            stepper_round(model, stepper, st)
        return graph.replay, stepper
    stepper.capture(
        model.x, st.roots, st.prefix, verify_of(model), before=model.draft, after=advance(st)
    )
    return (lambda: stepper.replay(args.bs)), stepper


def timed_rounds(run, model: Model, stepper, rounds: int) -> dict:
    """Wall time per round, host syncs per round, rounds in flight, readbacks seen."""
    ends, ahead, readbacks = [], [], 0
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        for r in range(rounds):
            model.feed(r)
            run()
            end = torch.cuda.Event()
            end.record()
            ends.append(end)
            ahead.append(sum(not e.query() for e in ends[-AHEAD - 2 :]))
            if stepper is not None and stepper.readback() is not None:
                readbacks += 1
            if len(ends) > AHEAD:
                ends[-AHEAD - 1].synchronize()  # bound the host's lead, as a scheduler would
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    torch.cuda.set_sync_debug_mode("default")
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    return {
        "wall_ms": wall / rounds * 1e3,
        "syncs": syncs / rounds,
        "ahead": statistics.mean(ahead),
        "readbacks": readbacks / rounds,
    }


MARKER = "spin_kernel"  # torch.cuda._sleep's kernel: marks where each profiled round starts


def gpu_intervals(run, model: Model, rounds: int, names: list | None = None) -> list:
    """(start, end) µs of every kernel, copy and fill over `rounds` steady rounds (torch
    profiler); with `names`, also (start, end, name) triples appended to it. One more round
    runs first and is left out: it starts from an idle GPU, so the host's first launches
    show as idle that a running loop, queued rounds ahead, does not have."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for r in range(rounds + 1):
            torch.cuda._sleep(1)
            model.feed(r)
            run()
        torch.cuda.synchronize()
    named = sorted(
        (float(e.time_range.start), float(e.time_range.end), e.name)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0
    )
    starts = [s for s, _, name in named if MARKER in name]
    steady = [t for t in named if len(starts) < 2 or t[0] >= starts[1]]
    if names is not None:
        names.extend(steady)
    return [(s, e) for s, e, _ in steady]


def idle_gaps(named: list) -> list[tuple[float, str, str]]:
    """Every idle gap of a (start, end, name) timeline: (µs, the work before, the work after)."""
    named = sorted(named)
    gaps, end, before = [], named[0][1], named[0][2]
    for s, e, name in named[1:]:
        if s > end:
            gaps.append((s - end, before, name))
        if e >= end:
            end, before = e, name
    return gaps


def ddtree_idle_us(named: list, rounds: int) -> float:
    """Idle µs per round in gaps next to ddtree's own work (its kernels and readback
    copies); the rest of the idle lies between the stand-in model's kernels."""
    ours = ("ddtree_", "Memcpy DtoH")
    gaps = idle_gaps(named)
    return sum(g for g, a, b in gaps if any(m in a or m in b for m in ours)) / rounds


def largest_gaps(named: list, count: int = 5) -> list[tuple[float, str, str]]:
    """The `count` longest idle gaps: (µs, the work before, the work after)."""
    return [(g, a[:40], b[:40]) for g, a, b in sorted(idle_gaps(named), reverse=True)[:count]]


def busy_stats(intervals, rounds: int) -> dict:
    """GPU busy time per round and idle fraction over the span of the GPU activity."""
    if not intervals:
        return {"busy_ms": float("nan"), "idle": float("nan"), "span_ms": float("nan")}
    busy, cur_s, cur_e = 0.0, *intervals[0]
    for s, e in intervals[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = intervals[-1][1] - intervals[0][0]
    return {"busy_ms": busy / rounds / 1e3, "idle": 1 - busy / span, "span_ms": span / 1e3}


def plot(timelines: dict, path: str) -> None:
    """GPU busy (bars) vs idle (gaps) over time, one row per mode."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        dump = path.rsplit(".", 1)[0] + ".json"
        with open(dump, "w") as f:
            json.dump(timelines, f)
        print(f"# no matplotlib here: intervals written to {dump} (draw with --plot-from)")
        return
    fig, axes = plt.subplots(len(timelines), 1, figsize=(12, 1.6 * len(timelines)), sharex=True)
    for ax, (mode, spans) in zip(np.atleast_1d(axes), timelines.items(), strict=True):
        t0 = spans[0][0] if spans else 0.0
        bars = [((s - t0) / 1e3, (e - s) / 1e3) for s, e in spans]
        ax.broken_barh(bars, (0, 1), facecolors="tab:green")
        ax.set_yticks([])
        ax.set_ylabel(mode, rotation=0, ha="right", va="center")
        ax.set_facecolor("#f3d9d9")  # idle shows as the background
    np.atleast_1d(axes)[-1].set_xlabel("ms (green: GPU busy; red: GPU idle)")
    fig.suptitle("DDTree decode loop: GPU busy vs idle per mode")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"# plot written to {path}")


def round_kernel_times(model: Model, args, dev) -> dict:
    """GPU µs of stages 4–5 alone at this shape (median of graph replays): the greedy and
    two sampling accepts over this round's target, kept slots, compaction of 8 layers' K and
    V caches ([slots, 8, 128] bf16), the gather of [bs*Q, 4096] bf16 hidden states, all of
    greedy stages 4–5 in one graph, and the floor: a graph of one trivial kernel."""
    st = LoopState(args.bs, args.vocab, dev)
    stepper = Stepper(args.bs, args.budget, args.depth, args.vocab, device=dev)
    model.feed(0)
    tree = stepper.step(model.x, st.roots, st.prefix)
    target = model.verify(tree.verify_ids, tree.first_child, tree.depths)
    acc = stepper.accept(target)
    q = args.budget + 1
    slots = args.bs * q
    window = torch.randperm(slots, device=dev).view(args.bs, q)
    stepper.register_caches(
        [torch.zeros(slots, 8, 128, dtype=torch.bfloat16, device=dev) for _ in range(16)]
    )
    hidden = torch.zeros(slots, 4096, dtype=torch.bfloat16, device=dev)
    out = torch.empty(args.bs, args.depth + 1, 4096, dtype=torch.bfloat16, device=dev)

    def stages_4_5():
        stepper.accept(target)
        stepper.kept_slots(window)
        stepper.compact_kv(window)
        stepper.gather_hidden(hidden, out)

    times = {
        "accept_greedy": graph_time_us(lambda: stepper.accept(target), 50),
        "accept_sampled": graph_time_us(
            lambda: stepper.accept(target, temperature=0.8, top_k=50, top_p=0.9), 20
        ),
        "accept_temp_only": graph_time_us(lambda: stepper.accept(target, temperature=0.8), 20),
        "kept_slots": graph_time_us(lambda: stepper.kept_slots(window), 50),
        "compact_8_layers": graph_time_us(lambda: stepper.compact_kv(window), 50),
        "gather_hidden": graph_time_us(lambda: stepper.gather_hidden(hidden, out), 50),
        "stages_4_5_greedy": graph_time_us(stages_4_5, 50),
        "graph_floor": graph_time_us(lambda: st.roots.add_(0), 50),
    }
    times["mean_accept_len"] = float(acc.accept_len.double().mean())
    return times


ACCEPT_MODES = {
    "greedy": {},
    "T=0.8": {"temperature": 0.8},
    "T=0.8 top_k=50": {"temperature": 0.8, "top_k": 50},
    "T=0.8 top_p=0.9": {"temperature": 0.8, "top_p": 0.9},
    "T=0.8 top_k=50 top_p=0.9": {"temperature": 0.8, "top_k": 50, "top_p": 0.9},
}


def accept_times(model: Model, args, dev) -> list[dict]:
    """GPU µs of one accept (median of graph replays) per batch size, sampling mode and
    target: the loop's ("one peak": each row one token at 30 over N(0, 1), so only the
    peak is within 27 nats of the maximum at T=0.8) and "noisy" rows (N(0, 2) with a few
    strong tokens, bench_gpu's draft rows: most of the vocabulary is near the maximum)."""
    st = LoopState(args.bs, args.vocab, dev)
    stepper = Stepper(args.bs, args.budget, args.depth, args.vocab, device=dev)
    model.feed(0)
    tree = stepper.step(model.x, st.roots, st.prefix)
    peak = model.verify(tree.verify_ids, tree.first_child, tree.depths).clone()
    noisy = peaked_logits(args.bs, args.budget + 1, args.vocab, 9, dev)
    rows = []
    for target_name, target in (("one peak", peak), ("noisy", noisy)):
        for bs in sorted({1, 8, args.bs}):
            sub = type(tree)(**{k: getattr(tree, k)[:bs] for k in tree.__dataclass_fields__})
            rows_of = target[:bs]
            row = {"target": target_name, "bs": bs}
            for mode, kw in ACCEPT_MODES.items():
                fn = partial(accept_tree, sub, rows_of, **kw)
                row[mode] = (graph_time_us(fn, 20), kernel_us(fn, "ddtree_accept_"))
            rows.append(row)
    return rows


def kernel_us(fn, name: str, calls: int = 5) -> float:
    """Median duration of the kernels whose name contains `name`, over eager calls of fn
    (torch profiler): the kernel alone, without the graph's other nodes."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times = [
        e.time_range.elapsed_us()
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and name in e.name
    ]
    return statistics.median(times) if times else float("nan")


def print_accept_times(rows) -> None:
    print(
        "\n# stage 4 (accept) alone, GPU µs per call: median graph replay (the accept "
        "kernel alone, profiler)"
    )
    print("target | bs | " + " | ".join(ACCEPT_MODES))
    for r in rows:
        cells = " | ".join(f"{r[m][0]:.1f} ({r[m][1]:.1f})" for m in ACCEPT_MODES)
        print(f"{r['target']} | {r['bs']} | {cells}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ddtree bench --loop",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    add_round_shape(p)
    p.add_argument("--rounds", type=int, default=200, help="timed rounds of each GPU mode")
    p.add_argument("--cpu-rounds", type=int, default=20, help="timed rounds of mode cpu, slow")
    p.add_argument(
        "--profile-rounds",
        type=int,
        default=5,
        help="steady rounds the profiler measures GPU busy/idle time over",
    )
    p.add_argument(
        "--draft-ms",
        type=float,
        default=2.0,
        help="GPU ms of the GEMMs standing in for the draft forward",
    )
    p.add_argument(
        "--verify-ms",
        type=float,
        default=8.0,
        help="GPU ms of the GEMMs standing in for the verify forward",
    )
    p.add_argument(
        "--modes",
        nargs="*",
        default=list(MODES),
        choices=MODES,
        help="loop modes to run; none (a bare --modes) runs only the stage 4-5 timings",
    )
    p.add_argument("--plot", default=None, help="write the busy/idle timeline PNG here")
    p.add_argument("--plot-from", default=None, help="draw --plot from a saved JSON")
    return p


def parse(argv):
    p = parser()
    args, _ = p.parse_known_args(argv)
    if args.plot_from is None:  # drawing a saved timeline runs nothing
        check_limits(p, args.budget, args.depth)
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.plot_from:
        with open(args.plot_from) as f:
            plot(json.load(f), args.plot or args.plot_from.rsplit(".", 1)[0] + ".png")
        return 0
    if not torch.cuda.is_available():
        print("bench --loop: no CUDA device here", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    model = Model(args, dev)
    print(
        f"# ddtree decode loop, {datetime.datetime.now().isoformat(timespec='seconds')}, "
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; bs={args.bs} "
        f"B={args.budget} L={args.depth} V={args.vocab}; draft {model.draft_reps} GEMMs "
        f"(~{args.draft_ms} ms), verify {model.verify_reps} GEMMs (~{args.verify_ms} ms); "
        f"command: {' '.join(sys.argv)}"
    )
    rows, timelines = [], {}
    for mode in args.modes:
        print(f"... {mode}", file=sys.stderr, flush=True)
        run, stepper = make_runner(mode, model, args, dev)
        rounds = args.cpu_rounds if mode == "cpu" else args.rounds
        row = {"mode": mode, "rounds": rounds, **timed_rounds(run, model, stepper, rounds)}
        named = []
        spans = gpu_intervals(run, model, args.profile_rounds, named)
        row.update(busy_stats(spans, args.profile_rounds))
        row["gaps"] = largest_gaps(named)
        row["ddtree_idle_us"] = ddtree_idle_us(named, args.profile_rounds)
        rows.append(row)
        timelines[mode] = spans
    if rows:
        print_rows(rows)
        print("\n# idle per round in gaps next to ddtree's kernels and readback copies, µs")
        print(" | ".join(f"{r['mode']}: {r['ddtree_idle_us']:.1f}" for r in rows))
        print("\n# longest idle gaps over the profiled rounds: µs, after, before")
        for r in rows:
            for gap, before, after in r["gaps"]:
                print(f"{r['mode']} | {gap:.1f} | {before} | {after}")
    times = round_kernel_times(model, args, dev)
    print("\n# stages 4-5 alone at this shape, GPU µs (median of graph replays)")
    print(" | ".join(times))
    print(" | ".join(f"{v:.1f}" for v in times.values()))
    print_accept_times(accept_times(model, args, dev))
    if args.plot and timelines:
        plot(timelines, args.plot)
    return 0


def print_rows(rows) -> None:
    print(
        "mode | rounds | wall ms/round | GPU busy ms/round | GPU idle | host syncs/round | "
        "rounds in flight | readbacks ready/round"
    )
    for r in rows:
        print(
            f"{r['mode']:>5} | {r['rounds']:>6} | {r['wall_ms']:>13.2f} | {r['busy_ms']:>17.2f} | "
            f"{r['idle'] * 100:>7.1f}% | {r['syncs']:>16.1f} | {r['ahead']:>16.2f} | "
            f"{r['readbacks']:>21.2f}"
        )


if __name__ == "__main__":
    sys.exit(main())
