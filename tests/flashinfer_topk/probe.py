"""Where flashinfer's top-k time goes at the bench's shapes (H100/H200): its radix dispatch
alone, with the sort and gather `flashinfer.top_k` adds for UNO's call, and a plain read of
the logits (torch.amax over each row: the memory floor any top-k pays). Each is the median
of graph replays (ddtree.bench_gpu.graph_time_us).

    DDTREE_FLASHINFER_TOPK=.../libfi_topk.so python tests/flashinfer_topk/probe.py
"""

import os

import torch

from ddtree import bench_gpu, bench_uno

lib = os.environ["DDTREE_FLASHINFER_TOPK"]
top_k = bench_uno.flashinfer_top_k(lib)
raw = bench_uno.radix_topk_entry(lib)


def times(x: torch.Tensor, k: int) -> tuple:
    rows = x.shape[0]
    vals = torch.empty(rows, k, dtype=x.dtype, device="cuda")
    ids = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    state = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")

    def dispatch():
        s = torch.cuda.current_stream().cuda_stream
        dtype = bench_uno._DTYPE_CODES[x.dtype]
        err = raw(dtype, x.data_ptr(), ids.data_ptr(), vals.data_ptr(), rows, k, x.shape[1],
                  state.data_ptr(), 0, 0, s)  # fmt: skip
        assert err == 0, err

    return (
        bench_gpu.graph_time_us(dispatch, 100),
        bench_gpu.graph_time_us(lambda: top_k(x, k, sorted=True), 100),
        bench_gpu.graph_time_us(lambda: torch.amax(x, dim=-1), 100),
    )


print(f"# {torch.cuda.get_device_name()}; median of 100 graph replays, µs")
print("rows | k | dispatch alone | flashinfer.top_k (UNO's call) | torch.amax (read floor)")
for bs in (1, 8, 64):
    x = bench_gpu.peaked_logits(bs, 15, 151936, 0, torch.device("cuda")).view(bs * 15, -1)
    for k in (8, 16):
        t = times(x, k)
        print(f"{x.shape[0]} | {k} | {t[0]:.1f} | {t[1]:.1f} | {t[2]:.1f}")
