"""The reference against a brute-force enumeration of every rank path (SPEC stage 2)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from conftest import KINDS, draft_logits

from ddtree import reference


def brute_force(lp: np.ndarray, eligible: np.ndarray, budget: int):
    depth = lp.shape[0]
    paths = []
    for d in range(1, depth + 1):
        ranges = [range(int(eligible[i])) for i in range(d)]
        paths.extend(itertools.product(*ranges))
    scored = [(reference.path_score(lp, p), p) for p in paths]
    scored.sort(key=lambda sp: (-sp[0], sp[1]))
    return scored[:budget]


@pytest.mark.parametrize("kind", KINDS)
def test_selection_equals_brute_force(kind):
    rng = np.random.default_rng(hash(kind) % 2**32)
    for _ in range(60):
        depth, vocab = int(rng.integers(1, 5)), int(rng.integers(1, 6))
        budget = int(rng.integers(1, 50))
        k = min(budget, vocab)
        x = draft_logits(rng, (1, depth, vocab), kind)[0].numpy()
        c = reference.candidates(x, k)
        got = [(n.score, n.path) for n in reference.select(c.logprobs, c.eligible, budget)]
        assert got == brute_force(c.logprobs, c.eligible, budget)


def test_candidates_rank_order_breaks_ties_by_id():
    c = reference.candidates(np.array([[1.0, 3.0, 3.0, -np.inf, 3.0]], np.float32), 5)
    assert c.ids[0].tolist() == [1, 2, 4, 0, 3]
    assert c.eligible.tolist() == [4]
    assert np.isneginf(c.logprobs[0, 4])


def test_emit_pads_and_links():
    x = torch.tensor([[[0.0, -1.0], [0.0, -3.0]]])
    tree = reference.build_tree(x, [9], [4], budget=5)
    # LP: depth 1 ≈ (-0.31, -1.31), depth 2 ≈ (-0.05, -3.05); by score the nodes are
    # (0) -0.31, (0,0) -0.36, (1) -1.31, (1,0) -1.36, (0,1) -3.36.
    assert tree["parents"][0].tolist() == [-1, 0, 1, 0, 3, 1]
    assert tree["depths"][0].tolist() == [0, 1, 2, 1, 2, 2]
    assert tree["positions"][0].tolist() == [4, 5, 6, 5, 6, 6]
    assert tree["first_child"][0].tolist() == [1, 2, -1, 4, -1, -1]
    assert tree["next_sibling"][0].tolist() == [-1, 3, 5, -1, -1, -1]
    assert tree["verify_ids"][0].tolist() == [9, 0, 0, 1, 0, 1]


def test_walk_and_commit():
    x = torch.tensor([[[0.0, -1.0], [0.0, -3.0]]])
    tree = {k: v[0] for k, v in reference.build_tree(x, [9], [4], budget=5).items()}
    # Posterior: root → token 1 (node 3), node 3 → token 0 (node 4), node 4 → token 7.
    posterior = {0: 1, 3: 0, 4: 7}
    path, bonus = reference.walk(tree, posterior)
    assert (path, bonus) == ([0, 3, 4], 7)
    acc = reference.accept(tree, posterior, depth=2, request=2)
    assert acc["accept_index"].tolist() == [12, 15, 16]
    done = reference.commit(acc["accepted_nodes"], np.arange(100, 106), prefix_len=4)
    assert done == {
        "kept_slots": [100, 103, 104],
        "released_slots": [101, 102, 105],
        "prefix_len": 7,
    }
