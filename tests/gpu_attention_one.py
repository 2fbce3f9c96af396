"""One tree attention call of a benchmark shape, after three warm-ups, for Nsight Compute
(BENCHMARKS.md, session 8): python3 tests/gpu_attention_one.py FAMILY BS N PREFIX, e.g.
``ncu -k regex:ddtree_attention_sm90a -c 1 -s 2 --section SpeedOfLight python3
tests/gpu_attention_one.py mla8 1 256 65536``."""

import sys

import torch

from ddtree import _attention
from ddtree.bench_attention import inputs, shapes


def main() -> None:
    family = sys.argv[1]
    bs, n, prefix = (int(a) for a in sys.argv[2:5])
    dev = torch.device("cuda")
    c = inputs(family, bs, n, prefix, dev)
    hq, hkv, dqk, dv, _ = shapes(family)
    q_nodes = c["tree"].width
    ws = _attention.AttentionWorkspace(
        dev, max_batch=bs, q_nodes=q_nodes, hq=hq, hkv=hkv, dqk=dqk, dv=dv
    )
    out = torch.empty(bs * q_nodes, hq, dv, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        _attention.tree_attention(**c, out=out, workspace=ws)
    torch.cuda.synchronize()
    print("tile", ws.tile, "splits", ws.splits(bs))


if __name__ == "__main__":
    main()
