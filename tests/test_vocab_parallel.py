"""Vocab-parallel build and greedy accept on CPU tensors with the gloo backend: 2 and 3
ranks, unequal shards, each rank holding its slice of the vocabulary. Every rank's tree and
acceptance must equal the single-process call on the concatenated logits, bit for bit."""

from __future__ import annotations

import dataclasses
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ddtree

NINF, NAN = float("-inf"), float("nan")


def draft_case(seed: int, bs: int, depth: int, vocab: int, dtype) -> torch.Tensor:
    """Logits with many exact ties (few distinct values), -inf tokens, rows of -inf only
    on some shards, a one-hot row (log-prob 0), and NaN in one request."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-6, 3, (bs, depth, vocab), generator=g).float() / 2
    x[torch.rand(bs, depth, vocab, generator=g) < 0.2] = NINF
    x[0, 0, : vocab // 2] = NINF  # the first shard(s) see only -inf in this row
    x[0, 1] = NINF
    x[0, 1, vocab - 1] = 0.0  # one finite token at the very end: log-prob exactly 0
    if bs > 2:
        x[2, depth - 1, vocab // 3] = NAN  # request 2 is rejected
    return x.to(dtype)


def target_case(seed: int, tree: ddtree.Tree, vocab: int) -> torch.Tensor:
    """Target logits whose argmax often is a drafted token (deep walks), with ties that
    straddle the shard cuts, an all -inf node row and a NaN."""
    g = torch.Generator().manual_seed(seed)
    bs, q = tree.verify_ids.shape
    t = torch.randint(-4, 1, (bs, q, vocab), generator=g).float()
    for b in range(bs):
        for i in range(q):
            child = int(tree.first_child[b, i])
            if child >= 0 and torch.rand((), generator=g) < 0.8:
                t[b, i, int(tree.verify_ids[b, child])] = 5.0
    t[0, 0, :] = 1.0  # a tie across every shard: the lowest id wins
    t[1 % bs, 0, :] = NINF  # no value above -inf: token 0
    t[0, 1 % q, 3] = NAN
    return t


def shards_of(vocab: int, tp: int, case: int) -> list[tuple[int, int]]:
    """Unequal (start, size) cuts; case 1 puts a one-token shard in the middle."""
    if case == 0:
        cuts = [round(vocab * (r + 1) ** 2 / tp**2) for r in range(tp)]
    else:
        cuts = [vocab // 2 + r for r in range(tp - 1)] + [vocab]
    starts = [0] + cuts[:-1]
    return [(s, e - s) for s, e in zip(starts, cuts, strict=True)]


def same(a, b) -> bool:
    """Bit-equal dataclasses of tensors (NaN-safe: compares bits)."""
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if x.dtype.is_floating_point:
            bits = {4: torch.int32, 8: torch.int64}[x.element_size()]
            x, y = x.view(bits), y.view(bits)
        if not torch.equal(x, y):
            return False
    return True


def SAMPLING(bs: int) -> list[dict]:
    """Greedy; temperature alone (scalar, and per request with greedy ones among them), drawn
    on the shards; top-k and top-p, drawn on the gathered rows. Every rank passes one seed."""
    per_request = torch.tensor([0.0, 0.6, 1.7, 0.0][:bs] + [1.0] * max(0, bs - 4))
    return [
        {},
        {"temperature": 0.8, "generator": 11},
        {"temperature": per_request, "generator": 5},
        {"temperature": 1.2, "top_k": 3, "generator": 2},
        {"temperature": 0.9, "top_p": 0.6, "generator": 3},
    ]


CASES = [  # (bs, depth, vocab, budget, topk, dtype)
    (3, 4, 97, 15, None, torch.float32),
    (4, 3, 64, 1, None, torch.bfloat16),
    (2, 5, 50, 300, None, torch.float32),
    (3, 2, 211, 40, 7, torch.float16),
]


def check_stepper(rank: int, tp: int) -> None:
    """The Stepper with a group: the same trees and acceptances as a Stepper on whole rows,
    into its static buffers."""
    shape = {"max_batch": 4, "budget": 15, "depth": 4, "vocab": 97, "device": "cpu"}
    alone = ddtree.Stepper(**shape)
    mine = ddtree.Stepper(**shape, group=dist.group.WORLD)
    start, size = shards_of(97, tp, 0)[rank]
    roots, prefix = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])
    window = torch.arange(3 * 16).view(3, 16)
    for n in range(2):
        x = draft_case(10 + n, 3, 4, 97, torch.float32)
        want = alone.step(x, roots, prefix)
        assert same(mine.step(x[:, :, start : start + size], roots, prefix), want)
        t = target_case(n, want, 97)
        for sampling in SAMPLING(3):
            a = alone.accept(t, **sampling)
            assert same(mine.accept(t[:, :, start : start + size], **sampling), a), sampling
        kept = zip(alone.kept_slots(window), mine.kept_slots(window), strict=True)
        assert all(torch.equal(u, v) for u, v in kept)
    with pytest.raises(ValueError, match="vocab"):  # the shards' V is not the Stepper's
        other = ddtree.Stepper(**{**shape, "vocab": 98}, group=dist.group.WORLD)
        other.step(x[:, :, start : start + size], roots, prefix)


def run_rank(rank: int, tp: int, init: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=tp)
    torch.manual_seed(0)
    checked = 0
    for n, (bs, depth, vocab, budget, topk, dtype) in enumerate(CASES):
        x = draft_case(n, bs, depth, vocab, dtype)
        roots = torch.arange(bs) * 7 % vocab
        prefix = torch.arange(bs) * 5 + 3
        whole = ddtree.build_tree(x, roots, prefix, budget=budget, topk=topk)
        for case in (0, 1):
            # case 1: rank r holds shard tp-1-r and says where it starts (vocab_start).
            start, size = shards_of(vocab, tp, case)[tp - 1 - rank if case else rank]
            shard = x[:, :, start : start + size]
            kw = {"vocab_start": start} if case else {}
            tree = ddtree.build_tree(shard, roots, prefix, budget=budget, topk=topk,
                                     group=dist.group.WORLD, **kw)  # fmt: skip
            assert same(tree, whole), (n, case)
            t = target_case(n, whole, vocab).to(dtype)
            mine = t[:, :, start : start + size]
            for sampling in SAMPLING(bs):
                acc = ddtree.accept_tree(whole, mine, group=dist.group.WORLD, **kw, **sampling)
                assert same(acc, ddtree.accept_tree(whole, t, **sampling)), (n, case, sampling)
            checked += 1
    # A request's NaN reaches every rank: the same rejected request everywhere.
    assert int(whole.status[2]) != 0 or CASES[-1][0] <= 2
    with pytest.raises(ValueError, match="temperature"):  # checked before any collective
        ddtree.accept_tree(whole, t[:, :, :1], temperature=-0.7, group=dist.group.WORLD)
    check_stepper(rank, tp)
    # The seed is group rank 0's: ranks given different ones still draw alike, here on the
    # gathered rows (top_k) and on the shards (temperature alone).
    for extra in ({"top_k": 3}, {}):
        got = ddtree.accept_tree(whole, t[:, :, start : start + size], temperature=1.2,
                                 generator=100 + rank, group=dist.group.WORLD,
                                 **kw, **extra)  # fmt: skip
        want = ddtree.accept_tree(whole, t, temperature=1.2, generator=100, **extra)
        assert same(got, want), extra
    # A rank that refuses its arguments makes every rank raise (none is left waiting), and
    # so do arguments that differ between ranks.
    with pytest.raises(ValueError, match="budget" if rank == 0 else "rank 0 refused"):
        ddtree.build_tree(x[:, :, :3], roots, prefix, budget=min(rank, 3),
                          group=dist.group.WORLD)  # fmt: skip
    with pytest.raises(ValueError, match="different shapes"):  # one rank's roots differ
        ddtree.build_tree(x[:, :, :3], roots + (rank == 1), prefix, budget=3,
                          group=dist.group.WORLD)  # fmt: skip
    with pytest.raises(ValueError, match="different shapes"):
        ddtree.build_tree(x[:, :, :3], roots, prefix, budget=3 + rank, group=dist.group.WORLD)
    # Inconsistent starts are refused on every rank (no rank is left waiting).
    with pytest.raises(ValueError, match="vocab_start"):
        ddtree.build_tree(x[:, :, :2], roots % 2, prefix, budget=3, group=dist.group.WORLD,
                          vocab_start=0)  # fmt: skip
    with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
        f.write(str(checked))
    dist.barrier()  # no rank tears its connections down while another still reads them
    dist.destroy_process_group()
    # Skip the interpreter's teardown: gloo's threads outliving C++ statics there abort the
    # process now and then ("terminate called without an active exception").
    os._exit(0)


def spawn_ranks(run, tp: int) -> list[str]:
    """Runs `run(rank, tp, init, out_dir)` on `tp` processes (a file store for the group) and
    returns what each rank wrote to ``out_dir/rank{r}``: the count of cases it checked."""
    with tempfile.TemporaryDirectory() as d:
        init = "file://" + os.path.join(d, "store")
        mp.spawn(run, args=(tp, init, d), nprocs=tp, join=True)
        return [open(os.path.join(d, f"rank{r}")).read() for r in range(tp)]


@pytest.mark.parametrize("tp", [2, 3])
def test_every_rank_builds_and_accepts_what_the_single_process_call_does(tp):
    assert spawn_ranks(run_rank, tp) == [str(2 * len(CASES))] * tp


def test_a_group_needs_cpu_or_cuda_tensors_and_vocab_start_needs_a_group():
    with pytest.raises(ValueError, match="vocab_start"):
        ddtree.Stepper(device="cpu", vocab_start=0)
    x = torch.zeros(1, 2, 8)
    with pytest.raises(ValueError, match="vocab_start"):
        ddtree.build_tree(x, [0], [0], budget=3, vocab_start=0)
    tree = ddtree.build_tree(x, [0], [0], budget=3)
    with pytest.raises(ValueError, match="vocab_start"):
        ddtree.accept_tree(tree, torch.zeros(1, 4, 8), vocab_start=0)
    from ddtree import _vocab_parallel

    with pytest.raises(ValueError, match="draft_logits: a vocab-parallel call"):
        _vocab_parallel.check_device(torch.empty(0, device="meta"), "draft_logits")
