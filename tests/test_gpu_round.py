"""The GPU round (SPEC stages 4–5): accept == the CPU path, sampling's distribution, the
generator, commit kernels, readback, and a whole round captured in one graph.

Marked `gpu`: skipped without CUDA. Run on the lent H200 by tests/gpu_run.sh.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_commit import children, random_round
from test_sampling import (
    CASES,
    LOGITS,
    chi_square,
    chi_square_limit,
    filtered,
    first_new_tokens,
)

import ddtree
from ddtree import Tree

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = "cuda"
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def on(tree: Tree, device) -> Tree:
    return Tree(**{name: getattr(tree, name).to(device) for name in tree.__dataclass_fields__})


def planted_target(rng, tree: Tree, vocab: int, dtype, strided: bool) -> torch.Tensor:
    """Target logits whose posteriors follow a random child (often not the first) for a
    random number of steps, over bf16-like ties elsewhere (3 padding columns if strided)."""
    bs, q = tree.verify_ids.shape
    base = rng.integers(-4, 4, size=(bs, q, vocab + (3 if strided else 0))) * 0.5
    target = torch.from_numpy(base).to(dtype)
    cpu = on(tree, "cpu")
    for b in range(bs):
        node = 0
        for _ in range(int(rng.integers(0, 8))):
            kids = children(cpu, b, node)
            if not kids:
                break
            child = kids[int(rng.integers(len(kids)))]
            target[b, node, cpu.verify_ids[b, child] + (2 if strided else 0)] = 9.0
            node = child
    return target  # strided: the caller views [..., 2 : 2 + vocab] on each device


@pytest.mark.parametrize("chunk", range(4))
def test_greedy_accept_equals_the_cpu_path(chunk):
    """4 x 40 batches of up to 12 requests: over 1000 random trees and posteriors."""
    rng = np.random.default_rng(100 + chunk)
    trees = 0
    for case in range(40):
        bs = int(rng.integers(1, 13))
        depth = int(rng.integers(1, 9))
        vocab = int(rng.choice([3, 16, 300, 5000]))
        budget = int(rng.choice([1, 7, 40, 255]))  # small vocabularies leave pads
        x = torch.from_numpy(rng.standard_normal((bs, depth, vocab)) * 3).float()
        roots = torch.from_numpy(rng.integers(0, vocab, bs))
        prefix = torch.from_numpy(rng.integers(0, 100, bs))
        tree = ddtree.build_tree(x.to(DEV), roots.to(DEV), prefix.to(DEV), budget=budget)
        dtype = DTYPES[case % 3]
        strided = case % 4 == 1
        full = planted_target(rng, tree, vocab, dtype, strided)
        off = 2 if strided else 0
        gpu_target = full.to(DEV)[:, :, off : off + vocab]
        gpu = ddtree.accept_tree(tree, gpu_target)
        cpu = ddtree.accept_tree(on(tree, "cpu"), full[:, :, off : off + vocab])
        for name in cpu.__dataclass_fields__:
            assert torch.equal(getattr(gpu, name).cpu(), getattr(cpu, name)), (case, name)
        trees += bs
    assert trees >= 250


def test_greedy_accept_of_a_tree_too_big_for_shared_memory():
    # Q = 1501 > kLinkCap: the walk reads the tree's links from global memory.
    rng = np.random.default_rng(9)
    x = torch.from_numpy(rng.standard_normal((3, 6, 400)) * 3).float()
    roots = torch.from_numpy(rng.integers(0, 400, 3))
    tree = ddtree.build_tree(x, roots, roots * 0, budget=1500)
    target = planted_target(rng, tree, 400, torch.float32, False)
    gpu = ddtree.accept_tree(on(tree, DEV), target.to(DEV))
    cpu = ddtree.accept_tree(tree, target)
    for name in cpu.__dataclass_fields__:
        assert torch.equal(getattr(gpu, name).cpu(), getattr(cpu, name)), name
    assert (cpu.accept_len > 1).any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_accept_at_a_real_vocabulary_with_nan_and_inf_rows(dtype):
    # Vector chunks over the whole slice of every block; rows that are all NaN (every token
    # ties at -inf: id 0), all -inf, NaN among values, +inf twice (lowest id), and the
    # maximum shared by -0.0 and 0.0 (they tie: lowest id).
    vocab, bs, budget = 151936, 6, 7
    g = torch.Generator().manual_seed(5)
    x = torch.randn(bs, 3, vocab, generator=g)
    z = torch.zeros(bs, dtype=torch.int64)
    tree = ddtree.build_tree(x.to(DEV), z.to(DEV), z.to(DEV), budget=budget)
    target = (torch.randn(bs, budget + 1, vocab, generator=g) * 4).round() / 2
    target[0, 0] = float("nan")
    target[1, 0] = float("-inf")
    target[2, 0, ::3] = float("nan")
    target[3, 0, [90000, 7, 150000]] = float("inf")
    target[4, 0] = -torch.rand(vocab, generator=g) - 1
    target[4, 0, [120001, 99999]] = torch.tensor([-0.0, 0.0])
    target[5, 0, 151935] = 100.0
    target = target.to(dtype)
    gpu = ddtree.accept_tree(tree, target.to(DEV))
    cpu = ddtree.accept_tree(on(tree, "cpu"), target)
    for name in cpu.__dataclass_fields__:
        assert torch.equal(getattr(gpu, name).cpu(), getattr(cpu, name)), name
    assert cpu.bonus[[0, 1, 3, 4, 5]].tolist() == [0, 0, 7, 99999, 151935]


@pytest.mark.parametrize("temperature, top_k, top_p", CASES)
def test_gpu_sampling_follows_the_filtered_distribution(temperature, top_k, top_p):
    tokens = first_new_tokens(
        40_000, 11, device=DEV, temperature=temperature, top_k=top_k, top_p=top_p
    )
    stat, df = chi_square(tokens, filtered(temperature, top_k, top_p))
    assert stat < chi_square_limit(max(df, 1)), stat


WIDE_VOCAB = 151936
LIVE_IDS = torch.tensor([5, 1000, 1001, 40000, 77777, 100000, 140000, WIDE_VOCAB - 1])


def wide_first_new_tokens(draws: int, seed, **sampling) -> np.ndarray:
    """first_new_tokens at a real vocabulary: test_sampling's 8 logits (+10) sit at
    LIVE_IDS in increasing order, every other token at -30 (far below: almost no mass, and
    the kernel skips it). Returns each draw's index into LIVE_IDS, -1 for any other token."""
    x = torch.zeros(draws, 1, WIDE_VOCAB, device=DEV)
    x[:, 0, LIVE_IDS[3]] = 5.0
    z = torch.zeros(draws, dtype=torch.int64, device=DEV)
    tree = ddtree.build_tree(x, z, z, budget=1)
    del x
    target = torch.full((draws, 2, WIDE_VOCAB), -30.0, device=DEV)
    target[:, :, LIVE_IDS.to(DEV)] = (LOGITS + 10).to(DEV)
    acc = ddtree.accept_tree(tree, target, generator=seed, **sampling)
    first = torch.where(acc.accept_len == 2, acc.accepted_tokens[:, 1], acc.bonus).cpu()
    index = torch.full((WIDE_VOCAB,), -1, dtype=torch.int64)
    index[LIVE_IDS] = torch.arange(len(LIVE_IDS))
    return index[first].numpy()


@pytest.mark.parametrize("temperature, top_k, top_p", CASES + [(1.0, 20, None)])
def test_gpu_sampling_at_a_real_vocabulary(temperature, top_k, top_p):
    # (1.0, 20, None): the top-k cut falls among the far tokens (only 8 are near).
    # Temperature alone: a draw whose uniform rounded to 1.0 would hand a far token +inf.
    index = wide_first_new_tokens(3000, 12, temperature=temperature, top_k=top_k, top_p=top_p)
    assert (index >= 0).all(), f"drew a token outside the 8 live ones: {np.sum(index < 0)}"
    stat, df = chi_square(index, filtered(temperature, top_k, top_p))
    assert stat < chi_square_limit(max(df, 1)), stat


@pytest.mark.parametrize("dtype", DTYPES)
def test_top_k_and_top_p_cut_inside_a_tie_of_negative_values(dtype):
    # Ids 0, 1, 2 tie at -1.0 (bf16/fp16 keys have constant low bits, all ones when the
    # value is negative): top_k=2 and top_p=0.5 each keep ids 0 and 1 only.
    draws, vocab = 512, 6
    x = torch.zeros(draws, 1, vocab, device=DEV)
    x[:, 0, 5] = 5.0
    z = torch.zeros(draws, dtype=torch.int64, device=DEV)
    tree = ddtree.build_tree(x, z, z, budget=1)
    row = torch.tensor([-1.0, -1.0, -1.0, -3.0, -4.0, -5.0])
    target = row.expand(draws, 2, vocab).contiguous().to(dtype).to(DEV)
    for kw in ({"top_k": 2}, {"top_p": 0.5}):
        acc = ddtree.accept_tree(tree, target, temperature=1.0, generator=4, **kw)
        first = torch.where(acc.accept_len == 2, acc.accepted_tokens[:, 1], acc.bonus).cpu()
        counts = torch.bincount(first, minlength=vocab).tolist()
        assert counts[2:] == [0, 0, 0, 0] and min(counts[:2]) > 150, (kw, counts)


def test_gpu_chi_square_catches_a_wrong_temperature_or_top_p():
    tokens = first_new_tokens(40_000, 5, device=DEV, temperature=1.0)
    stat, df = chi_square(tokens, filtered(1.3, None, None))
    assert stat > chi_square_limit(df)
    tokens = first_new_tokens(40_000, 5, device=DEV, temperature=1.0, top_p=0.8)
    with pytest.raises(AssertionError, match="filtered-out"):
        chi_square(tokens, filtered(1.0, None, 0.6))  # one token fewer


def test_same_seed_same_draws_and_replays_draw_fresh_numbers():
    a = first_new_tokens(4000, 7, device=DEV, temperature=1.0)
    b = first_new_tokens(4000, 7, device=DEV, temperature=1.0)
    c = first_new_tokens(4000, 8, device=DEV, temperature=1.0)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    stepper, x, roots, prefix, target = small_round(bs=512, vocab=8)
    stepper.step(x, roots, prefix)
    first = stepper.accept(target, temperature=1.0, generator=3).bonus.clone()
    second = stepper.accept(target, temperature=1.0).bonus.clone()  # offset advanced
    again = stepper.accept(target, temperature=1.0, generator=3).bonus.clone()
    assert torch.equal(first, again) and not torch.equal(first, second)


def test_mixed_greedy_and_sampled_requests():
    stepper, x, roots, prefix, target = small_round(bs=64, vocab=50)
    tree = stepper.step(x, roots, prefix)
    greedy = ddtree.accept_tree(on(tree, "cpu"), target.cpu())
    temps = torch.zeros(64, device=DEV)
    temps[1::2] = 1.0
    acc = stepper.accept(target, temperature=temps, top_p=torch.full((64,), 0.9, device=DEV))
    assert torch.equal(acc.bonus[0::2].cpu(), greedy.bonus[0::2])


def small_round(bs=8, depth=6, vocab=300, budget=63, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = (torch.randn(bs, depth, vocab, device=DEV, generator=g) * 3).to(torch.bfloat16)
    roots = torch.randint(0, vocab, (bs,), device=DEV, generator=g)
    prefix = torch.randint(0, 50, (bs,), device=DEV, generator=g)
    target = torch.randn(bs, budget + 1, vocab, device=DEV, generator=g).to(torch.bfloat16)
    stepper = ddtree.Stepper(max_batch=bs, budget=budget, depth=depth, vocab=vocab, device=DEV)
    return stepper, x, roots, prefix, target


def test_commit_kernels_equal_the_cpu_path():
    rng = np.random.default_rng(9)
    tree, acc, window, slots = random_round(rng, bs=6)
    gacc = ddtree.Acceptance(**{n: getattr(acc, n).to(DEV) for n in acc.__dataclass_fields__})
    gwin = window.to(DEV)
    kept, release = ddtree.kept_slots(acc, window)
    gkept, grelease = ddtree.kept_slots(gacc, gwin)
    assert torch.equal(gkept.cpu(), kept) and torch.equal(grelease.cpu(), release)
    layouts = (((4, 64), torch.bfloat16), ((1, 576), torch.bfloat16), ((3, 5), torch.float32))
    for shape, dtype in layouts:
        caches = [torch.randn(slots, *shape).to(dtype) for _ in range(4)]
        gcaches = [c.to(DEV) for c in caches]
        ddtree.compact_kv(acc, window, caches)
        ddtree.compact_kv(gacc, gwin, gcaches)
        for c, gc in zip(caches, gcaches, strict=True):
            assert torch.equal(gc.cpu(), c)
    q = tree.verify_ids.shape[1]
    hidden = torch.randn(6 * q, 3000).to(torch.bfloat16)
    want = ddtree.gather_hidden(acc, hidden)
    got = ddtree.gather_hidden(gacc, hidden.to(DEV))
    assert torch.equal(got.cpu(), want)


def verify_stand_in(tree: Tree, base: torch.Tensor) -> torch.Tensor:
    """A verify forward's stand-in: target logits that accept each request's first-child
    chain (torch ops only, capturable)."""
    target = base.clone()
    child = tree.first_child.clamp(min=0)
    tokens = torch.gather(tree.verify_ids, 1, child)
    target.scatter_(2, tokens.unsqueeze(2), 30.0)
    return target


def test_a_whole_round_in_one_graph_replays_like_eager():
    """step, verify, accept, kept slots and compaction in the caller's own graph; replays
    equal a second Stepper run eagerly on the same values, and readback sees each replay."""
    stepper, x, roots, prefix, base = small_round(bs=8, budget=63)
    ref = ddtree.Stepper(max_batch=8, budget=63, depth=6, vocab=300, device=DEV)
    window = torch.arange(8 * 64, device=DEV).view(8, 64).flip(1).contiguous()
    caches = [torch.randn(8 * 64, 2, 16, device=DEV) for _ in range(2)]
    stepper.register_caches(caches)

    def round_(s):
        tree = s.step(x, roots, prefix)
        acc = s.accept(verify_stand_in(tree, base))
        kept, _ = s.kept_slots(window)
        s.compact_kv(window)
        return acc, kept

    round_(stepper)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        acc, kept = round_(stepper)
    for seed in range(1, 4):
        _, nx_, nroots, nprefix, nbase = small_round(bs=8, budget=63, seed=seed)
        x.copy_(nx_), roots.copy_(nroots), prefix.copy_(nprefix), base.copy_(nbase)
        ref_caches = [c.clone() for c in caches]
        graph.replay()
        replayed = {n: getattr(acc, n).clone() for n in acc.__dataclass_fields__}
        host = stepper.readback(wait=True)
        for name in ("accept_len", "bonus", "accepted_tokens"):
            assert torch.equal(host[name], replayed[name].cpu()), name
        ref.register_caches(ref_caches)
        eager, ekept = round_(ref)
        for n, v in replayed.items():
            assert torch.equal(v, getattr(eager, n)), (seed, n)
        assert torch.equal(kept, ekept)
        for c, r in zip(caches, ref_caches, strict=True):
            assert torch.equal(c, r)
        assert (replayed["accept_len"] > 1).any()


def test_round_graphs_per_batch_size_bucket():
    stepper, x, roots, prefix, base = small_round(bs=8, budget=63)
    buckets = {}
    for bs in (4, 8):
        xb, rb, pb, tb = x[:bs].clone(), roots[:bs].clone(), prefix[:bs].clone(), base[:bs].clone()
        graph = stepper.capture(xb, rb, pb, lambda tree, tb=tb: verify_stand_in(tree, tb))
        buckets[bs] = (graph, xb, rb, pb, tb)
    for seed in (5, 6):
        _, nx_, nroots, nprefix, nbase = small_round(bs=8, budget=63, seed=seed)
        for bs, (graph, xb, rb, pb, tb) in buckets.items():
            xb.copy_(nx_[:bs]), rb.copy_(nroots[:bs]), pb.copy_(nprefix[:bs])
            tb.copy_(nbase[:bs])
            stepper.replay(bs)
            replayed = graph.acc.accepted_tokens.clone()
            host = stepper.readback(wait=True)
            assert torch.equal(host["accepted_tokens"], replayed.cpu())
            tree = ddtree.build_tree(xb, rb, pb, budget=63)
            eager = ddtree.accept_tree(tree, verify_stand_in(tree, tb))
            assert torch.equal(replayed, eager.accepted_tokens)


def test_readback_ring_reports_an_older_round_while_the_host_runs_ahead():
    stepper, x, roots, prefix, target = small_round(bs=16, vocab=151936, budget=255, depth=15)
    seen = []
    for _ in range(12):
        stepper.step(x, roots, prefix)
        acc = stepper.accept(target)
        host = stepper.readback()
        if host is not None:
            seen.append(host["round"])
    torch.cuda.synchronize()
    last = stepper.readback()
    assert last is not None and last["round"] == 11
    assert torch.equal(last["accepted_tokens"], acc.accepted_tokens.cpu())
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert stepper.readback() is None  # nothing new since


def test_graph_replays_keep_an_older_readback_while_a_newer_replay_runs():
    # Replay A finishes while replay B waits behind a spin kernel: A's tokens must be
    # readable (the replays write successive slots of the ring: its cursor is on the device).
    stepper, x, roots, prefix, base = small_round(bs=8, budget=63)
    stepper.capture(x, roots, prefix, lambda tree: verify_stand_in(tree, base))
    stepper.replay(8)
    a_tokens = stepper.replay(8).acc.accepted_tokens.clone()
    a_done = torch.cuda.Event()
    a_done.record()
    torch.cuda._sleep(200_000_000)  # ~0.1 s
    stepper.replay(8)
    a_done.synchronize()
    host = stepper.readback()
    assert host is not None, "replay A finished but its readback was not ready"
    assert torch.equal(host["accepted_tokens"], a_tokens.cpu())
    torch.cuda.synchronize()
    newest = stepper.readback()
    assert newest is not None and newest["round"] == host["round"] + 1


def test_readback_of_a_tree_shallower_than_the_stepper():
    stepper = ddtree.Stepper(max_batch=4, budget=15, depth=6, vocab=50, device=DEV)
    x = torch.randn(4, 2, 50, device=DEV)
    z = torch.zeros(4, dtype=torch.int64, device=DEV)
    stepper.step(x, z, z)
    acc = stepper.accept(torch.randn(4, 16, 50, device=DEV))
    host = stepper.readback(wait=True)
    assert host["accepted_tokens"].shape == (4, 3)
    assert torch.equal(host["accepted_tokens"], acc.accepted_tokens.cpu())
    assert torch.equal(host["accept_len"], acc.accept_len.cpu())


def test_buckets_and_eager_accepts_share_one_readback_ring():
    # Interleaved replays of two buckets and eager accepts: every readback is the round just
    # run, and the ring's slots hold the last READBACK_SLOTS rounds.
    stepper, x, roots, prefix, base = small_round(bs=8, budget=63)
    for bs in (4, 8):
        stepper.capture(
            x[:bs], roots[:bs], prefix[:bs], lambda tree, bs=bs: verify_stand_in(tree, base[:bs])
        )
    warm = stepper.readback(wait=True)  # the capture's warm-up rounds ran eagerly
    assert warm is not None and warm["round"] == 1
    held = []
    for bs in (4, 8, 8, 4, 0, 4, 8, 0):
        if bs:
            acc = stepper.replay(bs).acc
        else:
            stepper.step(x, roots, prefix)
            acc = stepper.accept(verify_stand_in(stepper._tree, base))
        host = stepper.readback(wait=True)
        assert torch.equal(host["accepted_tokens"], acc.accepted_tokens.cpu())
        held.append(host["round"])
    stamps = sorted(int(s) - 1 for s in stepper._ring.host[:, -1])
    assert held == list(range(2, 10)) and stamps == held[-4:]


def test_readback_does_not_block_and_accept_never_syncs():
    stepper, x, roots, prefix, target = small_round(bs=16, vocab=151936, budget=255, depth=15)
    stepper.step(x, roots, prefix)
    stepper.accept(target)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            stepper.step(x, roots, prefix)
            stepper.accept(target, temperature=0.8, top_k=50, top_p=0.9)
            stepper.readback()  # may be None: it never waits
    finally:
        torch.cuda.set_sync_debug_mode("default")
    host = stepper.readback(wait=True)
    assert host is not None and torch.equal(host["bonus"], stepper._acc.bonus.cpu())
    stats = torch.cuda.memory_stats()["allocation.all.allocated"]
    for _ in range(50):
        stepper.step(x, roots, prefix)
        stepper.accept(target, temperature=0.8, top_k=50, top_p=0.9)
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == stats


def test_stepper_kept_slots_of_a_tree_shallower_than_the_stepper():
    stepper = ddtree.Stepper(max_batch=4, budget=15, depth=6, vocab=50, device=DEV)
    z = torch.zeros(4, dtype=torch.int64, device=DEV)
    stepper.step(torch.randn(4, 2, 50, device=DEV), z, z)  # depth 2 < 6: paths of 3
    acc = stepper.accept(torch.randn(4, 16, 50, device=DEV))
    window = torch.arange(64, device=DEV).view(4, 16)
    kept, release = stepper.kept_slots(window)
    want, want_release = ddtree.kept_slots(on_acc(acc, "cpu"), window.cpu())
    assert kept.shape == (4, 3) and torch.equal(kept.cpu(), want)
    assert torch.equal(release.cpu(), want_release)


def on_acc(acc, device):
    return ddtree.Acceptance(
        **{n: getattr(acc, n).clone().to(device) for n in acc.__dataclass_fields__}
    )


def test_a_sampled_accept_tree_captured_in_the_callers_graph_replays_its_draws():
    # The functional accept_tree makes a fresh sampling state per call; inside a capture
    # that state is written on the device (no host copy, which a capture refuses), so each
    # replay restarts at the captured seed and draws what an eager call with it draws.
    rng = np.random.default_rng(9)
    tree, _, _, _ = random_round(rng)
    tree = on(tree, DEV)
    target = torch.randn(tree.batch_size, tree.width, 40, device=DEV) * 2
    temps = torch.full((tree.batch_size,), 1.5, device=DEV)
    acc = ddtree.accept_tree(tree, target, temperature=temps, top_k=10, generator=5)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        acc = ddtree.accept_tree(tree, target, temperature=temps, top_k=10, generator=5)
    graph.replay()
    first = acc.accepted_tokens.clone()
    graph.replay()
    assert torch.equal(first, acc.accepted_tokens)
    eager = ddtree.accept_tree(tree, target, temperature=temps, top_k=10, generator=5)
    assert torch.equal(first, eager.accepted_tokens)
