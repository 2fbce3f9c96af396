"""Vocab-parallel build and accept on CUDA tensors: each rank holds its slice of the
vocabulary on a GPU. The build runs stage 1 as parts (`ddtree._partials`) whose arrays the
ranks complete with a sum; the accept gathers every node's greedy and draw keys of each
shard and walks along their maximum. Every rank's tree and acceptance must equal the
single-GPU `build_tree` / `accept_tree` on the whole rows, bit for bit.

With as many GPUs as ranks the ranks use NCCL, one GPU each (the two-GPU issue's run);
with one GPU they share it through gloo. Marked `gpu`: skipped without CUDA. The build's
and the accept's tests ran on one H200 (sessions 18 and 19), the CUDA `Stepper(group=)`
tests in session 20.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import torch.distributed as dist

import ddtree
from test_vocab_parallel import (
    CASES,
    SAMPLING,
    draft_case,
    same,
    shards_of,
    spawn_ranks,
    target_case,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def on_device(sampling: dict, device) -> dict:
    """The sampling arguments with their per-request tensors on `device` (the single-GPU
    accept takes them there)."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in sampling.items()}


def run_rank(rank: int, tp: int, init: str, out_dir: str) -> None:
    own_gpu = torch.cuda.device_count() >= tp
    device = torch.device("cuda", rank if own_gpu else 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl" if own_gpu else "gloo", init_method=init, rank=rank,
                            world_size=tp)  # fmt: skip
    checked = 0
    for n, (bs, depth, vocab, budget, topk, dtype) in enumerate(CASES):
        x = draft_case(n, bs, depth, vocab, dtype).to(device)
        roots = (torch.arange(bs) * 7 % vocab).to(device)
        prefix = (torch.arange(bs) * 5 + 3).to(device)
        whole = ddtree.build_tree(x, roots, prefix, budget=budget, topk=topk)
        for case in (0, 1):
            # case 1: rank r holds shard tp-1-r and says where it starts (vocab_start).
            start, size = shards_of(vocab, tp, case)[tp - 1 - rank if case else rank]
            kw = {"vocab_start": start} if case else {}
            tree = ddtree.build_tree(x[:, :, start : start + size], roots, prefix,
                                     budget=budget, topk=topk, group=dist.group.WORLD,
                                     **kw)  # fmt: skip
            torch.cuda.synchronize(device)
            assert same(tree, whole), (n, case)
            t = target_case(n, whole, vocab).to(dtype).to(device)
            for sampling in SAMPLING(bs):
                sampling = on_device(sampling, device)
                acc = ddtree.accept_tree(whole, t[:, :, start : start + size],
                                         group=dist.group.WORLD, **kw, **sampling)  # fmt: skip
                assert same(acc, ddtree.accept_tree(whole, t, **sampling)), (n, case, sampling)
            checked += 1
    # A production-sized row: V = 151936 over the ranks, B = 255.
    x = draft_case(99, 2, 3, 151_936, torch.bfloat16).to(device)
    roots, prefix = torch.tensor([5, 9], device=device), torch.tensor([7, 0], device=device)
    whole = ddtree.build_tree(x, roots, prefix, budget=255)
    start, size = shards_of(151_936, tp, 0)[rank]
    tree = ddtree.build_tree(x[:, :, start : start + size], roots, prefix, budget=255,
                             group=dist.group.WORLD)  # fmt: skip
    assert same(tree, whole)
    with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
        f.write(str(checked + 1))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # as in test_vocab_parallel: gloo's threads and interpreter teardown


@pytest.mark.parametrize("tp", [2, 3])
def test_every_rank_builds_the_single_gpu_tree(tp):
    assert spawn_ranks(run_rank, tp) == [str(2 * len(CASES) + 1)] * tp


@pytest.mark.parametrize("cut", [0, 1])
def test_shard_keys_of_any_cut_walk_to_the_single_gpu_acceptance(cut):
    """One process, one GPU: the keys of every shard of a cut of the vocabulary (strided
    views of the whole rows), stacked as the ranks gather them, walk to `accept_tree` on
    the whole rows, greedy and sampled by temperature: ties across the cuts (a signed-zero
    one too), an all -inf node row, a NaN, +inf in two shards, a one-token shard (cut 1),
    a corrupt link, and a temperature so small that the scores overflow."""
    from ddtree import _buffers, _sampling
    from ddtree import _vocab_parallel as vp

    device = torch.device("cuda", torch.cuda.current_device())  # == a tensor's device
    for n, (bs, depth, vocab, budget, topk, dtype) in enumerate(CASES):
        x = draft_case(n, bs, depth, vocab, dtype).to(device)
        roots = (torch.arange(bs) * 7 % vocab).to(device)
        prefix = (torch.arange(bs) * 5 + 3).to(device)
        tree = ddtree.build_tree(x, roots, prefix, budget=budget, topk=topk)
        t = target_case(n, tree, vocab).to(dtype).to(device)
        half, q = vocab // 2, t.shape[1]
        t[0, q - 1, :] = -1.0
        t[0, q - 1, half - 1], t[0, q - 1, half] = -0.0, 0.0  # a signed-zero tie at a cut
        t[bs - 1, q - 1, vocab - 1] = t[bs - 1, q - 1, 1] = float("inf")  # +inf, two shards
        # A corrupt link (out of range) in the last request: its root-only result and code.
        bad = dataclasses.replace(tree, first_child=tree.first_child.clone())
        bad.first_child[bs - 1, 0] = 10**6
        extreme = {"temperature": 1e-38, "generator": 4}  # scores overflow: no pruning
        for tp, walked in ((1, tree), (2, tree), (3, tree), (2, bad)):
            for sampling in SAMPLING(bs)[:3] + [extreme]:  # greedy, then temperature alone
                sampling = on_device(sampling, device)
                want = ddtree.accept_tree(walked, t, **sampling)
                state = None
                if sampling:
                    state = _sampling.SamplingState(bs, device, sampling["generator"])
                    state.load(bs, sampling["temperature"], None, None)
                every = torch.stack([
                    vp.shard_keys(t[:, :, s : s + z], s, vocab, state)
                    for s, z in shards_of(vocab, tp, cut)
                ])  # fmt: skip
                acc = _buffers.new_acceptance(bs, tree.depth, device)
                vp.walk_keys(walked, acc, every, state)
                assert same(acc, want), (n, tp, sampling, walked is bad)


def run_stepper_rank(rank: int, tp: int, init: str, out_dir: str) -> None:
    """A CUDA `Stepper(group=)` on this rank's shard against a single-GPU Stepper of the
    same seed on the whole rows: three rounds (the second and third reuse the layout the
    first agreed on), each accepted greedily and by temperature (the two Steppers' draws
    advance alike), then its kept slots and its readback."""
    own_gpu = torch.cuda.device_count() >= tp
    device = torch.device("cuda", rank if own_gpu else 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl" if own_gpu else "gloo", init_method=init, rank=rank,
                            world_size=tp)  # fmt: skip
    bs, depth, vocab, budget = 3, 4, 1000, 15
    kw = {"max_batch": 4, "budget": budget, "depth": depth, "vocab": vocab, "device": device}
    single = ddtree.Stepper(**kw, seed=7)
    sharded = ddtree.Stepper(**kw, seed=7, group=dist.group.WORLD)
    start, size = shards_of(vocab, tp, 0)[rank]
    checked = 0
    for rnd in range(3):
        x = draft_case(rnd, bs, depth, vocab, torch.bfloat16).to(device)
        roots = (torch.arange(bs) * 7 % vocab).to(device)
        prefix = (torch.arange(bs) * 5 + 3 + rnd).to(device)
        want = single.step(x, roots, prefix)
        assert same(sharded.step(x[:, :, start : start + size], roots, prefix), want), rnd
        t = target_case(rnd, want, vocab).to(torch.bfloat16).to(device)
        per_request = torch.tensor([0.0, 0.6, 1.7], device=device)
        for sampling in ({}, {"temperature": 0.8}, {"temperature": per_request, "generator": 5}):
            a = single.accept(t, **sampling)
            b = sharded.accept(t[:, :, start : start + size], **sampling)
            assert same(b, a), (rnd, sampling)
            checked += 1
        window = torch.arange(bs * want.width, device=device).view(bs, want.width)
        kept, release = sharded.kept_slots(window)
        want_kept, want_release = single.kept_slots(window)
        assert torch.equal(kept, want_kept) and torch.equal(release, want_release), rnd
        got, ref = sharded.readback(wait=True), single.readback(wait=True)
        for name in ("accept_len", "accepted_tokens", "bonus", "status"):
            assert torch.equal(got[name], ref[name]), (rnd, name)
    with pytest.raises(ValueError, match="^top_k: a vocab-parallel Stepper on CUDA"):
        sharded.accept(t[:, :, start : start + size], temperature=1.0, top_k=3)
    with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
        f.write(str(checked))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


@pytest.mark.parametrize("tp", [2, 3])
def test_a_cuda_stepper_of_every_rank_steps_and_accepts_as_one_gpu_does(tp):
    assert spawn_ranks(run_stepper_rank, tp) == ["9"] * tp


def run_capture_rank(rank: int, tp: int, init: str, out_dir: str) -> None:
    """One rank over NCCL on this GPU: a Stepper(group=) round captured as a CUDA graph,
    the collectives inside it, replayed on new logits == a single-GPU Stepper's eager round
    on the same logits, greedy and sampled (each replay's draws advance as each eager
    accept's do)."""
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=tp)
    bs, depth, vocab, budget = 2, 3, 600, 15
    kw = {"max_batch": bs, "budget": budget, "depth": depth, "vocab": vocab, "device": device}
    checked = 0
    for sampling in ({}, {"temperature": 0.8}):
        single = ddtree.Stepper(**kw)
        sharded = ddtree.Stepper(**kw, group=dist.group.WORLD)
        x = draft_case(0, bs, depth, vocab, torch.float32).nan_to_num(0.0).to(device)
        roots = torch.tensor([1, 2], device=device)
        prefix = torch.tensor([4, 9], device=device)
        target = torch.zeros(bs, budget + 1, vocab, device=device)
        for stepper in (single, sharded):  # the layout agreed eagerly; the draws alike
            stepper.step(x, roots, prefix)
            stepper.accept(target, **sampling)
        graph = sharded.capture(x, roots, prefix, lambda tree, t=target: t, **sampling)
        single.step(x, roots, prefix)  # capture() ran one eager round before capturing
        single.accept(target, **sampling)
        for rnd in range(1, 4):
            x.copy_(draft_case(rnd, bs, depth, vocab, torch.float32).nan_to_num(0.0))
            want = single.step(x, roots, prefix)
            target.copy_(target_case(rnd, want, vocab).nan_to_num(0.0))
            want_acc = single.accept(target, **sampling)
            sharded.replay(bs)
            torch.cuda.synchronize(device)
            assert same(graph.tree, want) and same(graph.acc, want_acc), (rnd, sampling)
            checked += 1
    with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
        f.write(str(checked))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def test_a_group_stepper_round_captures_with_its_nccl_collectives():
    assert spawn_ranks(run_capture_rank, 1) == ["6"]
