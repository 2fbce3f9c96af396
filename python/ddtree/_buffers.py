"""Output tensors of a build or an accept, sized from SPEC.md's shapes."""

from __future__ import annotations

import torch

from . import _core
from ._types import Acceptance, Tree


def _shapes(fields) -> dict:
    return {name: (getattr(torch, dtype), tuple(shape)) for name, dtype, shape in fields}


def tree_shapes(bs: int, depth: int, k: int, budget: int) -> dict:
    """Field name → (dtype, shape) of a ``Tree`` (defined once, in ddtree-core's
    ``batch::tree_fields``)."""
    return _shapes(_core.tree_fields(bs, depth, k, budget))


def acceptance_shapes(bs: int, depth: int) -> dict:
    """Field name → (dtype, shape) of an ``Acceptance``, the fields a readback copies first
    and adjacent (FlatBuffers.span); defined in ddtree-core's ``batch::acceptance_fields``."""
    return _shapes(_core.acceptance_fields(bs, depth))


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


class FlatBuffers:
    """One allocation per dtype, holding a region per field sized for the largest shapes,
    in the order given; ``view`` carves the contiguous leading part of each region that a
    call needs, so no call allocates device memory."""

    def __init__(self, largest: dict, device: torch.device):
        self.regions = region_offsets(largest)
        sizes: dict = {}
        for dtype, start, numel in self.regions.values():
            sizes[dtype] = max(sizes.get(dtype, 0), start + numel)
        self.blocks = {d: torch.empty(n, dtype=d, device=device) for d, n in sizes.items()}
        self.storage = {
            name: self.blocks[dtype][start : start + numel]
            for name, (dtype, start, numel) in self.regions.items()
        }

    def view(self, shapes: dict) -> dict:
        return {
            name: self.storage[name][: _numel(shape)].view(shape)
            for name, (_, shape) in shapes.items()
        }

    def span(self, names) -> torch.Tensor:
        """The one contiguous slice of a block that holds the regions of `names` (adjacent
        fields of one dtype): a single copy moves them all."""
        return span_of(self.blocks, self.regions, names)


def region_offsets(largest: dict) -> dict:
    """name → (dtype, start, numel): each dtype's regions in the order given, each starting
    16-byte aligned (as a separate allocation would, for the kernels' vector accesses)."""
    ends: dict = {}
    out = {}
    for name, (dtype, shape) in largest.items():
        start = _aligned(ends.get(dtype, 0), dtype)
        out[name] = (dtype, start, _numel(shape))
        ends[dtype] = start + _numel(shape)
    return out


def _aligned(elements: int, dtype) -> int:
    unit = max(1, 16 // torch.empty((), dtype=dtype).element_size())
    return -(-elements // unit) * unit


def span_of(blocks: dict, regions: dict, names) -> torch.Tensor:
    parts = sorted((regions[n] for n in names), key=lambda r: r[1])
    dtype = parts[0][0]
    for (_, s0, n0), (d1, s1, _) in zip(parts, parts[1:], strict=False):
        if d1 != dtype or s1 != _aligned(s0 + n0, dtype):
            raise ValueError(f"span: {names} are not adjacent regions of one dtype")
    return blocks[dtype][parts[0][1] : parts[-1][1] + parts[-1][2]]


def new_tree(bs: int, depth: int, k: int, budget: int, device) -> Tree:
    shapes = tree_shapes(bs, depth, k, budget)
    return Tree(**{n: torch.empty(s, dtype=d, device=device) for n, (d, s) in shapes.items()})


def new_acceptance(bs: int, depth: int, device) -> Acceptance:
    shapes = acceptance_shapes(bs, depth)
    return Acceptance(**{n: torch.empty(s, dtype=d, device=device) for n, (d, s) in shapes.items()})
