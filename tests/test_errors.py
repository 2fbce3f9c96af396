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
        (lambda a: (a[0].to("meta"), a[1], a[2]), ValueError, "draft_logits"),
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


def peaked(bs=2, depth=3, vocab=10, token=9):
    """Draft logits whose best token at every depth is ``token``: it is in every tree."""
    x = torch.randn(bs, depth, vocab)
    x[..., token] = 20.0
    return x


def test_accept_refuses_a_target_vocabulary_smaller_than_the_trees_tokens():
    x, roots, prefix = args()
    tree = build(peaked(), roots, prefix)
    with pytest.raises(ValueError, match="target_logits"):
        ddtree.accept_tree(tree, torch.randn(2, 9, 5))


def test_stepper_accept_wants_the_vocabulary_of_the_last_step():
    stepper = ddtree.Stepper(max_batch=2, budget=8, depth=3, vocab=10, device="cpu")
    _, roots, prefix = args()
    stepper.step(peaked(vocab=6, token=1), roots, prefix)
    for vocab in (5, 10, 12):  # the bonus must stay inside the draft's V = 6
        with pytest.raises(ValueError, match="target_logits"):
            stepper.accept(torch.randn(2, 9, vocab))
    assert stepper.accept(torch.randn(2, 9, 6)).bonus.max() < 6


@pytest.mark.parametrize("seq_lens", [[-50, 3], [10**15, 3], [2**62, 2**62]])
def test_mask_refuses_negative_or_absurd_seq_lens(seq_lens):
    tree = build(*args())
    with pytest.raises(ValueError, match="seq_lens"):
        tree.sglang_custom_mask(torch.tensor(seq_lens))
    with pytest.raises(ValueError, match="seq_lens"):
        tree.sglang_custom_mask(torch.tensor(seq_lens), out=torch.zeros(10**4, dtype=torch.bool))


def test_positions_that_would_overflow_int64_are_refused():
    limit = torch.iinfo(I64).max - 3  # depth 3: the deepest position is prefix + 3
    x, roots, _ = args()
    stepper = ddtree.Stepper(max_batch=2, budget=8, depth=3, vocab=10, device="cpu")
    for run in (build, stepper.step):
        with pytest.raises(ValueError, match="prefix_lens"):
            run(x, roots, torch.tensor([limit + 1, 0]))
        tree = run(peaked(), roots, torch.tensor([limit, 0]))
        assert int(tree.positions[0].min()) == limit and int(tree.depths.max()) == 3


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_stepper_without_cuda_says_to_pass_cpu():
    with pytest.raises(ValueError, match='device="cpu"'):
        ddtree.Stepper()


def test_a_root_outside_the_vocabulary_names_the_last_id():
    # V = 100: the ids are 0..99, and the message names the last one (both CPU paths: the
    # functional build checks in Python, the CPU Stepper in Rust).
    x, _, prefix = args(vocab=100)
    stepper = ddtree.Stepper(max_batch=2, budget=8, depth=3, vocab=100, device="cpu")
    for run in (build, stepper.step):
        for bad in (100, 200, -1):
            with pytest.raises(ValueError) as e:
                run(x, torch.tensor([5, bad]), prefix)
            assert str(e.value) == f"root_tokens: token {bad} is outside the vocabulary 0..99"
        run(x, torch.tensor([0, 99]), prefix)  # the last id is inside


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "meta"])
def test_an_attention_workspace_is_for_cuda_devices(device):
    with pytest.raises(ValueError) as e:
        ddtree.AttentionWorkspace(device, max_batch=2, q_nodes=9, hq=4, hkv=1, dqk=64, dv=64)
    message = str(e.value)
    assert message.startswith("device: an AttentionWorkspace is for CUDA devices"), message
    assert "needs no workspace" in message, message


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_attention_workspace_without_cuda_says_so():
    with pytest.raises(ValueError, match="device: .* none is available here"):
        ddtree.AttentionWorkspace("cuda", max_batch=2, q_nodes=9, hq=4, hkv=1, dqk=64, dv=64)


def test_a_tree_where_an_acceptance_belongs_is_a_type_error_naming_acc():
    """The commit functions take the Acceptance; given the Tree (an easy slip), each says so
    instead of failing on a missing attribute."""
    tree = build(*args())
    window = torch.arange(2 * 9, dtype=I64).view(2, 9)
    calls = [
        lambda: ddtree.kept_slots(tree, window),
        lambda: ddtree.compact_kv(tree, window, [torch.zeros(18, 4)]),
        lambda: ddtree.gather_hidden(tree, torch.zeros(18, 4)),
    ]
    for call in calls:
        with pytest.raises(TypeError, match="^acc: expected a ddtree.Acceptance, got Tree"):
            call()
    acc = ddtree.accept_tree(tree, torch.randn(2, 9, 10))
    with pytest.raises(TypeError, match="^tree: expected a ddtree.Tree, got Acceptance"):
        ddtree.accept_tree(acc, torch.randn(2, 9, 10))


def test_stepper_gather_hidden_wants_bs_times_q_rows():
    """The Stepper knows Q: hidden rows for another Q are refused naming hidden (the
    functional gather_hidden, which an Acceptance gives no Q, reads Q off the rows)."""
    st = ddtree.Stepper(max_batch=2, budget=4, depth=3, vocab=10, device="cpu")
    tree = st.step(*args())
    st.accept(torch.randn(2, tree.width, 10))
    for rows in (8, 12):
        with pytest.raises(ValueError, match=r"^hidden: must have bs·Q = 10 rows"):
            st.gather_hidden(torch.zeros(rows, 4), None)
    assert st.gather_hidden(torch.zeros(10, 4), None).shape == (2, 4, 4)
