"""Stage 1 as mergeable partials on the GPU (`ddtree._partials`, partials.cuh): the merge of
any cut of the vocabulary — chunks of one row, shards as tensor-parallel ranks hold them,
shards cut into chunks — gives the one-block stage 1 of `build_tree`, bit for bit.

Marked `gpu`: skipped without CUDA. Written in session 17; passed on an H200 in session 18.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import KINDS, draft_logits

from ddtree import _buffers, _cuda, _partials

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def whole_row_stage1(x: torch.Tensor, k: int, stages: int = 1):
    """The stage-1 outputs (K = k) for logits `x`, that stage alone (the selection would
    blank a rejected request's other rows); ``stages=1 | 16`` keeps the one-block kernel
    where the launch would spread the rows over clusters."""
    bs, depth, _ = x.shape
    zeros = torch.zeros(bs, dtype=torch.int64, device=x.device)
    tree = _buffers.new_tree(bs, depth, k, k, x.device)
    scratch = _cuda.new_scratch(bs * depth, x.device)
    _cuda.launch_build(tree, scratch, x, zeros, zeros, k, k, stages=stages)
    return tree.topk_logprobs.flatten(0, 1), tree.topk_ids.flatten(0, 1)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def cut(x: torch.Tensor, at: list[int]) -> list[torch.Tensor]:
    """`x`'s vocabulary cut at `at`, each piece a contiguous tensor (a rank's shard)."""
    edges = [0, *at, x.shape[2]]
    return [x[:, :, a:b].contiguous() for a, b in zip(edges, edges[1:], strict=False)]


ROOM = 8192  # the merge's entries in shared memory (partials::MAX_PART_ENTRIES): parts x K


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_any_cut_of_the_vocabulary_merges_to_the_whole_rows_stage1(kind, dtype):
    rng = np.random.default_rng(17)
    for vocab, k in ((300, 7), (5000, 64), (151_936, 255), (20_000, 1023)):
        x = draft_logits(rng, (2, 3, vocab), kind, dtype).cuda()
        lp, ti = whole_row_stage1(x, k)
        two = sorted(rng.choice(np.arange(1, vocab), 2, replace=False).tolist())
        for at in ([], [vocab // 3], two):
            shards = cut(x, at)
            for chunk in (64, 4096, vocab):
                if sum(-(-s.shape[2] // chunk) for s in shards) * k > ROOM:
                    continue  # more lists than one merge holds
                got_lp, got_ti, eligible, bad = _partials.candidates(shards, k, chunk)
                where = f"{kind} {dtype} V={vocab} K={k} cuts={at} chunk={chunk}"
                assert torch.equal(bits(got_lp), bits(lp)), where
                assert torch.equal(got_ti, ti), where
                assert bool((bad == 0).all()), where
                assert torch.equal(eligible, torch.isfinite(lp).sum(1).int()), where


def test_nan_or_inf_in_one_part_rejects_only_its_row():
    rng = np.random.default_rng(3)
    x = draft_logits(rng, (2, 2, 9000), "gaussian", torch.bfloat16).cuda()
    x[0, 1, 8500] = float("nan")
    x[1, 0, 10] = float("inf")
    lp, ti = whole_row_stage1(x, 16)
    got_lp, got_ti, eligible, bad = _partials.candidates(cut(x, [4500]), 16, 4096)
    assert bad.tolist() == [0, 1, 1, 0]
    assert torch.equal(bits(got_lp), bits(lp)) and torch.equal(got_ti, ti)
    assert eligible.tolist()[1:3] == [0, 0]


def test_ties_across_part_boundaries_keep_the_lower_id_first():
    # Every token equal: the top K are ids 0..K-1, taken from the first parts only.
    x = torch.zeros(1, 1, 10_000, dtype=torch.bfloat16, device="cuda")
    got_lp, got_ti, _, _ = _partials.candidates(cut(x, [37, 5000]), 100, 1024)  # 11 parts
    assert got_ti[0].tolist() == list(range(100))
    # -0.0 ties with 0.0 in the rank order, but its log-prob keeps its sign: a row whose one
    # finite token is -0.0 has Z = 0 and LP = -0.0 - 0 = -0.0.
    x = torch.full((1, 1, 5000), float("-inf"), dtype=torch.float32, device="cuda")
    x[0, 0, 4000] = -0.0
    lp, _ = whole_row_stage1(x, 4)
    got_lp, got_ti, _, _ = _partials.candidates(cut(x, [1000]), 4, 64)
    assert torch.equal(bits(got_lp), bits(lp)) and got_ti[0, 0].item() == 4000
    assert bits(got_lp)[0, 0].item() == -(2**31)  # the bits of -0.0


def test_all_minus_inf_parts_add_nothing():
    x = torch.full((1, 2, 6000), float("-inf"), dtype=torch.float32, device="cuda")
    x[0, 0, 5999] = 1.5  # one finite token, in the last part: LP exactly 0
    lp, ti = whole_row_stage1(x, 8)
    got_lp, got_ti, eligible, _ = _partials.candidates(cut(x, [3000]), 8, 1024)
    assert torch.equal(bits(got_lp), bits(lp)) and torch.equal(got_ti, ti)
    assert eligible.tolist() == [1, 0] and got_lp[0, 0].item() == 0.0
