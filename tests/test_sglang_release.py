"""ddtree against SGLang 0.5.23's own code (its wheel's module files; see sglang_release.py).

The chain a drop-in runs through: ``ddtree.sglang.uno_proposal`` (in place of UNO's builder)
→ SGLang's ``build_tree_kernel_efficient`` (its Triton form) → SGLang's greedy tree verify →
its commit outputs. Each SGLang result must equal what ddtree's own emit, accept and
``eagle_verify_result`` give. On a machine without a GPU the Triton kernels run in Triton's
interpreter; with one (``tests/gpu_run.sh``) the same tests run compiled on CUDA.
"""

from __future__ import annotations

import ast
import inspect
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import sglang_release
import torch
from conftest import draft_logits

import ddtree
import ddtree.sglang as ds

PATCH = Path(__file__).resolve().parents[1] / "docs/patches/sglang-0.5.23-uno-ddtree.patch"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (bs, L, V, Q, K) — small enough for the interpreter, with ties and masked rows.
SHAPES = [(3, 4, 50, 12, 4), (2, 1, 40, 6, 5), (4, 3, 30, 17, 8), (1, 6, 64, 2, 2)]
KINDS = ("gaussian", "quantised", "all_equal", "masked")


@pytest.fixture(scope="module")
def spec_tree():
    return sglang_release.load("sglang.kernels.ops.speculative.spec_tree")


@pytest.fixture(scope="module")
def eagle_ops():
    return sglang_release.load("sglang.kernels.ops.speculative.eagle")


def case(seed: int, shape, kind: str):
    """Draft logits, roots, prefix lengths, the ddtree tree and its UNO-form proposal."""
    bs, depth, vocab, q, k = shape
    rng = np.random.default_rng(seed)
    x = draft_logits(rng, (bs, depth, vocab), kind).to(DEVICE)
    roots = torch.from_numpy(rng.integers(0, vocab, size=bs)).to(DEVICE)
    seq_lens = torch.from_numpy(rng.integers(0, 9, size=bs)).to(DEVICE)
    tree = ddtree.build_tree(x, roots, seq_lens, budget=q - 1, topk=k)
    proposal = ds.uno_proposal(roots, x, max_nodes=q, candidate_top_k=k)
    return x, roots, seq_lens, tree, proposal


def sglang_verify_inputs(spec_tree, proposal, seq_lens):
    """What ``build_eagle_verify_input`` builds from a proposal: SGLang's Triton kernel, into
    buffers prepared as its wrapper prepares them (mask pre-filled True, links −1)."""
    bs, q = seq_lens.shape[0], proposal.num_verify_tokens
    mask = torch.ones(int(seq_lens.sum()) * q + bs * q * q, dtype=torch.bool, device=DEVICE)
    positions = torch.empty(bs * q, dtype=torch.int64, device=DEVICE)
    index, next_token, next_sibling = torch.full((3, bs, q), -1, dtype=torch.int64, device=DEVICE)
    spec_tree.sgl_build_tree_kernel_triton(
        proposal.parent_list,
        proposal.top_scores_index,
        seq_lens,
        mask,
        positions,
        index,
        next_token,
        next_sibling,
        proposal.candidate_top_k,
        proposal.max_depth,
        q,
    )
    draft = torch.cat([proposal.root_tokens.unsqueeze(1), proposal.draft_tokens], 1).flatten()
    return {
        "draft_token": draft,
        "custom_mask": mask,
        "positions": positions,
        "retrieve_index": index,
        "retrieve_next_token": next_token,
        "retrieve_next_sibling": next_sibling,
    }


def parents_from_links(next_token: torch.Tensor, next_sibling: torch.Tensor) -> torch.Tensor:
    """int64 ``[bs, Q]``: each node's parent as SGLang's links say (−1: no parent)."""
    bs, q = next_token.shape
    parent = torch.full((bs, q), -1, dtype=torch.int64)
    first, sibling = next_token.cpu(), next_sibling.cpu()
    for b in range(bs):
        for p in range(q):
            child = int(first[b, p])
            while child != -1:
                parent[b, child] = p
                child = int(sibling[b, child])
    return parent


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
def test_sglang_builds_ddtree_tree_from_proposal(spec_tree, shape, kind):
    """SGLang's own tree build, fed ddtree's proposal, gives ddtree's emit: the same
    positions, FULL mask, retrieve links and tokens — on every real node; unused slots (rows
    whose logits allow fewer paths than Q − 1) become root children there, as documented."""
    for seed in range(3):
        _, _, seq_lens, tree, proposal = case(seed, shape, kind)
        if seed == 2:  # the proposal's own tree (zero prefixes) gives the same fields
            tree = proposal.tree
        theirs = sglang_verify_inputs(spec_tree, proposal, seq_lens)
        ours = ds.eagle_verify_fields(tree, seq_lens)
        assert ds.eagle_verify_fields(tree, seq_lens, mask=False)["custom_mask"] is None
        assert torch.equal(theirs["draft_token"], ours["draft_token"])
        assert torch.equal(theirs["retrieve_index"], ours["retrieve_index"])
        real = (tree.parents >= 0).cpu()
        real[:, 0] = True
        parent = parents_from_links(theirs["retrieve_next_token"], theirs["retrieve_next_sibling"])
        assert torch.equal(parent[real], tree.parents.cpu()[real])
        assert bool((parent[~real] == 0).all())
        if bool(real.all()):
            links = ("retrieve_next_token", "retrieve_next_sibling")
            for name in ("positions", "custom_mask", *links):
                assert torch.equal(theirs[name], ours[name]), name
        else:
            dims = tree.positions.shape
            pos, our_pos = theirs["positions"].view(dims), ours["positions"].view(dims)
            assert torch.equal(pos[real.to(DEVICE)], our_pos[real.to(DEVICE)])


def target_logits(seed: int, tree, vocab: int) -> torch.Tensor:
    """Target logits ``[bs, Q, V]`` whose argmax at a node is one of its children's tokens
    three times in four (deep walks), with exact ties elsewhere (lowest id must win)."""
    rng = np.random.default_rng(seed + 100)
    bs, q = tree.verify_ids.shape
    t = rng.integers(-3, 3, size=(bs, q, vocab)).astype(np.float32)
    ids, parents = tree.verify_ids.cpu().numpy(), tree.parents.cpu().numpy()
    for b in range(bs):
        for i in range(1, q):
            p = parents[b, i]
            if p >= 0 and rng.random() < 0.75:
                t[b, p, ids[b, i]] = 5.0 + rng.integers(0, 2)
    return torch.from_numpy(t).to(DEVICE)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ("gaussian", "quantised", "masked"))
def test_sglang_greedy_verify_accepts_what_ddtree_accepts(spec_tree, eagle_ops, shape, kind):
    """SGLang's greedy tree verify (argmax, then ``verify_tree_greedy``) and its commit
    outputs, on ddtree's verify inputs, equal ddtree's accept through
    ``eagle_verify_result``: ``predict``, ``accept_index``, ``accept_lens``, new lengths,
    bonus tokens."""
    for seed in range(3):
        x, _, seq_lens, tree, _ = case(seed, shape, kind)
        target = target_logits(seed, tree, x.shape[2])
        acc = ddtree.accept_tree(tree, target)
        ours = ds.eagle_verify_result(acc, tree, seq_lens)
        fields = ds.eagle_verify_fields(tree, seq_lens)
        outputs = sglang_release.greedy_outputs(*tree.verify_ids.shape, tree.depth, DEVICE)
        predict, accept_index, drafts = sglang_release.greedy_verify(
            spec_tree, fields, target, outputs
        )
        assert torch.equal(predict, ours["predict"])
        assert torch.equal(accept_index, ours["accept_index"])
        assert torch.equal(drafts + 1, ours["accept_lens"])
        new_lens, bonus = eagle_ops.prepare_verify_commit_outputs(
            predict, accept_index, drafts + 1, seq_lens
        )
        assert torch.equal(new_lens, ours["new_seq_lens"])
        assert torch.equal(bonus, ours["bonus_tokens"])


def kv_move_case(seed: int, kind: str):
    """An acceptance and a verify window of KV slots (slot 0 left out: SGLang's dummy)."""
    x, _, _, tree, _ = case(seed, SHAPES[2], kind)
    acc = ddtree.accept_tree(tree, target_logits(seed, tree, x.shape[2]))
    bs, q = tree.verify_ids.shape
    out_cache_loc = 1 + torch.randperm(bs * q, device=DEVICE)
    return acc, out_cache_loc, bs * acc.path_len, int(acc.accept_len.sum())


def test_sglang_kv_move_sources_are_ddtree_kept_slots(eagle_ops):
    """The rows SGLang's ``move_accept_tokens_to_target_kvcache`` moves
    (``fill_accept_out_cache_loc``): ddtree's kept slots, in path order, packed."""
    for seed, kind in enumerate(KINDS):
        acc, out_cache_loc, size, n = kv_move_case(seed, kind)
        sources = torch.zeros(size, dtype=torch.int64, device=DEVICE)
        index = acc.accept_index.to(torch.int32)
        eagle_ops.fill_accept_out_cache_loc_func(index, out_cache_loc, sources, size)
        kept, _ = ddtree.kept_slots(acc, out_cache_loc.view(acc.batch_size, -1))
        assert torch.equal(sources[:n], kept[kept >= 0])
        assert not bool(sources[n:].any())


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="its kernel's data-dependent loop needs a GPU")
def test_sglang_kv_move_targets_are_where_compact_kv_writes():
    """Where SGLang moves them (``fill_front_out_cache_loc_func``): each request's first
    ``accept_len`` window slots, where ``ddtree.compact_kv`` writes the kept rows."""
    try:
        cache_locs = sglang_release.load("sglang.kernels.ops.speculative.cache_locs")
    except subprocess.CalledProcessError:  # no files here and no network (the GPU machine)
        pytest.skip("SGLang 0.5.23's files could not be had: carry tests/.sglang-0.5.23")
    for seed, kind in enumerate(KINDS):
        acc, out_cache_loc, size, n = kv_move_case(seed, kind)
        targets = torch.zeros(size, dtype=torch.int64, device=DEVICE)
        lens = acc.accept_len.to(torch.int32)
        cache_locs.fill_front_out_cache_loc_func(lens, out_cache_loc, targets)
        window = out_cache_loc.view(acc.batch_size, -1)
        front = torch.cat([window[b, : int(lens[b])] for b in range(acc.batch_size)])
        assert torch.equal(targets[:n], front)
        assert not bool(targets[n:].any())


def test_full_chain_through_sglang_build_when_no_slot_is_unused(spec_tree):
    """Proposal → SGLang's build → SGLang's verify: the path ddtree's accept takes."""
    shape = (4, 5, 60, 20, 5)
    for seed in range(4):
        x, _, seq_lens, tree, proposal = case(seed, shape, "gaussian")
        assert bool((tree.num_nodes == shape[3] - 1).all())
        inputs = sglang_verify_inputs(spec_tree, proposal, seq_lens)
        target = target_logits(seed, tree, x.shape[2])
        ours = ds.eagle_verify_result(ddtree.accept_tree(tree, target), tree, seq_lens)
        outputs = sglang_release.greedy_outputs(*tree.verify_ids.shape, tree.depth, DEVICE)
        predict, accept_index, _ = sglang_release.greedy_verify(spec_tree, inputs, target, outputs)
        assert torch.equal(accept_index, ours["accept_index"])
        assert torch.equal(predict, ours["predict"])


def test_proposal_encoding_by_hand():
    """A two-depth case worked out by hand: edges are parent·K + rank, parent_list[p] holds
    node p's edge, −1 elsewhere."""
    x = torch.full((1, 2, 6), -30.0)
    x[0, 0, 4], x[0, 0, 2] = 3.0, 2.0  # depth 1: token 4 (rank 0), token 2 (rank 1)
    x[0, 1, 5], x[0, 1, 1] = 3.0, 2.9  # depth 2: token 5 (rank 0), token 1 (rank 1)
    p = ds.uno_proposal(torch.tensor([0]), x, max_nodes=5, candidate_top_k=3)
    # Scores: [4]≈-0.31, [4,5]≈-0.99, [4,1]≈-1.05, [2]≈-1.31 → nodes 1..4; K = 3.
    assert p.draft_tokens.tolist() == [[4, 5, 1, 2]]
    assert p.top_scores_index.tolist() == [[0, 3, 4, 1]]
    assert p.parent_list.tolist() == [[-1, 0, 3, 4]]  # K·(L−1)+1 = 4 wide
    assert (p.candidate_top_k, p.max_depth, p.num_verify_tokens) == (3, 2, 5)
    with pytest.raises(ValueError, match="parent_list"):  # K = 2: 3 wide, 4 nodes
        ds.uno_proposal(torch.tensor([0]), x, max_nodes=5, candidate_top_k=2)


def test_patch_applies_to_the_release_and_keeps_the_call(tmp_path):
    """docs/patches' change applies to the wheel's files: uno_worker_v2.py's builder import
    becomes ``uno_proposal``, whose parameters cover every argument of the call it
    redirects; the start-up check's UNO-only limits (Q ≤ 128, Q·K ≤ 2048) become Q ≤ 1024."""
    worker = "sglang/srt/speculative/uno_worker_v2.py"
    hook = "sglang/srt/arg_groups/speculative_hook.py"
    for name in (worker, hook):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(sglang_release.source(name))
    tool = shutil.which("patch")
    if tool is None:
        pytest.fail("the `patch` tool is needed to check docs/patches (apt install patch)")
    subprocess.run([tool, "-p1", "-s", "-i", str(PATCH)], cwd=tmp_path, check=True)
    patched = ast.parse((tmp_path / worker).read_text())
    imports = [
        (n.module, a.name, a.asname)
        for n in ast.walk(patched)
        if isinstance(n, ast.ImportFrom)
        for a in n.names
    ]
    assert ("ddtree.sglang", "uno_proposal", "build_uno_tree_proposal") in imports
    assert not any(m and m.endswith("uno_tree") for m, _, _ in imports)
    calls = [
        n
        for n in ast.walk(patched)
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "build_uno_tree_proposal"
    ]
    assert calls
    takes = inspect.signature(ds.uno_proposal).parameters
    for call in calls:
        assert len(call.args) == 2
        assert {k.arg for k in call.keywords} <= set(takes)
    checks = (tmp_path / hook).read_text()
    assert "verify_width > 1024" in checks and "verify_width > 128" not in checks
    assert "frontier_slots" not in checks


def test_uno_proposal_refuses_what_eagle_cannot_encode():
    x = torch.randn(2, 3, 40)
    roots = torch.tensor([1, 2])
    cases = [
        (dict(max_nodes=12, candidate_top_k=2), "max_nodes: EAGLE's parent_list"),
        (dict(max_nodes=30, candidate_top_k=2), "max_nodes: a tree of depth 3"),
        (dict(max_nodes=8, candidate_top_k=41), "candidate_top_k: 41 exceeds"),
        (dict(max_nodes=0, candidate_top_k=2), "max_nodes: must be ≥ 1"),
        (dict(max_nodes=1025, candidate_top_k=40), "max_nodes: must be ≤ 1024"),
        (dict(max_nodes=8, candidate_top_k=4, temperature=torch.ones(3)), "temperature: shape"),
        (dict(max_nodes=8, candidate_top_k=4, temperature="hot"), "temperature: expected"),
    ]
    for kwargs, message in cases:
        with pytest.raises((TypeError, ValueError)) as e:
            ds.uno_proposal(roots, x, **kwargs)
        assert str(e.value).startswith(message), str(e.value)
    with pytest.raises(TypeError, match="^root_tokens: dtype"):
        ds.uno_proposal(roots.float(), x, max_nodes=8, candidate_top_k=4)
    with pytest.raises(ValueError, match=r"^root_tokens: shape must be \[2\]"):
        ds.uno_proposal(roots[:1], x, max_nodes=8, candidate_top_k=4)
    with pytest.raises(ValueError, match="^seq_lens: shape"):
        tree = ddtree.build_tree(x, roots, [0, 0], budget=4)
        ds.eagle_verify_result(ddtree.accept_tree(tree, torch.randn(2, 5, 40)), tree, roots[:1])


def test_uno_proposal_single_node_and_depth_one():
    """Q = 1: no draft nodes (UNO's behaviour). L = 1: every node a root child, Q − 1 ≤ K."""
    x = torch.randn(2, 1, 30)
    roots = torch.tensor([3, 4], dtype=torch.int32)
    p = ds.uno_proposal(roots, x, max_nodes=1, candidate_top_k=3)
    assert p.draft_tokens.shape == (2, 0) and p.parent_list.tolist() == [[-1], [-1]]
    p = ds.uno_proposal(roots, x, max_nodes=4, candidate_top_k=3)
    assert p.top_scores_index.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert torch.equal(p.draft_tokens, torch.topk(x[:, 0], 3).indices)


@pytest.mark.parametrize("budget, topk", [(11, None), (2, None), (6, 1)])
def test_eagle_verify_result_compacts_the_path_to_the_front_as_sglang_does(budget, topk):
    """``next_token_ids``: each request's path entries of ``predict`` moved to the front of
    its Q slots (padding entries read global slot 0, as ``_compact_accept_to_front``'s clamp
    does), the rest as they were; for a chain (K = 1) SGLang skips the move. Q below L + 1
    (budget 2, depth 4) keeps the move inside the Q slots."""
    x = draft_logits(np.random.default_rng(3), (3, 4, 30), "gaussian").to(DEVICE)
    seq_lens = torch.tensor([4, 0, 9], device=DEVICE)
    tree = ddtree.build_tree(x, torch.tensor([1, 2, 3], device=DEVICE), seq_lens,
                             budget=budget, topk=topk)  # fmt: skip
    acc = ddtree.accept_tree(tree, target_logits(0, tree, 30))
    r = ds.eagle_verify_result(acc, tree, seq_lens)
    bs, q = tree.verify_ids.shape
    want = r["predict"].clone()
    if tree.topk_ids.shape[2] > 1:
        width = min(acc.path_len, q)
        index = r["accept_index"][:, :width].long().clamp(min=0)
        want.view(bs, q)[:, :width] = r["predict"][index.reshape(-1)].view(bs, width)
    assert torch.equal(r["next_token_ids"], want)
    assert torch.equal(r["new_seq_lens"], seq_lens + acc.accept_len)
    assert torch.equal(r["bonus_tokens"], acc.bonus.to(torch.int32))
