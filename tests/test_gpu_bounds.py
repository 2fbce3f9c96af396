"""Out-of-range indices from a caller (issue: a bad slot id must not kill the CUDA context).

Each kernel that dereferences a caller's index gets one bad index in one request of a
batch: that request gets the stage's empty result and a status code, every other request
equals a clean run, nothing outside the tensors changes (guard bands around the caches),
and the next CUDA call succeeds. The same cases run on the CPU path, which must give the
same results and codes (those run in CI). `gpu`-marked tests skip without CUDA.
"""

from __future__ import annotations

import pytest
import torch

import ddtree
from ddtree import Acceptance, Tree

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, GPU])]
BS, BUDGET, DEPTH = 6, 63, 6
BAD = 10**9  # what a broken allocator upstream might hand over
GUARD = 64  # rows of guard band before and after each cache


def round_on(device, vocab=300):
    """A built tree, target logits that accept each request's first-child chain, and the
    clean (greedy) acceptance: the same values on every device."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(BS, DEPTH, vocab, generator=g) * 3).to(torch.bfloat16)
    roots = torch.randint(0, vocab, (BS,), generator=g)
    prefix = torch.randint(0, 50, (BS,), generator=g)
    tree = ddtree.build_tree(x.to(device), roots.to(device), prefix.to(device), budget=BUDGET)
    target = torch.randn(BS, BUDGET + 1, vocab, generator=g).to(device)
    child = tree.first_child.clamp(min=0)
    target.scatter_(2, torch.gather(tree.verify_ids, 1, child).unsqueeze(2), 30.0)
    return tree, target, ddtree.accept_tree(tree, target)


def copy_acc(acc: Acceptance) -> Acceptance:
    return Acceptance(**{n: getattr(acc, n).clone() for n in acc.__dataclass_fields__})


def guarded_caches(device, slots, n=2):
    """Caches [slots, 4, 8] carved out of larger buffers: the guard rows around them must
    never change."""
    bufs = [torch.randn(slots + 2 * GUARD, 4, 8, device=device) for _ in range(n)]
    return bufs, [b[GUARD : GUARD + slots] for b in bufs]


def window(device, slots):
    q = BUDGET + 1
    perm = torch.randperm(slots, generator=torch.Generator().manual_seed(3))[: BS * q]
    return perm.view(BS, q).to(device)


def assert_context_alive(device):
    if device == "cuda":
        torch.cuda.synchronize()
        assert float(torch.ones(4, device=device).sum()) == 4.0


@pytest.mark.parametrize("device", DEVICES)
def test_compact_kv_with_a_slot_outside_the_caches_moves_nothing_for_that_request(device):
    tree, _, acc = round_on(device)
    slots = BS * (BUDGET + 1) + 40
    w = window(device, slots)
    w[2, 0] = BAD  # the first accepted node's slot: a destination of every compaction
    w[4, int(acc.accepted_nodes[4, 1])] = -5  # a source: the second accepted node's slot
    assert (acc.accept_len > 1).all()
    bufs, caches = guarded_caches(device, slots)
    before = [b.clone() for b in bufs]
    got = copy_acc(acc)
    ddtree.compact_kv(got, w, caches)
    assert_context_alive(device)
    assert got.status.tolist() == [0, 0, 6, 0, 6, 0]
    # Expected: the clean requests' rows moved (sources read first), nothing else touched:
    # not the bad requests' rows, not the guard bands around the caches.
    nodes = acc.accepted_nodes.cpu()
    for b, old in zip(bufs, before, strict=True):
        want = old.clone()
        for r in (0, 1, 3, 5):
            path = nodes[r][nodes[r] >= 0].to(device)
            want[w[r, : len(path)] + GUARD] = old[w[r, path] + GUARD]
        assert torch.equal(b, want)


@pytest.mark.parametrize("device", DEVICES)
def test_kept_slots_with_a_bad_node_or_slot_gives_the_empty_result(device):
    tree, _, acc = round_on(device)
    slots = BS * (BUDGET + 1) + 40
    w = window(device, slots)
    w[1, 5] = BAD
    bad_nodes = copy_acc(acc)
    bad_nodes.accepted_nodes[3, 0] = 70_000  # outside [0, Q): a hand-made acceptance
    kept, release = ddtree.kept_slots(bad_nodes, w, num_slots=slots)
    clean, clean_release = ddtree.kept_slots(copy_acc(acc), window(device, slots))
    assert_context_alive(device)
    status = bad_nodes.status.tolist()
    assert status[1] == ddtree.STATUS_SLOT_OUT_OF_RANGE
    assert status[3] == ddtree.STATUS_NODE_OUT_OF_RANGE
    for r in (1, 3):
        assert (kept[r] == -1).all() and not release[r].any()
    for r in (0, 2, 4, 5):
        assert status[r] == 0
        assert torch.equal(kept[r], clean[r]) and torch.equal(release[r], clean_release[r])
    # Without num_slots the slot ids are copied, not dereferenced: request 1 is fine.
    again = copy_acc(acc)
    kept, _ = ddtree.kept_slots(again, w)
    assert again.status.tolist()[1] == 0 and int(kept[1, 0]) == int(w[1, 0])


@pytest.mark.parametrize("device", DEVICES)
def test_gather_hidden_with_a_bad_node_keeps_that_requests_rows(device):
    tree, _, acc = round_on(device)
    q = BUDGET + 1
    hidden = torch.randn(BS * q, 32, device=device)
    bad = copy_acc(acc)
    bad.accepted_nodes[0, 1] = -7
    bad.accepted_nodes[5, 0] = q  # one past the end
    out = torch.full((BS, DEPTH + 1, 32), 3.0, device=device)
    ddtree.gather_hidden(bad, hidden, out=out)
    clean = ddtree.gather_hidden(copy_acc(acc), hidden)
    assert_context_alive(device)
    assert bad.status.tolist() == [ddtree.STATUS_NODE_OUT_OF_RANGE, 0, 0, 0, 0, 5]
    assert (out[0] == 3.0).all() and (out[5] == 3.0).all()
    assert torch.equal(out[1:5], clean[1:5])


@pytest.mark.parametrize("device", DEVICES)
def test_accept_with_corrupt_links_gives_the_root_only_walk(device):
    tree, target, clean = round_on(device)
    fields = {n: getattr(tree, n).clone() for n in tree.__dataclass_fields__}
    fields["first_child"][1, 0] = BAD  # the root's first child: far outside the tree
    fields["next_sibling"][4, 7] = -(2**40)  # a link off the path, still rejected
    bad = Tree(**fields)
    acc = ddtree.accept_tree(bad, target)
    assert_context_alive(device)
    assert acc.status.tolist() == [0, 4, 0, 0, 4, 0]
    for r in (1, 4):
        assert int(acc.accept_len[r]) == 1 and int(acc.accepted_nodes[r, 0]) == 0
        assert (acc.accepted_nodes[r, 1:] == -1).all()
        assert int(acc.bonus[r]) == int(target[r, 0].float().argmax())
    for r in (0, 2, 3, 5):
        assert int(acc.accept_len[r]) == int(clean.accept_len[r])
        assert torch.equal(acc.accepted_tokens[r], clean.accepted_tokens[r])


@pytest.mark.parametrize("device", DEVICES)
def test_accept_with_a_sibling_cycle_stops_instead_of_spinning(device):
    tree, target, clean = round_on(device)
    fields = {n: getattr(tree, n).clone() for n in tree.__dataclass_fields__}
    # Request 2: every node's next sibling is the root's first child (a cycle through the
    # root's children), and no posterior matches: the search would never end.
    first = fields["first_child"][2, 0].clone()
    fields["next_sibling"][2] = first
    never = (int(target[2, 0].float().argmax()) + 1) % target.shape[2]
    fields["verify_ids"][2, 1:] = never  # no child carries the root's posterior token
    acc = ddtree.accept_tree(Tree(**fields), target)
    assert_context_alive(device)
    assert acc.status.tolist()[2] == ddtree.STATUS_BAD_TREE_LINK
    assert int(acc.accept_len[2]) == 1
    assert [s for i, s in enumerate(acc.status.tolist()) if i != 2] == [0] * (BS - 1)


@pytest.mark.gpu
@GPU
def test_the_gpu_gives_the_cpu_codes_on_the_same_bad_inputs():
    results = {}
    for device in ("cpu", "cuda"):
        tree, target, acc = round_on(device)
        slots = BS * (BUDGET + 1) + 40
        w = window(device, slots)
        w[0, 3], w[5, 0] = BAD, -1
        acc.accepted_nodes[2, 2] = 5000
        kept, release = ddtree.kept_slots(acc, w, num_slots=slots)
        results[device] = (acc.status.cpu(), kept.cpu(), release.cpu())
    for a, b in zip(results["cpu"], results["cuda"], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_accept_with_a_child_link_pointing_back_stops_at_the_root(device):
    # Node 0's first child is node 0 itself (in range, no sibling cycle): a walk following
    # it would revisit nodes; links must point forward (best-first order).
    tree, target, clean = round_on(device)
    fields = {n: getattr(tree, n).clone() for n in tree.__dataclass_fields__}
    fields["first_child"][3, 0] = 0
    fields["verify_ids"][3, 0] = int(target[3, 0].float().argmax())
    acc = ddtree.accept_tree(Tree(**fields), target)
    assert_context_alive(device)
    assert acc.status.tolist()[3] == ddtree.STATUS_BAD_TREE_LINK
    assert int(acc.accept_len[3]) == 1 and (acc.accepted_nodes[3, 1:] == -1).all()
    assert [s for i, s in enumerate(acc.status.tolist()) if i != 3] == [0] * (BS - 1)


@pytest.mark.parametrize("device", DEVICES)
def test_a_path_longer_than_the_window_moves_nothing(device):
    # A hand-made acceptance whose path repeats nodes past the Q window slots.
    tree, _, acc = round_on(device)
    q = tree.width
    nodes = torch.full((BS, q + 3), -1, dtype=torch.int64, device=device)
    nodes[:, 0] = 0
    nodes[1, : q + 2] = torch.arange(q + 2, device=device) % 2  # 0, 1, 0, 1, ...
    long_acc = Acceptance(
        accepted_nodes=nodes,
        accepted_tokens=torch.zeros_like(nodes),
        accept_len=(nodes >= 0).sum(1),
        bonus=torch.zeros(BS, dtype=torch.int64, device=device),
        accept_index=torch.zeros_like(nodes),
        status=torch.zeros(BS, dtype=torch.int32, device=device),
    )
    slots = BS * q + 40
    bufs, caches = guarded_caches(device, slots)
    before = [b.clone() for b in bufs]
    if device == "cuda":  # the GPU's staging holds L + 1 <= 21 entries: refused up front
        with pytest.raises(ValueError, match="acc"):
            ddtree.compact_kv(long_acc, window(device, slots), caches)
        return
    ddtree.compact_kv(long_acc, window(device, slots), caches)
    assert long_acc.status.tolist()[1] == ddtree.STATUS_NODE_OUT_OF_RANGE
    for b, old in zip(bufs, before, strict=True):
        assert torch.equal(
            b[window(device, slots)[1] + GUARD], old[window(device, slots)[1] + GUARD]
        )


def test_cpu_release_mask_when_the_path_does_not_start_at_node_0():
    acc = Acceptance(
        accepted_nodes=torch.tensor([[1, -1]]),
        accepted_tokens=torch.tensor([[5, -1]]),
        accept_len=torch.tensor([1]),
        bonus=torch.tensor([7]),
        accept_index=torch.tensor([[1, -1]]),
        status=torch.zeros(1, dtype=torch.int32),
    )
    kept, release = ddtree.kept_slots(acc, torch.tensor([[10, 11, 12]]))
    assert kept.tolist() == [[11, -1]] and release.tolist() == [[True, False, True]]
