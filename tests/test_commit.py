"""SPEC stage 5 on the CPU: kept slots, in-place KV compaction with gaps, hidden gather."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ddtree


def random_round(rng, bs=5, depth=6, vocab=40, budget=30, device="cpu"):
    """A built tree, an acceptance along random paths (non-first siblings included), and a
    verify window of distinct KV slots per request (a random permutation: gaps everywhere)."""
    x = torch.from_numpy(rng.standard_normal((bs, depth, vocab)) * 4).float()  # deep trees
    z = torch.zeros(bs, dtype=torch.int64)
    tree = ddtree.build_tree(x, z, z + 100, budget=budget)
    target = torch.from_numpy(rng.standard_normal((bs, budget + 1, vocab))).float()
    for b in range(bs):  # plant posteriors that follow a random child for a few steps
        node = 0
        for _ in range(int(rng.integers(0, depth + 1))):
            kids = children(tree, b, node)
            if not kids:
                break
            child = kids[int(rng.integers(len(kids)))]
            target[b, node, tree.verify_ids[b, child]] = 50.0
            node = child
    acc = ddtree.accept_tree(tree.to(device) if device != "cpu" else tree, target.to(device))
    slots = bs * (budget + 1) + 17
    window = torch.from_numpy(rng.permutation(slots)[: bs * (budget + 1)].reshape(bs, -1))
    return tree, acc, window.to(device), slots


def children(tree, b, node):
    out, c = [], int(tree.first_child[b, node])
    while c >= 0:
        out.append(c)
        c = int(tree.next_sibling[b, c])
    return out


def test_kept_slots_and_release():
    rng = np.random.default_rng(1)
    _, acc, window, _ = random_round(rng)
    kept, release = ddtree.kept_slots(acc, window)
    for b in range(acc.batch_size):
        n = int(acc.accept_len[b])
        path = acc.accepted_nodes[b, :n]
        assert kept[b, :n].tolist() == window[b, path].tolist()
        assert (kept[b, n:] == -1).all()
        want = torch.ones(window.shape[1], dtype=torch.bool)
        want[path] = False
        assert torch.equal(release[b], want)
    assert (acc.accept_len > 2).any(), "the planted paths should be accepted"


@pytest.mark.parametrize("row_shape", [(2, 8), (1, 576)])  # K/V [heads, dim]; MLA latent
def test_compaction_moves_accepted_rows_to_the_window_start(row_shape):
    rng = np.random.default_rng(2)
    _, acc, window, slots = random_round(rng)
    caches = [torch.randn(slots, *row_shape) for _ in range(3)]
    before = [c.clone() for c in caches]
    ddtree.compact_kv(acc, window, caches)
    for c, old in zip(caches, before, strict=True):
        touched = torch.zeros(slots, dtype=torch.bool)
        for b in range(acc.batch_size):
            n = int(acc.accept_len[b])
            src = window[b, acc.accepted_nodes[b, :n]]
            dst = window[b, :n]
            assert torch.equal(c[dst], old[src])
            touched[dst] = True
        assert torch.equal(c[~touched], old[~touched])


def test_gather_hidden_in_path_order():
    rng = np.random.default_rng(3)
    tree, acc, _, _ = random_round(rng)
    bs, q = tree.verify_ids.shape
    hidden = torch.randn(bs * q, 16)
    out = ddtree.gather_hidden(acc, hidden)
    for b in range(bs):
        n = int(acc.accept_len[b])
        assert torch.equal(out[b, :n], hidden[b * q + acc.accepted_nodes[b, :n]])
        assert (out[b, n:] == 0).all()


def test_commit_arguments_are_checked():
    rng = np.random.default_rng(4)
    _, acc, window, slots = random_round(rng)
    with pytest.raises(ValueError, match="out_cache_loc"):
        ddtree.kept_slots(acc, window.int())
    with pytest.raises(ValueError, match="caches"):
        ddtree.compact_kv(acc, window, [torch.zeros(slots, 4), torch.zeros(slots, 8)])
    with pytest.raises(ValueError, match="hidden"):
        ddtree.gather_hidden(acc, torch.zeros(7, 3))


def test_the_cpu_stepper_commits_what_the_functional_api_commits():
    """Stepper.kept_slots / compact_kv / gather_hidden on the CPU follow its last accept."""
    rng = np.random.default_rng(5)
    bs, depth, vocab, budget = 4, 5, 30, 20
    stepper = ddtree.Stepper(bs, budget, depth, vocab, device="cpu")
    x = torch.from_numpy(rng.standard_normal((bs, depth, vocab)) * 4).float()
    roots = torch.zeros(bs, dtype=torch.int64)
    tree = stepper.step(x, roots, roots + 10)
    target = torch.from_numpy(rng.standard_normal((bs, budget + 1, vocab))).float()
    for b in range(bs):  # the root's first child is accepted
        target[b, 0, tree.verify_ids[b, 1]] = 50.0
    acc = stepper.accept(target)
    assert (acc.accept_len >= 2).all()
    slots = bs * (budget + 1) + 5
    window = torch.from_numpy(rng.permutation(slots)[: bs * (budget + 1)].reshape(bs, -1))
    for got, want in zip(stepper.kept_slots(window), ddtree.kept_slots(acc, window), strict=True):
        assert torch.equal(got, want)
    caches = [torch.randn(slots, 8), torch.randn(slots, 2, 4)]
    mine = [c.clone() for c in caches]
    stepper.register_caches(mine)
    stepper.compact_kv(window)
    ddtree.compact_kv(acc, window, caches)
    assert all(torch.equal(a, b) for a, b in zip(mine, caches, strict=True))
    hidden = torch.randn(bs * (budget + 1), 6)
    out = torch.empty(bs, depth + 1, 6)
    assert torch.equal(stepper.gather_hidden(hidden, out), ddtree.gather_hidden(acc, hidden))
    with pytest.raises(ValueError, match="out_cache_loc"):
        stepper.kept_slots(window[:, :-1])
