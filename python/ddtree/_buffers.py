"""Output tensors of a build or an accept, sized from SPEC.md's shapes."""

from __future__ import annotations

import torch

from ._types import Acceptance, Tree


def tree_shapes(bs: int, depth: int, k: int, budget: int) -> dict:
    """Field name → (dtype, shape) of a ``Tree``."""
    q = budget + 1
    words = (q + 31) // 32
    i64 = torch.int64
    return {
        "verify_ids": (i64, (bs, q)),
        "positions": (i64, (bs, q)),
        "depths": (i64, (bs, q)),
        "parents": (i64, (bs, q)),
        "first_child": (i64, (bs, q)),
        "next_sibling": (i64, (bs, q)),
        "ancestor_bits": (torch.int32, (bs, q, words)),
        "num_nodes": (i64, (bs,)),
        "scores": (torch.float64, (bs, q)),
        "topk_logprobs": (torch.float32, (bs, depth, k)),
        "topk_ids": (i64, (bs, depth, k)),
        "status": (torch.int32, (bs,)),
    }


def acceptance_shapes(bs: int, depth: int) -> dict:
    i64 = torch.int64
    return {
        "accepted_nodes": (i64, (bs, depth + 1)),
        "accepted_tokens": (i64, (bs, depth + 1)),
        "accept_len": (i64, (bs,)),
        "bonus": (i64, (bs,)),
        "accept_index": (i64, (bs, depth + 1)),
    }


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


class FlatBuffers:
    """One flat tensor per field, allocated once for the largest shapes; ``view`` carves the
    contiguous leading part a call needs, so no call allocates device memory."""

    def __init__(self, largest: dict, device: torch.device):
        self.storage = {
            name: torch.empty(_numel(shape), dtype=dtype, device=device)
            for name, (dtype, shape) in largest.items()
        }

    def view(self, shapes: dict) -> dict:
        return {
            name: self.storage[name][: _numel(shape)].view(shape)
            for name, (_, shape) in shapes.items()
        }


def new_tree(bs: int, depth: int, k: int, budget: int, device) -> Tree:
    shapes = tree_shapes(bs, depth, k, budget)
    return Tree(**{n: torch.empty(s, dtype=d, device=device) for n, (d, s) in shapes.items()})


def new_acceptance(bs: int, depth: int, device) -> Acceptance:
    shapes = acceptance_shapes(bs, depth)
    return Acceptance(**{n: torch.empty(s, dtype=d, device=device) for n, (d, s) in shapes.items()})
