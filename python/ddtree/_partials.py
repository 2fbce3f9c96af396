"""SPEC stage 1 as mergeable partials on the GPU (``kernels/include/ddtree/partials.cuh``).

A row's vocabulary is cut into parts — chunks of one GPU's row, or of each tensor-parallel
rank's shard — and each part is reduced to its top K (global ids), its maximum, its NaN/+inf
flag and, once every part's maximum is known, its fixed-point exp-sum. The merge gives
stage 1's log-probs, ids, eligible counts and flags exactly as the one-block kernel gives
them for the whole row. Between the parts and the merge the part arrays (a few hundred bytes
a row) are what ranks would all-gather.

Run on an H200 in session 18: ``tests/test_gpu_partials.py`` passed (any cut merges to
``build_tree``'s stage 1 bit for bit), and compute-sanitizer found nothing; as a stand-in
for the one-block stage 1 of a whole row they are slower except at bs = 1 with large K
(BENCHMARKS.md).
"""

from __future__ import annotations

import torch

from . import _core
from ._cuda import launch_on


def part_arrays(rows: int, parts: int, k: int, device) -> dict:
    """Empty part arrays for `rows` rows of `parts` lists of `k`."""
    return {
        "values": torch.empty(rows, parts, k, dtype=torch.float32, device=device),
        "ids": torch.empty(rows, parts, k, dtype=torch.int64, device=device),
        "maxima": torch.empty(rows, parts, dtype=torch.float32, device=device),
        "bad": torch.empty(rows, parts, dtype=torch.int32, device=device),
        "sums": torch.empty(rows, parts, 2, dtype=torch.int64, device=device),
    }


def parts(x: torch.Tensor, chunk: int, arrays: dict, which: str, part_base=0, id0=0) -> None:
    """The parts ("parts": lists, maxima, flags) or their sums ("sums") of logits `x`
    ``[bs, L, V]``, cut every `chunk` tokens, into `arrays` from list `part_base` on; `x`'s
    token 0 is global id `id0` (a shard's first token)."""
    _core.cuda_stage1_parts(*launch_on(x.device), which, x, chunk, part_base, id0, arrays)


def merge_outputs(rows: int, k: int, device) -> tuple:
    """Empty (log-probs float32 ``[rows, k]``, ids int64, eligible int32 ``[rows]``,
    NaN/+inf flag int32) for `merge`."""
    return (
        torch.empty(rows, k, dtype=torch.float32, device=device),
        torch.empty(rows, k, dtype=torch.int64, device=device),
        torch.empty(rows, dtype=torch.int32, device=device),
        torch.empty(rows, dtype=torch.int32, device=device),
    )


def merge(arrays: dict, out: tuple | None = None) -> tuple:
    """Stage 1's (log-probs, ids, eligible, flags) from complete part arrays, into `out`
    (`merge_outputs`) or new tensors."""
    rows, _, k = arrays["values"].shape
    if out is None:
        out = merge_outputs(rows, k, arrays["values"].device)
    _core.cuda_stage1_merge(*launch_on(out[0].device), arrays, *out)
    return out


def chunk_for(vocab: int, k: int, rows: int, device) -> int:
    """The part size that fills `device` (two part blocks an SM) for `rows` rows."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return _core.cuda_part_chunk(vocab, k, rows, 2 * sms)


def candidates(shards: list[torch.Tensor], k: int, chunk: int):
    """Stage 1 of the rows whose vocabulary is `shards` concatenated (each ``[bs, L, V_i]``
    on one GPU, in vocabulary order), every shard cut every `chunk` tokens: the parts, their
    sums, then the merge — what ranks holding those shards would compute, without the
    collectives. Returns `merge`'s four tensors."""
    bs, depth, _ = shards[0].shape
    if not 1 <= k <= sum(s.shape[2] for s in shards):
        raise ValueError(f"k: must be in 1..V (the shards' tokens), got {k}")
    counts = [-(-s.shape[2] // chunk) for s in shards]
    arrays = part_arrays(bs * depth, sum(counts), k, shards[0].device)
    for which in ("parts", "sums"):
        base = id0 = 0
        for s, n in zip(shards, counts, strict=True):
            parts(s, chunk, arrays, which, base, id0)
            base, id0 = base + n, id0 + s.shape[2]
    return merge(arrays)
