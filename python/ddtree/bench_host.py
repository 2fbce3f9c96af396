"""Host time per eager ``Stepper`` call on CUDA (``python -m ddtree bench --host``).

The GPU runs behind: each figure is the wall time the calling thread spends in one call
(argument checks, the Rust seam, the kernel launches), the median of ``--repeats`` runs of
``--calls`` back-to-back calls, the cases' runs interleaved (round-robin). The yardstick
measured in the same run is one small torch op launched with ``out=`` (the host cost of a
single PyTorch kernel launch): a call's ratio to it says how many bare launches its host
time is worth.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from .bench import HelpFormatter, add_round_shape
from .stepper import Stepper


def run_us(fn, calls: int) -> float:
    """Host µs per call of ``calls`` back-to-back calls; the queue drains afterwards."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()  # between runs, never inside one
    return us


def interleaved_us(cases: list, calls: int, repeats: int) -> list:
    """(name, median host µs per call) of each case, its ``repeats`` runs interleaved with
    the other cases' (round-robin), so a drift of the host's speed during the benchmark
    touches every case alike instead of whichever ran then."""
    for _, fn in cases:
        fn()  # warm: graphs built, caches filled
    torch.cuda.synchronize()
    runs = {name: [] for name, _ in cases}
    for _ in range(repeats):
        for name, fn in cases:
            runs[name].append(run_us(fn, calls))
    return [(name, statistics.median(runs[name])) for name, _ in cases]


def measure(bs: int, budget: int, depth: int, vocab: int, calls: int, repeats: int) -> list:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(bs, depth, vocab, device=dev, generator=g).to(torch.bfloat16)
    roots = torch.randint(0, vocab, (bs,), device=dev, generator=g)
    prefix = torch.randint(0, 4000, (bs,), device=dev, generator=g)
    stepper = Stepper(max_batch=bs, budget=budget, depth=depth, vocab=vocab, device=dev)
    tree = stepper.step(x, roots, prefix)
    target = torch.randn(bs, tree.width, vocab, device=dev, generator=g).to(torch.bfloat16)
    window = torch.arange(bs * tree.width, device=dev).view(bs, tree.width)
    temps = torch.full((bs,), 0.8, device=dev)
    ks = torch.full((bs,), 50, dtype=torch.int64, device=dev)
    ps = torch.full((bs,), 0.9, device=dev)
    a, b, c = (torch.ones(16, device=dev) for _ in range(3))
    cases = [
        ("torch.add(out=) [yardstick]", lambda: torch.add(a, b, out=c)),
        ("Stepper.step", lambda: stepper.step(x, roots, prefix)),
        ("Stepper.accept greedy", lambda: stepper.accept(target)),
        ("Stepper.accept greedy, no readback", lambda: stepper.accept(target, readback=False)),
        ("Stepper.accept T=0.8 (scalar)", lambda: stepper.accept(target, 0.8, readback=False)),
        ("Stepper.accept T tensor", lambda: stepper.accept(target, temps, readback=False)),
        (
            "Stepper.accept T, top_k, top_p tensors",
            lambda: stepper.accept(target, temps, ks, ps, readback=False),
        ),  # fmt: skip
        ("Stepper.kept_slots", lambda: stepper.kept_slots(window)),
        ("Stepper.readback() polled, nothing new", stepper.readback),
        # The newest slot copied out again; the queue is empty, so the wait is short.
        ("Stepper.readback(wait=True), GPU idle", lambda: stepper.readback(wait=True)),
    ]
    engine = getattr(stepper, "_engine", None)
    if engine is not None:  # the Rust seam alone: where a Stepper call's time goes
        stepper.step(x, roots, prefix)
        cases += [
            ("engine.step (no Python wrapper)", lambda: engine.step(x, roots, prefix)),
            (
                "engine.check_target (reads + checks, no launch)",
                lambda: engine.check_target(target),
            ),  # fmt: skip
            ("engine.accept greedy, no readback", lambda: engine.accept(target, False)),
            ("engine.publish (readback launch)", engine.publish),
        ]
    if engine is not None:  # the eager step's three launches without the engine's graph

        def plain_step():
            engine.eager_graphs = False
            stepper.step(x, roots, prefix)
            engine.eager_graphs = True

        cases.insert(2, ("Stepper.step, 3 plain launches (no graph)", plain_step))
    rows = interleaved_us(cases, calls, repeats)
    stepper.close()
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_round_shape(p)
    p.add_argument("--calls", type=int, default=200, help="back-to-back calls per timed run")
    p.add_argument(
        "--repeats", type=int, default=15, help="timed runs per case, their median reported"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ddtree bench --host", description=__doc__, formatter_class=HelpFormatter
    )
    add_arguments(p)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench --host: needs a CUDA GPU (host time of the CUDA path); none here")
        return 2
    rows = measure(args.bs, args.budget, args.depth, args.vocab, args.calls, args.repeats)
    floor = rows[0][1]
    print(
        f"# ddtree host bench, {time.strftime('%Y-%m-%dT%H:%M:%S')}, "
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bs={args.bs} "
        f"B={args.budget} L={args.depth} V={args.vocab}"
    )
    print("call | host µs | / torch op")
    print("---|---|---")
    for name, us in rows:
        print(f"{name} | {us:.1f} | {us / floor:.1f}")
    return 0
