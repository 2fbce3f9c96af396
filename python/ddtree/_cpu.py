"""The Rust CPU path: hands validated tensors to ``ddtree._core`` (no copies), which reads
their addresses, shapes and strides itself; a ``Tree`` or an ``Acceptance`` goes over whole
(``crates/ddtree-py/src/buffers.rs`` holds the field lists)."""

from __future__ import annotations

import torch

from . import _core
from ._types import Acceptance, Tree


def build_into(tree: Tree, draft_logits, root_tokens, prefix_lens, budget: int, topk) -> None:
    """SPEC stages 1–3 into the (contiguous) tensors of ``tree``; the GIL is released."""
    _core.build_tree(draft_logits, root_tokens, prefix_lens, budget, topk, tree)


def select_emit(tree: Tree, eligible: torch.Tensor, root_tokens, prefix_lens, vocab: int):
    """SPEC stages 2–3 into ``tree`` from the stage-1 results it already holds; ``eligible``
    is int32 ``[bs * L]`` (finite ranks per row, -1 for a rejected row)."""
    bs, depth, k = tree.topk_ids.shape
    _core.select_emit(
        eligible,
        root_tokens,
        prefix_lens,
        [bs, depth, vocab],
        tree.width - 1,
        k,
        tree,
    )


def accept_tokens_into(tree: Tree, posterior_tokens: torch.Tensor, acc: Acceptance) -> None:
    """SPEC stage 4 with one posterior token per node given (int64 ``[bs, Q]``)."""
    _core.accept_tokens(posterior_tokens, tree, acc)


def accept_greedy_into(tree: Tree, target_logits: torch.Tensor, acc: Acceptance) -> None:
    _core.accept_greedy(target_logits, tree, acc)


def accept_sampled_into(
    tree: Tree, target_logits: torch.Tensor, acc: Acceptance, params, seed: int
) -> None:
    temperature, top_k, top_p = params
    _core.accept_sampled(target_logits, tree, acc, temperature, top_k, top_p, seed)


def full_mask(ancestor_bits: torch.Tensor, seq_lens: torch.Tensor, out, write_prefix) -> int:
    bs, q, _ = ancestor_bits.shape
    bits = ancestor_bits.contiguous()
    return _core.sglang_custom_mask(bits, bs, q, seq_lens, write_prefix, out, out.numel())
