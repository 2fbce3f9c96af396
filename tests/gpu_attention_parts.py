"""Where a tree attention call's time goes (BENCHMARKS.md): for one shape at several prefix
lengths, the call timed three ways after an L2 flush (eager with CUDA events, as ``bench
--attention`` times it; a CUDA-graph replay of the same call; the host's time to enqueue
one call), and, from a torch.profiler trace, each kernel's GPU time and the idle gap before
it (after the flush, or after the kernel before it).

python3 tests/gpu_attention_parts.py FAMILY BS N PREFIX [PREFIX ...], e.g.
``python3 tests/gpu_attention_parts.py gqa 1 64 128 4096 16384 65536``."""

import json
import os
import statistics
import sys
import tempfile
import time

import torch

from ddtree.bench_attention import FLUSH_BYTES, call
from ddtree.bench_gpu import eager_time_us

REPS = 30


def graph_us(fn, flush: torch.Tensor) -> float:
    """Median µs of a replay of a graph that captured `fn`, each after an L2 flush."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(REPS):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def host_us(fn, calls: int = 200) -> float:
    """Host µs to enqueue one call (the GPU runs behind)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    spent = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return spent


def kernel_parts(fn, flush: torch.Tensor) -> dict:
    """Per ddtree kernel: (median idle gap before it, median duration), µs, from a trace of
    REPS flushed eager calls."""
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(REPS):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"]
    os.unlink(path)
    events.sort(key=lambda e: e["ts"])
    parts: dict = {}
    prev_end = None
    for e in events:
        if "ddtree" in e["name"] and prev_end is not None:
            parts.setdefault(e["name"], []).append((e["ts"] - prev_end, e["dur"]))
        prev_end = e["ts"] + e["dur"]
    return {
        name: (statistics.median(g for g, _ in v), statistics.median(d for _, d in v))
        for name, v in parts.items()
    }


def main() -> None:
    family = sys.argv[1]
    bs, n = int(sys.argv[2]), int(sys.argv[3])
    device = torch.device("cuda")
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
    print(f"# {torch.cuda.get_device_name()}, {family} bs={bs} N={n}, median of {REPS}")
    for prefix in (int(a) for a in sys.argv[4:]):
        _, ws, attend = call(family, bs, n, prefix, device)
        eager = eager_time_us(attend, REPS, before=flush.zero_)
        graph = graph_us(attend, flush)
        host = host_us(attend)
        print(
            f"P={prefix} splits={ws.splits(bs)} tile={ws.tile}: eager {eager:.1f} µs, "
            f"graph replay {graph:.1f} µs, host enqueue {host:.1f} µs"
        )
        for name, (gap, dur) in kernel_parts(attend, flush).items():
            print(f"    {name}: gap before {gap:.1f} µs, runs {dur:.1f} µs")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
