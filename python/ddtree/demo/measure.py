"""What the demo measures beside its timings: where a decoder's tokens first part from plain
greedy's (and how near a tie greedy's choice was there), and the GPU idle fraction of a
DDTree decode, from a torch profiler trace.

The idle fraction comes from a separate, untimed decode: the demo's `Timer` synchronises
the device around each stage to split a round's time, and those syncs would add idle time of
their own.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable

import torch

# Chrome-trace categories of the torch profiler's device work: kernels, copies, fills.
GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


def first_divergence(greedy_ids, other_ids, margins) -> dict | None:
    """Where `other_ids` first differs from `greedy_ids` (one prompt's generated tokens):
    the index, both tokens and greedy's top-1 minus top-2 logit there; None if they agree.
    A sequence that ends first differs at its end (its token there is None)."""
    for i in range(max(len(greedy_ids), len(other_ids))):
        a = greedy_ids[i] if i < len(greedy_ids) else None
        b = other_ids[i] if i < len(other_ids) else None
        if a != b:
            margin = margins[i] if i < len(margins) else None
            return {"index": i, "greedy_token": a, "other_token": b, "greedy_margin": margin}
    return None


def trace_intervals(trace: dict, categories=GPU_WORK) -> list[tuple[float, float, str]]:
    """(start, end, name) in µs of every complete event of `categories` (by default the
    kernels, copies and fills) in a chrome trace (the torch profiler's export), by start."""
    return sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e.get("name", ""))
        for e in trace.get("traceEvents", [])
        if e.get("ph") == "X" and e.get("cat") in categories
    )


def from_marker(named: list, marker: str) -> tuple[list[tuple[float, float]], bool]:
    """The (start, end) intervals from the first one whose name holds `marker` on, and
    whether the marker was found (if not: all of them)."""
    starts = [s for s, _, name in named if marker in name]
    if not starts:
        return [(s, e) for s, e, _ in named], False
    return [(s, e) for s, e, _ in named if s >= starts[0]], True


def stage_split(named: list, stages: tuple) -> dict:
    """Milliseconds per round of each stage, from the trace of a decode whose rounds put a
    marker kernel before every stage (`named`: trace_intervals' (start, end, name) list).
    A stage runs from the end of its marker to the start of the next one (the last stage of
    the last round: to the last device work), so host time inside a round (a host tree
    build) counts in its stage, as idle device time."""
    from ddtree.bench_loop import MARKER

    marks = [(s, e) for s, e, name in named if MARKER in name]
    if not marks:
        return {}
    end = max(e for _, e, _ in named)
    starts = [s for s, _ in marks[1:]] + [end]
    totals = [0.0] * len(stages)
    for i, ((_, after), nxt) in enumerate(zip(marks, starts, strict=True)):
        totals[i % len(stages)] += nxt - after
    rounds = max(len(marks) // len(stages), 1)
    return {stage: t / rounds / 1e3 for stage, t in zip(stages, totals, strict=True)}


def profiled_trace(fn: Callable, with_cpu: bool = False):
    """Run `fn()` under the torch profiler; returns (fn's result, chrome trace). Device
    activity only by default: recording every host op too slows the host down, which
    shows as idle GPU time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if with_cpu else [])
    torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        out = fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            return out, json.load(f)


def kernel_table(named: list, rounds: int, top: int = 15) -> list[dict]:
    """The `top` kernels by device time: name (shortened), calls and µs per round."""
    from ddtree.bench_loop import MARKER

    total: dict[str, list] = {}
    for s, e, name in named:
        if MARKER in name:
            continue
        t = total.setdefault(name[:90], [0, 0.0])
        t[0] += 1
        t[1] += e - s
    rows = sorted(total.items(), key=lambda kv: -kv[1][1])[:top]
    r = max(rounds, 1)
    return [{"kernel": k, "calls_per_round": c / r, "us_per_round": t / r} for k, (c, t) in rows]


def profiled_split(decode: Callable, stages: tuple) -> tuple[dict, list]:
    """`stage_split` and `kernel_table` of one profiled decode: `decode()` runs the rounds
    with a marker before each stage."""
    from ddtree.bench_loop import MARKER

    _, trace = profiled_trace(decode)
    named = trace_intervals(trace)
    marks = sum(MARKER in name for _, _, name in named)
    first = next((s for s, _, name in named if MARKER in name), None)
    rounds_only = [x for x in named if first is None or x[0] >= first]  # the prefill left out
    return stage_split(named, stages), kernel_table(rounds_only, marks // max(len(stages), 1))


def gpu_idle(decode: Callable) -> dict:
    """GPU idle fraction of one decode's rounds. `decode(on_decode_start)` runs the decode
    and calls `on_decode_start()` after its prefill; a tiny marker kernel enqueued there
    opens the window, which ends at the last device work, so the prefill (its one-request
    forwards and their syncs) is left out. Idle = 1 - busy / span over that window, busy being
    the union of the kernel, copy and fill intervals (bench_loop.busy_stats)."""
    from ddtree.bench_loop import MARKER, busy_stats

    def mark():
        torch.cuda._sleep(1)  # its kernel's name holds MARKER

    # Device activity alone has been seen to record no kernels on some setups; the decode
    # loop benchmark records host ops too. If the first trace has no device work, profile
    # again with host ops (more host overhead: the result says which).
    for with_cpu in (False, True):
        result, trace = profiled_trace(lambda: decode(mark), with_cpu)
        intervals, marked = from_marker(trace_intervals(trace), MARKER)
        if intervals:
            break
    # Per round the device ran: the host stops at the round where it sees every request
    # finished, but the rounds it had queued past that one run (and are traced) too.
    stats = busy_stats(intervals, max(result.rounds_run or result.rounds, 1))
    return {
        **stats,
        "rounds": result.rounds,
        "prefill_excluded": marked,
        "profiled": "cuda+cpu" if with_cpu else "cuda",
    }
