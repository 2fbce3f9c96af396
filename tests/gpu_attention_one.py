"""One tree attention call of a benchmark shape, after three warm-ups, for Nsight Compute
(BENCHMARKS.md, session 8): python3 tests/gpu_attention_one.py FAMILY BS N PREFIX, e.g.
``ncu -k regex:ddtree_attention_sm90a -c 1 -s 2 --section SpeedOfLight python3
tests/gpu_attention_one.py mla8 1 256 65536``."""

import sys

import torch

from ddtree.bench_attention import call


def main() -> None:
    family = sys.argv[1]
    bs, n, prefix = (int(a) for a in sys.argv[2:5])
    _, ws, attend = call(family, bs, n, prefix, torch.device("cuda"))
    for _ in range(3):
        attend()
    torch.cuda.synchronize()
    print("tile", ws.tile, "splits", ws.splits(bs))


if __name__ == "__main__":
    main()
