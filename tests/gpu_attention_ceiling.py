"""The dense attention rate this GPU reaches with NVIDIA's and PyTorch's own kernels
(BENCHMARKS.md): torch SDPA through cuDNN and through flash, bf16, head dim 128, no mask,
long queries and keys (so the rate is the steady state, not launch or tail effects), median
of 10 CUDA-event timings. It bounds what a tree attention kernel can be expected to do per
FLOP; ddtree's own rates are in ``bench --attention``.

python3 tests/gpu_attention_ceiling.py"""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ddtree.bench_gpu import eager_time_us

HEADS, DIM, REPS = 32, 128, 10


def main() -> None:
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, H={HEADS} D={DIM}")
    for lq, lk in ((4096, 16384), (4096, 65536), (1024, 65536)):
        q = torch.randn(1, HEADS, lq, DIM, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, HEADS, lk, DIM, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        flops = 4 * HEADS * lq * lk * DIM
        for name, backend in (
            ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ("flash", SDPBackend.FLASH_ATTENTION),
        ):
            try:
                with sdpa_kernel(backend):
                    us = eager_time_us(
                        lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v), REPS
                    )
                print(f"Lq={lq} Lk={lk} {name}: {us:.0f} µs, {flops / us / 1e6:.0f} TFLOP/s")
            except RuntimeError as e:  # a backend refusing the shape
                print(f"Lq={lq} Lk={lk} {name}: n/a ({str(e).splitlines()[0][:80]})")


if __name__ == "__main__":
    main()
