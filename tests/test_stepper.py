"""Stepper(device="cpu"): static buffers, views, the same numbers as the functional API."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import draft_logits, raised

import ddtree


def test_step_and_accept_equal_the_functional_api(rng):
    stepper = ddtree.Stepper(max_batch=8, budget=31, depth=6, vocab=200, device="cpu", topk=7)
    ptrs = None
    for bs, depth, vocab in [(8, 6, 200), (3, 4, 150), (5, 6, 3)]:
        x = draft_logits(rng, (bs, depth, vocab), "quantised", torch.bfloat16)
        roots = torch.from_numpy(rng.integers(0, vocab, bs))
        prefix = torch.from_numpy(rng.integers(0, 99, bs))
        tree = stepper.step(x, roots, prefix)
        want = ddtree.build_tree(x, roots, prefix, budget=31, topk=7)
        for name in want.__dataclass_fields__:
            assert torch.equal(getattr(tree, name), getattr(want, name)), name
        target = torch.randn(bs, 32, vocab)
        acc = stepper.accept(target)
        want_acc = ddtree.accept_tree(want, target)
        for name in want_acc.__dataclass_fields__:
            assert torch.equal(getattr(acc, name), getattr(want_acc, name)), name
        host = stepper.readback()
        assert torch.equal(host["bonus"], want_acc.bonus)
        # Results are views of the same static storage, call after call.
        now = (tree.verify_ids.data_ptr(), acc.bonus.data_ptr())
        assert ptrs is None or now == ptrs
        ptrs = now


def test_stepper_limits_and_lifecycle():
    stepper = ddtree.Stepper(max_batch=2, budget=4, depth=3, vocab=10, device="cpu")
    assert stepper.readback() is None
    with pytest.raises(RuntimeError, match="step"):
        stepper.accept(torch.randn(2, 5, 10))
    z = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="max_batch"):
        stepper.step(torch.randn(3, 3, 10), z, z)
    with pytest.raises(ValueError, match="vocab"):
        stepper.step(torch.randn(2, 3, 11), z[:2], z[:2])
    with pytest.raises(ValueError, match="depth"):
        stepper.step(torch.randn(2, 4, 10), z[:2], z[:2])
    with pytest.raises(ValueError, match="budget"):
        ddtree.Stepper(budget=0, device="cpu")
    stepper.close()
    with pytest.raises(RuntimeError, match="close"):
        stepper.step(torch.randn(2, 3, 10), z[:2], z[:2])


def test_unsupported_devices_are_refused():
    with pytest.raises(ValueError, match="device"):
        ddtree.Stepper(device="meta")


def test_readback_copies_are_host_tensors(rng):
    stepper = ddtree.Stepper(max_batch=2, budget=4, depth=3, vocab=10, device="cpu")
    x = torch.from_numpy(rng.standard_normal((2, 3, 10)).astype(np.float32))
    stepper.step(x, torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))
    stepper.accept(torch.randn(2, 5, 10))
    host = stepper.readback(wait=True)
    assert all(t.device.type == "cpu" for name, t in host.items() if name != "round")


def test_readback_on_the_cpu_keeps_each_rounds_tokens(rng):
    """Copies, like CUDA's pinned slots: the next accept must not rewrite a result."""
    stepper = ddtree.Stepper(max_batch=2, budget=4, depth=3, vocab=10, device="cpu")
    x = torch.from_numpy(rng.standard_normal((2, 3, 10)).astype(np.float32))
    stepper.step(x, torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))
    hosts = []
    for token in (1, 2):  # every posterior token is `token`, so the bonus is too
        target = torch.zeros(2, 5, 10)
        target[..., token] = 1.0
        stepper.accept(target)
        hosts.append(stepper.readback())
    for round_, (host, token) in enumerate(zip(hosts, (1, 2), strict=True)):
        assert host["round"] == round_
        assert host["bonus"].tolist() == [token, token]


def test_cpu_readback_returns_each_published_round_once(rng):
    """As on CUDA: the newest published round, once; an unpublished accept is not read back."""
    stepper = ddtree.Stepper(max_batch=2, budget=4, depth=3, vocab=10, device="cpu")
    x = torch.from_numpy(rng.standard_normal((2, 3, 10)).astype(np.float32))
    stepper.step(x, torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))
    assert stepper.readback() is None
    target = torch.zeros(2, 5, 10)
    target[..., 3] = 1.0
    stepper.accept(target)
    assert stepper.readback()["bonus"].tolist() == [3, 3]
    assert stepper.readback() is None  # returned already
    other = torch.zeros(2, 5, 10)
    other[..., 4] = 1.0
    stepper.accept(other, readback=False)  # not published
    assert stepper.readback() is None
    again = stepper.readback(wait=True)  # the newest published, again
    assert again["bonus"].tolist() == [3, 3] and again["round"] == 0


@pytest.mark.parametrize(
    "case",
    [
        "root out of vocabulary",
        "negative root",
        "negative prefix",
        "prefix overflows",
        "int32 roots",
        "short prefix",
        "int logits",
        "2-D logits",
        "empty vocabulary",
        "roots not a tensor",
    ],  # fmt: skip
)
def test_the_cpu_engine_raises_what_the_functional_build_raises(case):
    # The CPU Stepper checks in Rust (its CpuEngine); build_tree checks in Python
    # (_validate). Same input, same exception and message, and nothing written.
    stepper = ddtree.Stepper(max_batch=4, budget=8, depth=3, vocab=50, device="cpu")
    x = torch.randn(2, 3, 50)
    roots, prefix = torch.tensor([3, 7]), torch.tensor([5, 0])
    tree = stepper.step(x, roots, prefix)
    before = {k: v.clone() for k, v in vars(tree).items()}
    bad = {
        "root out of vocabulary": (x, torch.tensor([3, 50]), prefix),
        "negative root": (x, torch.tensor([-1, 2]), prefix),
        "negative prefix": (x, roots, torch.tensor([4, -9])),
        "prefix overflows": (x, roots, torch.tensor([2**63 - 2, 0])),
        "int32 roots": (x, roots.int(), prefix),
        "short prefix": (x, roots, prefix[:1]),
        "int logits": (x.long(), roots, prefix),
        "2-D logits": (x[:, 0], roots, prefix),
        "empty vocabulary": (x[:, :, :0], roots, prefix),
        "roots not a tensor": (x, "3 7", prefix),
    }[case]
    want = raised(lambda: ddtree.build_tree(*bad, budget=8))
    assert want is not None
    assert raised(lambda: stepper.step(*bad)) == want
    for name, value in before.items():
        assert torch.equal(getattr(tree, name), value), name
