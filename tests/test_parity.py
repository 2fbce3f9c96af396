"""Rust CPU path == ddtree.reference, bit for bit (SPEC stages 1–4), on random batches."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import KINDS, draft_logits

import ddtree
from ddtree import _cpu, reference

BUDGETS = (1, 2, 16, 31, 32, 33, 64, 255, 1023)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The fields stages 2-3 write (stage 1's top-K and the status are compared on their own).
TREE_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(ddtree.Tree)
    if f.name not in ("topk_logprobs", "topk_ids", "status")
)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in fp32 ulps (finite values of equal sign; inf == inf gives 0)."""
    ai = a.view(np.int32).astype(np.int64)
    bi = b.view(np.int32).astype(np.int64)
    return np.abs(ai - bi)


def reference_tree(x: torch.Tensor, roots, prefix, budget: int, topk, rust: ddtree.Tree):
    """The reference tree of every request, and how many rows' Z differed by one ulp.

    SPEC: Z may differ by 1 fp32 ulp between implementations, so LP is compared first, and
    the reference selection then runs on the Rust LP (any other difference fails).
    """
    xs = x.float().numpy()
    bs, depth, vocab = xs.shape
    k = min(budget, vocab, topk or budget)
    rust_lp = rust.topk_logprobs.numpy()
    rows, z_diffs = [], 0
    for b in range(bs):
        c = reference.candidates(xs[b], k)
        np.testing.assert_array_equal(c.ids, rust.topk_ids[b].numpy(), err_msg=f"TI, request {b}")
        lp = c.logprobs
        if not np.array_equal(lp.view(np.int32), rust_lp[b].view(np.int32)):
            assert ulp_distance(lp, rust_lp[b]).max() <= 1, f"LP beyond 1 ulp, request {b}"
            z_diffs += 1
            lp = rust_lp[b]
        nodes = [] if c.rejected else reference.select(lp, c.eligible, budget)
        t = reference.emit(nodes, c.ids, int(roots[b]), int(prefix[b]), budget)
        t["num_nodes"] = len(nodes)
        t["status"] = reference.STATUS_NON_FINITE if c.rejected else reference.STATUS_OK
        rows.append(t)
    return {key: np.stack([np.asarray(r[key]) for r in rows]) for key in rows[0]}, z_diffs


def assert_same_tree(ref: dict, rust: ddtree.Tree) -> None:
    for name in TREE_FIELDS:
        want = ref[name]
        got = getattr(rust, name).numpy()
        if want.dtype == np.float64:  # bit-exact, -inf pads included
            want, got = want.view(np.int64), got.view(np.int64)
        np.testing.assert_array_equal(got, want, err_msg=name)
    np.testing.assert_array_equal(rust.status.numpy(), ref["status"])


def random_case(rng: np.random.Generator, case: int):
    kind = KINDS[case % len(KINDS)]
    budget = BUDGETS[case % len(BUDGETS)] if case % 3 else int(rng.integers(1, 80))
    depth = int(rng.integers(1, 16))
    vocab = int(rng.choice([2, 5, 17, 64, 300, 1000]))
    bs = int(rng.integers(1, 4))
    topk = None if case % 4 else int(rng.integers(1, 12))
    if budget >= 255:  # keep the pure-Python heap affordable
        depth, bs = min(depth, 6), 1
    dtype = DTYPES[case % len(DTYPES)]
    return kind, (bs, depth, vocab), budget, topk, dtype


def build_both(rng, kind, shape, budget, topk, dtype, nan_rows=False):
    x = draft_logits(rng, shape, kind, dtype)
    bs, _, vocab = shape
    if nan_rows and bs > 1:
        x[1, 0, 0] = float("nan") if rng.integers(2) else float("inf")
    roots = torch.from_numpy(rng.integers(0, vocab, size=bs))
    prefix = torch.from_numpy(rng.integers(0, 5000, size=bs))
    rust = ddtree.build_tree(x, roots, prefix, budget=budget, topk=topk)
    ref, z_diffs = reference_tree(x, roots, prefix, budget, topk, rust)
    return x, rust, ref, z_diffs


@pytest.mark.parametrize("chunk", range(10))
def test_build_matches_reference_on_random_batches(chunk):
    """10 chunks x 55 cases = 550 random batches."""
    rng = np.random.default_rng(100 + chunk)
    for case in range(55):
        kind, shape, budget, topk, dtype = random_case(rng, case)
        _, rust, ref, _ = build_both(rng, kind, shape, budget, topk, dtype, nan_rows=case % 7 == 0)
        assert_same_tree(ref, rust)


@pytest.mark.parametrize("kind", ["gaussian", "peaked", "quantised"])
def test_build_matches_reference_at_full_qwen_vocab(kind):
    rng = np.random.default_rng(7)
    _, rust, ref, z_diffs = build_both(rng, kind, (1, 3, 151936), 255, None, torch.bfloat16)
    assert_same_tree(ref, rust)
    assert z_diffs == 0


def test_build_reads_strided_views_in_place(rng):
    base = draft_logits(rng, (3, 7, 400), "quantised", torch.bfloat16)
    views = [base[:, 1:, :], base[:, :, ::2], base.transpose(0, 1)[:4].transpose(0, 1)]
    for x in views:
        bs, _, vocab = x.shape
        roots = torch.zeros(bs, dtype=torch.int64)
        prefix = torch.arange(bs, dtype=torch.int64)
        got = ddtree.build_tree(x, roots, prefix, budget=40, topk=5)
        want = ddtree.build_tree(x.contiguous(), roots, prefix, budget=40, topk=5)
        for name in TREE_FIELDS + ("topk_logprobs", "topk_ids"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name


def test_non_finite_rows_give_an_empty_tree_and_status(rng):
    x = draft_logits(rng, (4, 3, 50), "gaussian")
    x[1, 2, 7] = float("nan")
    x[3, 0, 0] = float("inf")
    tree = ddtree.build_tree(
        x, torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64), budget=9
    )
    assert tree.status.tolist() == [0, ddtree.STATUS_NON_FINITE, 0, ddtree.STATUS_NON_FINITE]
    assert tree.num_nodes.tolist() == [9, 0, 9, 0]
    assert (tree.parents[1] == -1).all() and (tree.topk_ids[1] == -1).all()
    clean = ddtree.build_tree(
        x[[0, 2]], torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), budget=9
    )
    assert torch.equal(clean.verify_ids, tree.verify_ids[[0, 2]])


def chosen_target(rng, tree: ddtree.Tree, vocab: int) -> torch.Tensor:
    """Target logits whose greedy posterior often matches a child (not always the first)."""
    bs, q = tree.verify_ids.shape
    target = torch.from_numpy(rng.standard_normal((bs, q, vocab)).astype(np.float32))
    parents = tree.parents.numpy()
    ids = tree.verify_ids.numpy()
    for b in range(bs):
        for i in range(q):
            kids = np.flatnonzero(parents[b] == i)
            if kids.size and rng.random() < 0.85:
                pick = kids[0] if rng.random() < 0.6 else rng.choice(kids)
                target[b, i, ids[b, pick]] = 50.0
    return target


@pytest.mark.parametrize("chunk", range(4))
def test_greedy_accept_matches_reference(chunk):
    rng = np.random.default_rng(900 + chunk)
    lengths = []
    for case in range(40):
        kind, shape, budget, topk, dtype = random_case(rng, case)
        budget = min(budget, 64)
        x, rust, _, _ = build_both(rng, kind, shape, budget, topk, dtype)
        target = chosen_target(rng, rust, shape[2]).to(dtype)
        acc = ddtree.accept_tree(rust, target)
        tree_np = {
            k: getattr(rust, k).numpy() for k in ("verify_ids", "first_child", "next_sibling")
        }
        tree_np["topk_ids"] = rust.topk_ids.numpy()
        want = reference.accept_greedy(tree_np, target)
        for name in ("accepted_nodes", "accepted_tokens", "accept_len", "bonus", "accept_index"):
            np.testing.assert_array_equal(getattr(acc, name).numpy(), want[name], err_msg=name)
        lengths.extend(acc.accept_len.tolist())
    assert max(lengths) >= 4, "the walks must go deep, or this test checks little"


def test_visibility_and_full_mask_match_reference(rng):
    for budget in (1, 31, 32, 33, 64):
        _, rust, ref, _ = build_both(rng, "quantised", (3, 4, 30), budget, None, torch.float32)
        vis = rust.visibility().numpy()
        for b in range(3):
            np.testing.assert_array_equal(vis[b], reference.visibility(ref["ancestor_bits"][b]))
        seq_lens = torch.tensor([0, 5, 17])
        want = reference.sglang_custom_mask(ref["ancestor_bits"], seq_lens.tolist())
        np.testing.assert_array_equal(rust.sglang_custom_mask(seq_lens).numpy(), want)
        out = torch.zeros(want.size + 10, dtype=torch.bool)
        got = rust.sglang_custom_mask(seq_lens, out=out)
        assert got.data_ptr() == out.data_ptr()
        np.testing.assert_array_equal(got.numpy(), want)
        assert not out[want.size :].any()


def test_stages_2_3_alone_rebuild_the_same_tree(rng):
    """The stage-2/3 entry (used to time them apart) reproduces build_tree from its own
    stage-1 results, rejected requests included."""
    from ddtree import _cpu

    x = draft_logits(rng, (4, 5, 300), "quantised", torch.bfloat16)
    x[2, 1, 7] = float("nan")
    roots, prefix = torch.arange(4), torch.arange(4) * 10
    want = ddtree.build_tree(x, roots, prefix, budget=64, topk=9)
    got = ddtree.Tree(**{n: getattr(want, n).clone() for n in want.__dataclass_fields__})
    for name in TREE_FIELDS:
        getattr(got, name).fill_(7)
    eligible = torch.isfinite(want.topk_logprobs).sum(-1).to(torch.int32).flatten()
    eligible[want.status.repeat_interleave(5) != 0] = -1
    _cpu.select_emit(got, eligible, roots, prefix, vocab=300)
    for name in TREE_FIELDS + ("status", "topk_ids"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


def test_walk_with_given_tokens_equals_the_greedy_walk(rng):
    from ddtree import _buffers

    _, tree, _, _ = build_both(rng, "quantised", (3, 6, 40), 64, None, torch.float32)
    target = chosen_target(rng, tree, 40)
    want = ddtree.accept_tree(tree, target)
    tokens = target.argmax(-1)  # first maximum, as SPEC's greedy posterior
    got = _buffers.new_acceptance(3, 6, "cpu")
    _cpu.accept_tokens_into(tree, tokens.contiguous(), got)
    for name in want.__dataclass_fields__:
        assert torch.equal(getattr(got, name), getattr(want, name)), name
