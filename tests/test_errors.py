"""Bad input: a ValueError / TypeError naming the argument, before any work."""

from __future__ import annotations

import pytest
import torch

import ddtree

I64 = torch.int64


def args(bs=2, depth=3, vocab=10, dtype=torch.float32):
    return (
        torch.randn(bs, depth, vocab).to(dtype),
        torch.zeros(bs, dtype=I64),
        torch.zeros(bs, dtype=I64),
    )


def build(x, roots, prefix, **kw):
    kw.setdefault("budget", 8)
    return ddtree.build_tree(x, roots, prefix, **kw)


@pytest.mark.parametrize(
    "mutate, exc, name",
    [
        (lambda a: (a[0].double(), a[1], a[2]), TypeError, "draft_logits"),
        (lambda a: (a[0].int(), a[1], a[2]), TypeError, "draft_logits"),
        (lambda a: (a[0][0], a[1], a[2]), ValueError, "draft_logits"),
        (lambda a: (a[0][:, :0], a[1], a[2]), ValueError, "draft_logits"),
        (lambda a: (a[0][:0], a[1][:0], a[2][:0]), ValueError, "draft_logits"),
        (lambda a: (a[0][:, :, :0], a[1], a[2]), ValueError, "draft_logits"),
        (lambda a: (a[0].numpy(), a[1], a[2]), TypeError, "draft_logits"),
        (lambda a: (a[0], a[1].int(), a[2]), TypeError, "root_tokens"),
        (lambda a: (a[0], a[1][:1], a[2]), ValueError, "root_tokens"),
        (lambda a: (a[0], a[1] + 10, a[2]), ValueError, "root_tokens"),
        (lambda a: (a[0], a[1] - 1, a[2]), ValueError, "root_tokens"),
        (lambda a: (a[0], a[1], a[2].float()), TypeError, "prefix_lens"),
        (lambda a: (a[0], a[1], a[2][None]), ValueError, "prefix_lens"),
        (lambda a: (a[0], a[1], a[2] - 1), ValueError, "prefix_lens"),
        (lambda a: (a[0], a[1].to("meta"), a[2]), ValueError, "root_tokens"),
        (lambda a: (a[0], a[1], a[2].to("meta")), ValueError, "prefix_lens"),
    ],
)
def test_bad_tensors_name_the_argument(mutate, exc, name):
    with pytest.raises(exc, match=name):
        build(*mutate(args()))


@pytest.mark.parametrize(
    "kw, exc, name",
    [
        ({"budget": 0}, ValueError, "budget"),
        ({"budget": -3}, ValueError, "budget"),
        ({"budget": 2.5}, TypeError, "budget"),
        ({"budget": 10**9}, ValueError, "budget"),
        ({"topk": 0}, ValueError, "topk"),
        ({"topk": "3"}, TypeError, "topk"),
    ],
)
def test_bad_scalars_name_the_argument(kw, exc, name):
    with pytest.raises(exc, match=name):
        build(*args(), **kw)


def test_depth_beyond_the_limit():
    with pytest.raises(ValueError, match="draft_logits"):
        build(*args(depth=33))


def test_accept_checks_its_arguments():
    tree = build(*args())
    target = torch.randn(2, 9, 10)
    with pytest.raises(ValueError, match="target_logits"):
        ddtree.accept_tree(tree, target[:, :5])
    with pytest.raises(TypeError, match="target_logits"):
        ddtree.accept_tree(tree, target.long())
    with pytest.raises(ValueError, match="temperature"):
        ddtree.accept_tree(tree, target, temperature=-1.0)
    with pytest.raises(ValueError, match="temperature"):
        ddtree.accept_tree(tree, target, temperature=torch.ones(3))
    with pytest.raises(ValueError, match="top_p"):
        ddtree.accept_tree(tree, target, temperature=1.0, top_p=0.0)
    with pytest.raises(TypeError, match="generator"):
        ddtree.accept_tree(tree, target, temperature=1.0, generator="x")
    with pytest.raises(TypeError, match="tree"):
        ddtree.accept_tree("tree", target)


def test_mask_out_is_checked():
    tree = build(*args())
    with pytest.raises(ValueError, match="out"):
        tree.sglang_custom_mask(torch.tensor([3, 4]), out=torch.zeros(5, dtype=torch.bool))
    with pytest.raises(TypeError, match="out"):
        tree.sglang_custom_mask(torch.tensor([3, 4]), out=torch.zeros(500))
    with pytest.raises(ValueError, match="seq_lens"):
        tree.sglang_custom_mask(torch.tensor([3]))


def test_nothing_is_written_when_a_check_fails():
    stepper = ddtree.Stepper(max_batch=2, budget=8, depth=3, vocab=10, device="cpu")
    x, roots, prefix = args()
    tree = stepper.step(x, roots, prefix)
    before = tree.verify_ids.clone()
    with pytest.raises(ValueError, match="root_tokens"):
        stepper.step(torch.randn(2, 3, 10), roots + 99, prefix)
    assert torch.equal(tree.verify_ids, before)
