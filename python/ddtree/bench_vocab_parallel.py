"""Vocab-parallel build: `tp` processes, each holding an equal slice of the vocabulary of
the same synthetic draft logits — CPU tensors over gloo, or with ``--device cuda`` one GPU
each over NCCL (needs `tp` GPUs) — build the tree two ways —

* ``group=``: `ddtree.build_tree(shard, ..., group=pg)`, which gathers each row's partials
  (best K, maximum, exact exp-sum) and merges them (on CUDA: the part arrays of
  `ddtree._partials`, summed across the ranks; this benchmark needs a GPU a rank and has
  not run yet);
* gather: all-gather the bf16 logit slices (what a serving stack does before anything can
  read them), then the single-process build on the whole rows —

and prints the bytes each rank receives and the time per build (median of ``--repeats``,
the slowest rank's), with both ratios, and whether both trees are the same.

    python -m ddtree bench --vocab-parallel [--bs 1 64] [--tp 2 4 8] [--budget 255]
        [--device cuda]

Every process runs its Rust work on ``cores / tp`` threads. On one machine the gloo
collectives are memory copies between processes, so the time column says what the CPU work
and the copies cost here, not what NCCL between GPUs would.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

V_DEFAULT = 151936


def parser() -> argparse.ArgumentParser:
    from .bench import HelpFormatter

    p = argparse.ArgumentParser(prog="python -m ddtree bench --vocab-parallel",
                                description=__doc__, formatter_class=HelpFormatter)  # fmt: skip
    p.add_argument("--bs", type=int, nargs="+", default=[1, 64], help="batch sizes")
    p.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8], help="ranks")
    p.add_argument("--budget", type=int, default=255, help="node budget B")
    p.add_argument("--depth", type=int, default=15, help="depth limit L")
    p.add_argument("--vocab", type=int, default=V_DEFAULT, help="vocabulary V")
    p.add_argument("--repeats", type=int, default=3, help="timed builds per way")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic logits")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cpu (gloo) or cuda (NCCL, one GPU a rank)")  # fmt: skip
    return p


def logits(bs: int, depth: int, vocab: int, seed: int) -> torch.Tensor:
    from .bench import peaked_rows

    return peaked_rows(bs, depth, vocab, torch.Generator().manual_seed(seed)).bfloat16()


def timed(fn, repeats: int, dist, device) -> tuple[float, object]:
    """Median seconds of `fn` over `repeats`, each the slowest rank's (barrier-framed; on a
    GPU, to the end of its work)."""
    times, out = [], None
    cuda = device.type == "cuda"
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        out = fn()
        if cuda:
            torch.cuda.synchronize(device)
        mine = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        times.append(float(mine))
    return statistics.median(times), out


def rank_main(rank: int, tp: int, init: str, args, out_path: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init, rank=rank,
                            world_size=tp)  # fmt: skip
    rows = [one_shape(bs, tp, rank, args, dist) for bs in args.bs]
    if rank == 0:
        with open(out_path, "a") as f:
            for r in rows:
                f.write(",".join(map(str, r)) + "\n")
    dist.barrier()  # no rank tears its connections down while another still reads them
    dist.destroy_process_group()
    # Skip the interpreter's teardown: gloo's threads outliving C++ statics there abort the
    # process now and then ("terminate called without an active exception").
    os._exit(0)


def one_shape(bs: int, tp: int, rank: int, args, dist) -> tuple:
    """This rank's row of the table for batch size `bs`."""
    import ddtree

    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    x = logits(bs, args.depth, args.vocab, args.seed).to(device)
    v_r = args.vocab // tp
    shard = x[:, :, rank * v_r : (rank + 1) * v_r].contiguous()
    roots = torch.zeros(bs, dtype=torch.int64, device=device)
    prefix = torch.zeros(bs, dtype=torch.int64, device=device)

    def by_group():
        return ddtree.build_tree(shard, roots, prefix, budget=args.budget,
                                 group=dist.group.WORLD)  # fmt: skip

    def by_gather():
        parts = [torch.empty_like(shard) for _ in range(tp)]
        dist.all_gather(parts, shard)
        return ddtree.build_tree(torch.cat(parts, 2), roots, prefix, budget=args.budget)

    t_group, tree_g = timed(by_group, args.repeats, dist, device)
    t_gather, tree_w = timed(by_gather, args.repeats, dist, device)
    same = all(torch.equal(getattr(tree_g, f), getattr(tree_w, f))
               for f in ("verify_ids", "parents", "topk_ids", "num_nodes"))  # fmt: skip
    k = min(args.budget, args.vocab)
    full = bs * args.depth * v_r * 2
    return (bs, tp, k, group_bytes(bs, tp, k, args, dist, device), (tp - 1) * full, t_group,
            t_gather, same)  # fmt: skip


def group_bytes(bs: int, tp: int, k: int, args, dist, device) -> int:
    """Bytes a rank receives in a ``group=`` build. CPU: (tp - 1) copies of each rank's
    partial rows — K values (4 bytes) and ids (8), the maximum (4), the NaN flag (1), the
    exp-sum (16). CUDA: a ring all-reduce of the part arrays (every rank's parts, each a
    K-list of values and ids, a maximum, a flag and a 16-byte sum), which receives
    2 (tp - 1) / tp of their size."""
    rows = bs * args.depth
    if device.type == "cpu":
        return (tp - 1) * rows * (k * (4 + 8) + 4 + 1 + 16)
    from ._vocab_parallel import part_layout

    _, counts = part_layout([args.vocab // tp] * tp, k, rows, device, dist.group.WORLD)
    size = rows * sum(counts) * (k * (4 + 8) + 4 + 4 + 16)
    return 2 * (tp - 1) * size // tp


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    bad = [t for t in args.tp if t < 1 or args.vocab % t]
    if bad:
        print(f"--tp: each must divide --vocab {args.vocab} (equal shards), got {bad[0]}",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.device == "cuda" and torch.cuda.device_count() < max(args.tp):
        print(f"--device cuda: one GPU a rank, and --tp {max(args.tp)} needs "
              f"{max(args.tp)}; this machine has {torch.cuda.device_count()}",
              file=sys.stderr)  # fmt: skip
        return 2
    import torch.multiprocessing as mp

    command = " ".join(sys.argv[1:] if argv is None else argv)
    where = (f"CUDA NCCL, {torch.cuda.get_device_name(0)}" if args.device == "cuda"
             else f"CPU gloo, {os.cpu_count()} cores")  # fmt: skip
    print(f"# ddtree vocab-parallel build, {where}, torch "
          f"{torch.__version__}; L={args.depth} V={args.vocab} B={args.budget} bf16; "
          f"command: python -m ddtree bench --vocab-parallel {command}")  # fmt: skip
    print("bs | tp | K | bytes in/rank, group= | bytes in/rank, gather | gather ÷ group bytes "
          "| group= ms | gather+build ms | gather ÷ group time | same tree")  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.csv")
        for tp in args.tp:
            os.environ["RAYON_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // tp))
            init = "file://" + os.path.join(d, f"store{tp}")
            mp.spawn(rank_main, args=(tp, init, args, out), nprocs=tp, join=True)
        for line in open(out):
            bs, tp, k, pb, fb, tg, tw, same = line.strip().split(",")
            pb, fb, tg, tw = int(pb), int(fb), float(tg), float(tw)
            print(f"{bs} | {tp} | {k} | {pb:,} | {fb:,} | {fb / pb:.0f}x | {tg * 1e3:.1f} | "
                  f"{tw * 1e3:.1f} | {tw / tg:.2f}x | {same}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
