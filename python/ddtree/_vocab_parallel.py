"""Vocab-parallel (tensor-parallel) build and greedy accept: each rank holds the logits of a
contiguous slice of the vocabulary, and every rank returns the tree / acceptance the
single-process call gives on the concatenated logits, bit for bit.

What crosses the ranks (``torch.distributed.all_gather`` on ``group``), per row of the
``[bs, L]`` draft rows: the shard's best K tokens (values and global ids), its maximum and a
NaN flag, then its fixed-point exp-sum against the row's maximum — about 12·K + 21 bytes a
row, where gathering the logits would move 2·V. The merge is ``ddtree-core``'s (Rust), the
function the single-process path uses for stage 1's normaliser (`crates/ddtree-core/src/
shard.rs`). The accept gathers each node's shard maximum and its first token.

Supported here: CPU tensors (the gloo backend), greedy accept. CUDA tensors with a group and
sampled accept over shards are refused with a message naming the argument.
"""

from __future__ import annotations

import torch

from . import _buffers, _core, _cpu
from ._types import Acceptance, Tree

INT64_MAX = 2**63 - 1


def _dist():
    import torch.distributed as dist

    return dist


def gather(t: torch.Tensor, group) -> torch.Tensor:
    """Every rank's `t` (same shape on each), stacked in group-rank order ``[tp, ...]``."""
    dist = _dist()
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t.contiguous(), group=group)
    return torch.stack(out)


def layout(v_local: int, group, vocab_start) -> tuple[int, int]:
    """(this rank's first global token id, the global vocabulary V). Shards are in rank
    order unless every rank passes ``vocab_start``; either way they must tile ``0..V``."""
    mine = torch.tensor([-1 if vocab_start is None else int(vocab_start), v_local])
    every = gather(mine, group)  # [tp, 2]
    starts, sizes = every[:, 0], every[:, 1]
    given = starts >= 0
    if bool(given.any()) and not bool(given.all()):
        raise ValueError("vocab_start: give it on every rank of the group or on none")
    if not bool(given.any()):
        starts = torch.cumsum(sizes, 0) - sizes
    order = torch.argsort(starts)
    ends = (starts + sizes)[order]
    if int(starts[order[0]]) != 0 or not torch.equal(starts[order][1:], ends[:-1]):
        raise ValueError(
            f"vocab_start: the shards (start, size) {every.tolist()} do not tile the "
            "vocabulary from 0 without gaps or overlaps"
        )
    rank = _dist().get_rank(group)
    return int(starts[rank]), int(ends[-1])


def check_cpu(x: torch.Tensor, name: str) -> None:
    if x.device.type != "cpu":
        raise ValueError(
            f"{name}: a vocab-parallel call (group=) takes CPU tensors (gloo) for now; "
            f"got {x.device}"
        )


def build_into(x, roots, prefix, budget: int, topk, group, vocab_start) -> Tree:
    """SPEC stages 1–3 on this rank's shard `x` ``[bs, L, V_r]`` (checked)."""
    from ._api import k_of
    from ._validate import in_vocab

    check_cpu(x, "draft_logits")
    bs, depth, v_local = x.shape
    start, vocab = layout(v_local, group, vocab_start)
    in_vocab("root_tokens", roots, vocab)
    k = k_of(budget, vocab, topk)
    rows = bs * depth
    values = torch.empty(rows, k, dtype=torch.float32)
    ids = torch.empty(rows, k, dtype=torch.int64)
    maxima = torch.empty(rows, dtype=torch.float32)
    bad = torch.empty(rows, dtype=torch.uint8)
    _core.shard_partials(x, start, k, values, ids, maxima, bad)
    g_values, g_ids, g_max, g_bad = (gather(t, group) for t in (values, ids, maxima, bad))
    row_max = g_max.max(0).values.contiguous()  # comparisons only: the same on every rank
    sums = torch.empty(rows, 2, dtype=torch.int64)
    _core.shard_sums(x, row_max, sums)
    g_sums = gather(sums, group)
    tree = _buffers.new_tree(bs, depth, k, budget, x.device)
    eligible = torch.empty(rows, dtype=torch.int32)
    _core.merge_partials(g_values.shape[0], rows, k, g_values, g_ids, g_bad, g_sums, row_max,
                         tree.topk_logprobs, tree.topk_ids, eligible)  # fmt: skip
    _cpu.select_emit(tree, eligible, roots, prefix, vocab)
    return tree


def greedy_posterior(t: torch.Tensor, group, vocab_start) -> torch.Tensor:
    """Each node's greedy posterior token ``[bs, Q]`` (global ids) from this rank's shard
    `t` ``[bs, Q, V_r]``: the first maximum over the whole vocabulary, NaN counting as
    ``-inf`` and token 0 where no value is above ``-inf`` — the single-process argmax."""
    check_cpu(t, "target_logits")
    start, _ = layout(t.shape[2], group, vocab_start)
    x = t.float()
    x = torch.where(torch.isnan(x), float("-inf"), x)
    best, idx = x.max(-1)  # the first maximum of the shard
    g_best, g_ids = gather(best, group), gather(idx + start, group)
    top = g_best.max(0).values
    first = torch.where(g_best == top, g_ids, INT64_MAX).min(0).values
    return torch.where(top == float("-inf"), 0, first).contiguous()


def accept_into(tree: Tree, t: torch.Tensor, acc: Acceptance, group, vocab_start) -> None:
    _cpu.accept_tokens_into(tree, greedy_posterior(t, group, vocab_start), acc)
