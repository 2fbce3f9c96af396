"""``python -m ddtree bench --attention`` (GPU): the tree verify attention per layer, bf16,
with the L2 cache flushed before each timed call (as a layer-by-layer forward meets it),
median of ``--reps`` CUDA-event timings. Shapes: MLA (absorbed, Dqk 576 / Dv 512) with
Hq 8 and 16, and GQA 32/8 x 128; N tree tokens, prefix lengths and batch sizes as flagged.

Beside ddtree in the same run: torch SDPA (flash) on the same keys without any mask — a
lower bound for what a mask costs, with K/V already contiguous (no page gather) — and SDPA
with the dense tree mask, what DDTree's reference verify does; ratios are against ddtree.
Each row also prints ddtree's achieved TFLOP/s and GB/s of unique KV read, its kernel tile
(``sm90a_``: the Hopper kernel) and its split count (key ranges per request). With
``DDTREE_ATTENTION=portable`` an H100/H200 runs the portable (sm_120) kernel instead, and
with ``DDTREE_ATTENTION=sm120`` it runs it at sm_120's occupancy (each block launched with
enough shared memory that an SM holds as many as sm_120's 100 KB would).
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys

import torch
import torch.nn.functional as F

from . import _attention, build_tree
from ._types import Tree
from .bench import HelpFormatter
from .bench_gpu import eager_time_us

FLUSH_BYTES = 512 << 20  # larger than the H200's 50 MB L2


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ddtree bench --attention",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    p.add_argument("--n", type=int, nargs="+", default=[64, 256], help="tree tokens N")
    p.add_argument(
        "--prefix", type=int, nargs="+", default=[4096, 16384, 65536], help="prefix lengths"
    )
    p.add_argument("--bs", type=int, nargs="+", default=[1, 8], help="batch sizes")
    p.add_argument(
        "--family",
        nargs="+",
        default=["mla8", "mla16", "gqa"],
        choices=["mla8", "mla16", "gqa"],
        help="head shapes: MLA with 8 or 16 query heads, GQA",
    )
    p.add_argument("--reps", type=int, default=30, help="timed calls per row (median)")
    p.add_argument(
        "--no-sdpa",
        action="store_true",
        help="time ddtree alone, without the SDPA columns: for comparing two builds in one "
        "device call (tests/attention_ab.py)",
    )
    return p


def chain_tree(bs: int, n: int, device) -> Tree:
    """A real tree of Q = N tokens (the root and B = N - 1 nodes), built by ddtree from a
    DFlash-like draft."""
    g = torch.Generator(device=device).manual_seed(n)
    x = torch.randn(bs, 8, 1000, device=device, generator=g) * 3
    z = torch.zeros(bs, dtype=torch.int64, device=device)
    return build_tree(x, z, z, budget=n - 1)


def shapes(family: str):
    """(Hq, Hkv, Dqk, Dv, MLA)."""
    return {
        "mla8": (8, 1, 576, 512, True),
        "mla16": (16, 1, 576, 512, True),
        "gqa": (32, 8, 128, 128, False),
    }[family]


def inputs(family, bs, n, prefix, device):
    hq, hkv, dqk, dv, mla = shapes(family)
    tree = chain_tree(bs, n, device)
    q_nodes = tree.width
    rows, dtype = bs * q_nodes, torch.bfloat16
    k_cache = torch.randn(bs * prefix, hkv, dqk, device=device, dtype=dtype)
    v_cache = k_cache[..., :dv] if mla else torch.randn_like(k_cache[..., :dv])
    k_new = torch.randn(rows, hkv, dqk, device=device, dtype=dtype)
    v_new = k_new[..., :dv] if mla else torch.randn_like(k_new[..., :dv])
    perm = torch.randperm(bs * prefix, device=device).to(torch.int32)
    return {
        "q": torch.randn(rows, hq, dqk, device=device, dtype=dtype),
        "k_new": k_new,
        "v_new": v_new,
        "k_cache": k_cache,
        "v_cache": v_cache,
        "kv_indptr": torch.arange(0, bs * prefix + 1, prefix, device=device, dtype=torch.int32),
        "kv_indices": perm,
        "prefix_lens": torch.full((bs,), prefix, device=device, dtype=torch.int64),
        "tree": tree,
        "sm_scale": 1 / math.sqrt(dqk),
    }


def timed(fn, reps: int, flush: torch.Tensor) -> float:
    """Median µs of `fn` over `reps` calls, each after an L2 flush."""
    return eager_time_us(fn, reps, before=flush.zero_)


def sdpa_fns(c, family, bs, prefix):
    """SDPA without a mask (flash, contiguous K/V) and with the dense tree mask."""
    hq, hkv, dqk, dv, mla = shapes(family)
    q_nodes = c["tree"].width
    q = c["q"].view(bs, q_nodes, hq, dqk).transpose(1, 2)
    keys = prefix + q_nodes
    k = torch.randn(bs, hkv, keys, dqk, device=q.device, dtype=q.dtype)
    v = k[..., :dv] if mla else torch.randn(bs, hkv, keys, dv, device=q.device, dtype=q.dtype)
    gqa = {"enable_gqa": True} if hkv != hq else {}
    vis = c["tree"].visibility()
    mask = torch.ones(bs, 1, q_nodes, keys, dtype=torch.bool, device=q.device)
    mask[..., prefix:] = vis.unsqueeze(1)
    scale = c["sm_scale"]

    def flash():
        return F.scaled_dot_product_attention(q, k, v, scale=scale, **gqa)

    def masked():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **gqa)

    return flash, masked


def call(family, bs, n, prefix, device):
    """The inputs of one shape and a ddtree call of them with its workspace and ``out=``
    made beforehand; returns (inputs, workspace, the call)."""
    c = inputs(family, bs, n, prefix, device)
    hq, hkv, dqk, dv, _ = shapes(family)
    q_nodes = c["tree"].width
    ws = _attention.AttentionWorkspace(
        device, max_batch=bs, q_nodes=q_nodes, hq=hq, hkv=hkv, dqk=dqk, dv=dv
    )
    out = torch.empty(bs * q_nodes, hq, dv, device=device, dtype=torch.bfloat16)
    return c, ws, lambda: _attention.tree_attention(**c, out=out, workspace=ws)


def sdpa_cells(c, family, bs, prefix, reps, flush) -> dict:
    """The SDPA baselines' times (or why a backend refused the shape)."""
    flash, masked = sdpa_fns(c, family, bs, prefix)
    cells = {}
    for name, fn in (("sdpa_flash_nomask", flash), ("sdpa_dense_mask", masked)):
        try:
            cells[name] = timed(fn, reps, flush)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as e:  # a backend refusing a shape
            cells[name] = f"n/a ({type(e).__name__})"
        torch.cuda.empty_cache()
    return cells


def row(family, bs, n, prefix, reps, flush, device, sdpa=True):
    c, ws, ours_fn = call(family, bs, n, prefix, device)
    hq, hkv, dqk, dv, _ = shapes(family)
    q_nodes = c["tree"].width
    ours = timed(ours_fn, reps, flush)
    if sdpa:
        cells = sdpa_cells(c, family, bs, prefix, reps, flush)
    else:
        cells = dict.fromkeys(("sdpa_flash_nomask", "sdpa_dense_mask"), "not run")
    flops = 2 * bs * q_nodes * hq * (prefix + q_nodes / 2) * (dqk + dv)
    kv_bytes = bs * prefix * hkv * (dqk + (0 if family.startswith("mla") else dv)) * 2
    return {
        "shape": f"{family} bs={bs} N={n} P={prefix}",
        "ddtree_us": ours,
        "splits": ws.splits(bs),
        "tile": ws.tile,
        "tflops": flops / ours / 1e6,
        "gbps": kv_bytes / ours / 1e3,
        **cells,
    }


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if not torch.cuda.is_available():
        print("bench --attention: needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
    print(
        f"# ddtree tree attention, {datetime.datetime.now().isoformat(timespec='seconds')}, "
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; bf16, L2 flushed, median "
        f"of {args.reps}; command: python -m ddtree bench --attention {' '.join(argv or [])}"
    )
    print(
        "shape | ddtree µs | tile | splits | TFLOP/s | GB/s KV | SDPA flash no mask µs (x) | "
        "SDPA dense mask µs (x)"
    )
    for family in args.family:
        for bs in args.bs:
            for n in args.n:
                for prefix in args.prefix:
                    r = row(family, bs, n, prefix, args.reps, flush, device, not args.no_sdpa)
                    print(format_row(r), flush=True)
                    torch.cuda.empty_cache()
    return 0


def format_row(r) -> str:
    def cell(name):
        v = r[name]
        return v if isinstance(v, str) else f"{v:.0f} ({v / r['ddtree_us']:.2f}x)"

    return (
        f"{r['shape']} | {r['ddtree_us']:.0f} | {r['tile']} | {r['splits']} | {r['tflops']:.1f} | "
        f"{r['gbps']:.0f} | {cell('sdpa_flash_nomask')} | {cell('sdpa_dense_mask')}"
    )


if __name__ == "__main__":
    sys.exit(main())
