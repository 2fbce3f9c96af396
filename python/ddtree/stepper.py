"""``Stepper``: static buffers, one build and one accept per round, views as results."""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import _api, _buffers, _cpu, _cuda, _validate
from ._types import Acceptance, Tree


class _Plan(NamedTuple):
    tree: Tree
    launch: object  # _cuda.LaunchPlan on CUDA


class Stepper:
    """Owns every output buffer of a round; ``step`` and ``accept`` return views of them.

    The next call overwrites the views. On CUDA, ``step`` launches on PyTorch's current
    stream, never synchronizes and never allocates, so it may be captured in a CUDA graph
    (the Stepper must outlive the graph). ``device="cpu"`` runs the Rust CPU path.
    """

    def __init__(
        self, max_batch=64, budget=255, depth=15, vocab=151936, device="cuda:0", topk=None
    ):
        self.max_batch = _validate.positive_int("max_batch", max_batch)
        self.budget = _validate.positive_int("budget", budget, limit=_validate.MAX_BUDGET)
        self.depth = _validate.positive_int("depth", depth, limit=_validate.MAX_DEPTH)
        self.vocab = _validate.positive_int("vocab", vocab)
        self.topk = _validate.optional_positive_int("topk", topk)
        self.device = _validate.concrete_device(torch.device(device))
        _validate.supported_device(self.device, "device")
        if self.device.type == "cuda":
            self._check_cuda_limits()
            _cuda.prepare(self.device)
        k = _api.k_of(self.budget, self.vocab, self.topk)
        largest_tree = _buffers.tree_shapes(self.max_batch, self.depth, k, self.budget)
        largest_acc = _buffers.acceptance_shapes(self.max_batch, self.depth)
        self._tree_bufs = _buffers.FlatBuffers(largest_tree, self.device)
        self._acc_bufs = _buffers.FlatBuffers(largest_acc, self.device)
        rows = self.max_batch * self.depth
        self._scratch = _cuda.new_scratch(rows, self.device) if self.device.type == "cuda" else {}
        self._plans: dict[tuple, _Plan] = {}
        self._tree: Tree | None = None
        self._acc: Acceptance | None = None

    def _check_cuda_limits(self) -> None:
        from . import _core

        if self.budget > _core.CUDA_MAX_BUDGET:
            raise ValueError(f"budget: at most {_core.CUDA_MAX_BUDGET} on CUDA, got {self.budget}")
        if self.depth > _core.CUDA_MAX_DEPTH:
            raise ValueError(f"depth: at most {_core.CUDA_MAX_DEPTH} on CUDA, got {self.depth}")

    def step(self, draft_logits, root_tokens, prefix_lens) -> Tree:
        """SPEC stages 1–3 into the static buffers; returns views sliced to the batch size."""
        self._check_open()
        x = _validate.logits("draft_logits", draft_logits, max_depth=self.depth)
        _validate.same_device("draft_logits", x, self.device)
        bs, depth, vocab = x.shape
        if bs > self.max_batch:
            raise ValueError(f"draft_logits: batch size {bs} exceeds max_batch={self.max_batch}")
        if vocab > self.vocab:
            raise ValueError(f"draft_logits: vocabulary {vocab} exceeds vocab={self.vocab}")
        roots = _validate.index_vector("root_tokens", root_tokens, bs, self.device)
        prefix = _validate.index_vector("prefix_lens", prefix_lens, bs, self.device)
        _validate.in_vocab("root_tokens", roots, vocab)  # CPU only: on CUDA, a status code
        _validate.non_negative("prefix_lens", prefix)
        k = _api.k_of(self.budget, vocab, self.topk)
        plan = self._plan(bs, depth, k)
        if self.device.type == "cuda":
            _cuda.launch_build(plan.launch, x, roots, prefix, self.budget, k)
        else:
            _cpu.build_into(plan.tree, x, roots, prefix, self.budget, self.topk)
        self._tree = plan.tree
        return plan.tree

    def _plan(self, bs: int, depth: int, k: int) -> _Plan:
        """Views of the static buffers (and their pointers) for one shape, made once."""
        key = (bs, depth, k)
        plan = self._plans.get(key)
        if plan is None:
            shapes = _buffers.tree_shapes(bs, depth, k, self.budget)
            tree = Tree(**self._tree_bufs.view(shapes))
            scratch = {name: t[: bs * depth] for name, t in self._scratch.items()}
            launch = _cuda.LaunchPlan.of(tree, scratch) if self.device.type == "cuda" else None
            plan = self._plans[key] = _Plan(tree, launch)
        return plan

    def accept(self, target_logits, temperature=None, top_k=None, top_p=None, generator=None):
        """SPEC stage 4 for the tree of the last ``step``; returns views of static buffers."""
        self._check_open()
        if self._tree is None:
            raise RuntimeError("Stepper.accept: call step() first")
        tree = self._tree
        shapes = _buffers.acceptance_shapes(tree.batch_size, tree.depth)
        acc = Acceptance(**self._acc_bufs.view(shapes))
        _api.accept_into(tree, target_logits, acc, temperature, top_k, top_p, generator)
        self._acc = acc
        return acc

    def readback(self, wait: bool = False):
        """Host copy of the last acceptance (``accept_len``, ``accepted_tokens``, ``bonus``).

        On the CPU path the results are on the host as soon as ``accept`` returns, so this
        never has to wait; it returns None before the first ``accept``.
        """
        self._check_open()
        if self._acc is None:
            return None
        acc = self._acc
        return {
            "accept_len": acc.accept_len,
            "accepted_tokens": acc.accepted_tokens,
            "bonus": acc.bonus,
        }

    def close(self) -> None:
        """Releases the static buffers; the Stepper cannot be used afterwards."""
        self._tree_bufs = self._acc_bufs = None
        self._tree = self._acc = None
        self._plans.clear()
        self._scratch = {}

    def _check_open(self) -> None:
        if self._tree_bufs is None:
            raise RuntimeError("Stepper: used after close()")
