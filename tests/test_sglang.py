"""ddtree.sglang: a Tree / Acceptance as SGLang's EAGLE tree-verify tensors (CPU).

The conformance test feeds ``verify_input``'s tensors to a line-by-line Python port of
sgl-kernel's ``VerifyTreeGreedy`` (sgl-kernel/csrc/speculative/eagle_utils.cu) and checks
that it returns exactly what ``verify_output`` derives from ddtree's own acceptance."""

from __future__ import annotations

import pytest
import torch

import ddtree
import ddtree.sglang as sg
from ddtree import Acceptance, Tree


def sglang_verify_tree_greedy(candidates, retrive_index, next_token, next_sibling, target, steps):
    """Port of sgl-kernel's VerifyTreeGreedy (one request per block there, a loop here).
    ``predicts`` starts at −1 (SGLang allocates it with torch.empty: unwritten entries are
    garbage there); ``accept_index`` starts at −1 as eagle_info.py allocates it."""
    bs, nd = candidates.shape
    predicts = [-1] * (bs * nd + 1)
    accept_index = [[-1] * (steps + 1) for _ in range(bs)]
    accept_num = [0] * bs
    cand, ridx = candidates.tolist(), retrive_index.tolist()
    nxt, sib, tgt = next_token.tolist(), next_sibling.tolist(), target.reshape(-1).tolist()
    for bx in range(bs):
        last = ridx[bx][0]
        accept_index[bx][0] = last
        n, cur = 0, 0
        for _ in range(1, steps + 1):
            cur = nxt[bx][cur]
            while cur != -1:
                draft_index = ridx[bx][cur]
                if cand[bx][cur] == tgt[last]:
                    predicts[last] = tgt[last]
                    n += 1
                    accept_index[bx][n] = draft_index
                    last = draft_index
                    break
                cur = sib[bx][cur]
            if cur == -1:
                break
        accept_num[bx] = n
        predicts[last] = tgt[last]
    return predicts, accept_index, accept_num


def children_by_links(first_child, next_sibling, i):
    out, c = [], first_child[i]
    while c != -1:
        out.append(c)
        c = next_sibling[c]
    return out


def ancestors_or_self(parents, i):
    out = {i}
    while parents[i] >= 0:
        i = parents[i]
        out.add(i)
    return out


def hand_tree() -> Tree:
    """Two requests of one 3-level tree, Q = 7 (budget 6), node 6 padding:

    0 (10) ─┬─ 1 (11) ─┬─ 3 (13) ── 5 (15)
            │          └─ 4 (14)
            └─ 2 (12)
    """
    parents = [-1, 0, 0, 1, 1, 3, -1]
    depths = [0, 1, 1, 2, 2, 3, 0]
    tokens = [10, 11, 12, 13, 14, 15, 0]
    q, bs = 7, 2
    prefix = torch.tensor([2, 1])
    bits = torch.zeros(q, 1, dtype=torch.int32)
    for i in range(q):
        for j in ancestors_or_self(parents, i) if i <= 5 else {i}:
            bits[i, 0] |= 1 << j

    def rows(v, dtype=torch.int64):
        return torch.tensor([v] * bs, dtype=dtype)

    return Tree(
        verify_ids=rows(tokens),
        positions=prefix.unsqueeze(1) + rows(depths),
        depths=rows(depths),
        parents=rows(parents),
        first_child=rows([1, 3, -1, 5, -1, -1, -1]),
        next_sibling=rows([-1, 2, -1, 4, -1, -1, -1]),
        ancestor_bits=bits.expand(bs, q, 1).contiguous(),
        num_nodes=torch.tensor([5, 5]),
        scores=torch.zeros(bs, q, dtype=torch.float64),
        topk_logprobs=torch.zeros(bs, 3, 2),
        topk_ids=torch.zeros(bs, 3, 2, dtype=torch.int64),
        status=torch.zeros(bs, dtype=torch.int32),
    )


def greedy_logits(argmax: list[dict[int, int]], q: int, vocab: int) -> torch.Tensor:
    logits = torch.zeros(len(argmax), q, vocab)
    for b, per_node in enumerate(argmax):
        for node, tok in per_node.items():
            logits[b, node, tok] = 5.0
    return logits


def real_tree(seed: int):
    g = torch.Generator().manual_seed(seed)
    bs, depth, vocab = 3, 4, 16
    draft = torch.randn(bs, depth, vocab, generator=g) * 2
    roots = torch.randint(0, vocab, (bs,), generator=g)
    prefix = torch.tensor([5, 0, 9])
    tree = ddtree.build_tree(draft, roots, prefix, budget=12)
    # Target logits that often agree with a child, so paths run deep.
    target = torch.randn(bs, tree.width, vocab, generator=g)
    for b in range(bs):
        for i in range(tree.width):
            kids = children_by_links(tree.first_child[b].tolist(), tree.next_sibling[b].tolist(), i)
            if kids and torch.rand((), generator=g) < 0.8:
                pick = kids[int(torch.randint(0, len(kids), (), generator=g))]
                target[b, i, tree.verify_ids[b, pick]] = 50.0
    return tree, prefix, target


# --- verify_input ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_lcrs_links_visit_each_nodes_children_in_order(seed):
    tree, prefix, _ = real_tree(seed)
    vi = sg.verify_input(tree, prefix)
    for b in range(tree.batch_size):
        nxt = vi["retrive_next_token"][b].tolist()
        sib = vi["retrive_next_sibling"][b].tolist()
        parents = tree.parents[b].tolist()
        n = int(tree.num_nodes[b])
        for i in range(tree.width):
            want = [j for j in range(1, n + 1) if parents[j] == i] if i <= n else []
            assert children_by_links(nxt, sib, i) == want


def test_hand_tree_links_index_and_fields():
    tree = hand_tree()
    vi = sg.verify_input(tree, torch.tensor([2, 1]))
    assert vi["retrive_next_token"].tolist() == [[1, 3, -1, 5, -1, -1, -1]] * 2
    assert vi["retrive_next_sibling"].tolist() == [[-1, 2, -1, 4, -1, -1, -1]] * 2
    assert vi["retrive_index"].tolist() == [list(range(7)), list(range(7, 14))]
    assert vi["draft_token"].tolist() == [10, 11, 12, 13, 14, 15, 0] * 2
    assert vi["positions"].tolist() == [2, 3, 3, 4, 4, 5, 2, 1, 2, 2, 3, 3, 4, 1]
    assert (vi["draft_token_num"], vi["spec_steps"], vi["topk"]) == (7, 3, 2)
    assert vi["retrive_cum_len"] is None
    for key in ("draft_token", "positions", "retrive_index", "retrive_next_token"):
        assert vi[key].dtype == torch.int64
    assert vi["custom_mask"].dtype == torch.bool
    assert vi["draft_token"].shape == (14,) and vi["retrive_index"].shape == (2, 7)


def mask_blocks(mask, seq_lens, q):
    off = 0
    for p in seq_lens:
        yield mask[off : off + q * (p + q)].view(q, p + q)
        off += q * (p + q)
    assert off == mask.numel()


def test_hand_tree_mask_rows():
    tree = hand_tree()
    mask = sg.verify_input(tree, torch.tensor([2, 1]))["custom_mask"]
    assert mask.numel() == 7 * 9 + 7 * 8
    block0, block1 = mask_blocks(mask, [2, 1], 7)
    assert block0[3].int().tolist() == [1, 1] + [1, 1, 0, 1, 0, 0, 0]
    assert block0[5].int().tolist() == [1, 1] + [1, 1, 0, 1, 0, 1, 0]
    assert block0[2].int().tolist() == [1, 1] + [1, 0, 1, 0, 0, 0, 0]
    assert block1[4].int().tolist() == [1] + [1, 1, 0, 0, 1, 0, 0]
    # Padding row: its prefix and itself (unreachable; keeps the softmax non-empty).
    assert block1[6].int().tolist() == [1] + [0, 0, 0, 0, 0, 0, 1]


@pytest.mark.parametrize("seed", range(3))
def test_mask_rows_are_prefix_then_ancestors(seed):
    tree, prefix, _ = real_tree(seed)
    q = tree.width
    mask = sg.verify_input(tree, prefix)["custom_mask"]
    for b, block in enumerate(mask_blocks(mask, prefix.tolist(), q)):
        p = int(prefix[b])
        parents = tree.parents[b].tolist()
        n = int(tree.num_nodes[b])
        assert block[:, :p].all()
        for i in range(q):
            want = ancestors_or_self(parents, i) if i <= n else {i}
            assert {j for j in range(q) if block[i, p + j]} == want


def test_mask_without_host_reads_matches():
    tree, prefix, _ = real_tree(0)
    q, bs = tree.width, tree.batch_size
    full = sg.verify_input(tree, prefix)["custom_mask"]
    total = int(prefix.sum())
    sized = sg.verify_input(tree, prefix, seq_lens_sum=total)["custom_mask"]
    assert torch.equal(sized, full)
    buf = torch.ones(total * q + bs * q * q + 5, dtype=torch.bool)  # EAGLE: filled True
    tree_cols = sg.verify_input(tree, prefix, custom_mask_out=buf, mask_prefix_columns=False)
    assert torch.equal(tree_cols["custom_mask"], full)
    with pytest.raises(ValueError, match="mask_prefix_columns"):
        sg.verify_input(tree, prefix, seq_lens_sum=total, mask_prefix_columns=False)
    # No mask at all (tree_attention reads the ancestor bits); the other fields unchanged.
    bare = sg.verify_input(tree, None)
    assert bare["custom_mask"] is None
    assert torch.equal(bare["retrive_next_token"], tree_cols["retrive_next_token"])


# --- verify_output and the kernel's conventions -----------------------------------------


def hand_acceptance():
    tree = hand_tree()
    # Request 0 walks 0 -> 1 -> 3 -> 5, bonus 99; request 1 walks 0 -> 2, bonus 42.
    logits = greedy_logits([{0: 11, 1: 13, 3: 15, 5: 99}, {0: 12, 2: 42}], 7, 100)
    return tree, ddtree.accept_tree(tree, logits)


def test_hand_acceptance_outputs():
    tree, acc = hand_acceptance()
    assert acc.accepted_nodes.tolist() == [[0, 1, 3, 5], [0, 2, -1, -1]]
    vo = sg.verify_output(acc, tree)
    assert vo["accept_index"].tolist() == [[0, 1, 3, 5], [7, 9, -1, -1]]
    assert vo["accept_length"].tolist() == [3, 1]  # drafts only: root and bonus excluded
    want = [-1] * 15
    want[0], want[1], want[3], want[5], want[7], want[9] = 11, 13, 15, 99, 12, 42
    assert vo["predict"].tolist() == want
    assert vo["verified_id"].tolist() == [[11, 13, 15, 99], [12, 42, -1, -1]]
    assert vo["bonus"].tolist() == [99, 42]
    for key in ("accept_index", "accept_length", "predict", "verified_id"):
        assert vo[key].dtype == torch.int32
    # SGLang's flat verified_id: predict[accept_index[accept_index != -1]].
    flat = vo["accept_index"][vo["accept_index"] != -1].long()
    assert vo["predict"][flat].tolist() == [11, 13, 15, 99, 12, 42]
    assert vo["verified_id"][vo["verified_id"] != -1].tolist() == [11, 13, 15, 99, 12, 42]


@pytest.mark.parametrize("seed", range(8))
def test_outputs_equal_sglang_verify_tree_greedy_on_the_inputs(seed):
    tree, prefix, target = real_tree(seed)
    acc = ddtree.accept_tree(tree, target)
    vi = sg.verify_input(tree, prefix)
    vo = sg.verify_output(acc, tree)
    bs, q = tree.batch_size, tree.width
    predicts, accept_index, accept_num = sglang_verify_tree_greedy(
        vi["draft_token"].view(bs, q),
        vi["retrive_index"],
        vi["retrive_next_token"],
        vi["retrive_next_sibling"],
        target.argmax(-1),
        vi["spec_steps"],
    )
    assert vo["accept_index"].tolist() == accept_index
    assert vo["accept_length"].tolist() == accept_num
    assert vo["predict"].tolist() == predicts
    assert max(accept_num) >= 2  # the walks went past the first level


def test_hand_tree_equals_sglang_kernel_port():
    tree, acc = hand_acceptance()
    logits = greedy_logits([{0: 11, 1: 13, 3: 15, 5: 99}, {0: 12, 2: 42}], 7, 100)
    vi = sg.verify_input(tree, torch.tensor([2, 1]))
    predicts, accept_index, accept_num = sglang_verify_tree_greedy(
        vi["draft_token"].view(2, 7),
        vi["retrive_index"],
        vi["retrive_next_token"],
        vi["retrive_next_sibling"],
        logits.argmax(-1),
        vi["spec_steps"],
    )
    vo = sg.verify_output(acc, tree)
    assert (vo["predict"].tolist(), vo["accept_index"].tolist()) == (predicts, accept_index)
    assert vo["accept_length"].tolist() == accept_num


def test_root_only_acceptance():
    tree = hand_tree()
    acc = ddtree.accept_tree(tree, greedy_logits([{0: 50}, {0: 51}], 7, 100))
    vo = sg.verify_output(acc, tree)
    assert vo["accept_index"].tolist() == [[0, -1, -1, -1], [7, -1, -1, -1]]
    assert vo["accept_length"].tolist() == [0, 0]
    assert vo["verified_id"].tolist() == [[50, -1, -1, -1], [51, -1, -1, -1]]
    assert [i for i, v in enumerate(vo["predict"].tolist()) if v != -1] == [0, 7]


def test_stepper_acceptance_matches_accept_tree():
    tree, prefix, target = real_tree(1)
    draft = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(1)) * 2
    roots = tree.verify_ids[:, 0]
    tree = ddtree.build_tree(draft, roots, prefix, budget=12)
    stepper = ddtree.Stepper(max_batch=4, budget=12, depth=4, vocab=16, device="cpu")
    st_tree = stepper.step(draft, roots, prefix)
    st_acc = stepper.accept(target)
    a = sg.verify_output(st_acc, st_tree)
    b = sg.verify_output(ddtree.accept_tree(tree, target), tree)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    stepper.close()


# --- KV keep / free ---------------------------------------------------------------------


def test_kv_keep_free_hand():
    tree, acc = hand_acceptance()
    out_cache_loc = torch.arange(200, 214)  # SGLang's flat batch.out_cache_loc
    keep, free = sg.kv_keep_free(acc, out_cache_loc)
    assert keep.tolist() == [[200, 201, 203, 205], [207, 209, -1, -1]]
    assert free.shape == (14,) and free.dtype == torch.bool
    assert free.nonzero().flatten().tolist() == [2, 4, 6, 8, 10, 11, 12, 13]
    # SGLang's page-size-1 forms: out_cache_loc[accept_index] and the evict mask.
    vo = sg.verify_output(acc, tree)
    flat = vo["accept_index"][vo["accept_index"] != -1].long()
    assert keep[keep != -1].tolist() == out_cache_loc[flat].tolist()
    evict = torch.ones(14, dtype=torch.bool)
    evict[flat] = False
    assert torch.equal(free, evict)
    # The [bs, Q] window gives the same.
    keep2, free2 = sg.kv_keep_free(acc, out_cache_loc.view(2, 7))
    assert torch.equal(keep, keep2) and torch.equal(free, free2)


@pytest.mark.parametrize("seed", range(3))
def test_kv_keep_free_real(seed):
    tree, _, target = real_tree(seed)
    acc = ddtree.accept_tree(tree, target)
    bs, q = tree.batch_size, tree.width
    out_cache_loc = torch.randperm(1000, generator=torch.Generator().manual_seed(seed))[: bs * q]
    keep, free = sg.kv_keep_free(acc, out_cache_loc)
    index = sg.verify_output(acc, tree)["accept_index"]
    assert torch.equal(keep, torch.where(index >= 0, out_cache_loc[index.long().clamp(min=0)], -1))
    assert int(free.sum()) == bs * q - int(acc.accept_len.sum())
    assert not free[index[index >= 0].long()].any()


def test_type_errors():
    tree, acc = hand_acceptance()
    with pytest.raises(TypeError, match="tree"):
        sg.verify_input(acc, [2, 1])
    with pytest.raises(TypeError, match="acc"):
        sg.verify_output(tree, tree)
    with pytest.raises(TypeError, match="out_cache_loc"):
        sg.kv_keep_free(acc, [1, 2])
    assert isinstance(acc, Acceptance)
