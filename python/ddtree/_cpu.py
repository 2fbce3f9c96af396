"""The Rust CPU path: hands validated tensors to ``ddtree._core`` by pointer (no copies).
A ``Tree`` or an ``Acceptance`` goes over whole: ``_core`` reads each field's ``data_ptr()``
itself (``crates/ddtree-py/src/buffers.rs`` holds the field lists)."""

from __future__ import annotations

import torch

from . import _core
from ._types import Acceptance, Tree


def tensor_arg(t: torch.Tensor) -> dict:
    """What ``_core`` reads a strided tensor through: pointer, dtype, shape, element strides."""
    return {
        "ptr": t.data_ptr(),
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": tuple(t.shape),
        "strides": tuple(t.stride()),
    }


def build_into(tree: Tree, draft_logits, root_tokens, prefix_lens, budget: int, topk) -> None:
    """SPEC stages 1–3 into the (contiguous) tensors of ``tree``; the GIL is released."""
    _core.build_tree(
        tensor_arg(draft_logits), root_tokens.data_ptr(), prefix_lens.data_ptr(), budget, topk, tree
    )


def select_emit(tree: Tree, eligible: torch.Tensor, root_tokens, prefix_lens, vocab: int):
    """SPEC stages 2–3 into ``tree`` from the stage-1 results it already holds; ``eligible``
    is int32 ``[bs * L]`` (finite ranks per row, -1 for a rejected row)."""
    bs, depth, k = tree.topk_ids.shape
    _core.select_emit(
        eligible.data_ptr(),
        root_tokens.data_ptr(),
        prefix_lens.data_ptr(),
        [bs, depth, vocab],
        tree.width - 1,
        k,
        tree,
    )


def accept_tokens_into(tree: Tree, posterior_tokens: torch.Tensor, acc: Acceptance) -> None:
    """SPEC stage 4 with one posterior token per node given (int64 ``[bs, Q]``)."""
    _core.accept_tokens(posterior_tokens.data_ptr(), tree, acc)


def accept_greedy_into(tree: Tree, target_logits: torch.Tensor, acc: Acceptance) -> None:
    _core.accept_greedy(tensor_arg(target_logits), tree, acc)


def accept_sampled_into(
    tree: Tree, target_logits: torch.Tensor, acc: Acceptance, params, seed: int
) -> None:
    temperature, top_k, top_p = params
    _core.accept_sampled(
        tensor_arg(target_logits),
        tree,
        acc,
        temperature.data_ptr(),
        top_k.data_ptr(),
        top_p.data_ptr(),
        seed,
    )


def full_mask(ancestor_bits: torch.Tensor, seq_lens: torch.Tensor, out, write_prefix) -> int:
    bs, q, _ = ancestor_bits.shape
    bits = ancestor_bits.contiguous()
    return _core.sglang_custom_mask(
        bits.data_ptr(), bs, q, seq_lens.data_ptr(), write_prefix, out.data_ptr(), out.numel()
    )
