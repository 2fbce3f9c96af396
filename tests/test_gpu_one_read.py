"""Stage 1 in one read (candidates.cuh `one_read`, fixed_sum.cuh's absolute grade): 16-bit rows
whose maximum lies in [6, 33] are summed in the read that finds their maximum. Its outputs
must be the two-read kernels' bit for bit: the partials path (`_partials.candidates`, whose
part blocks read twice and sum each part once the row's maximum is known) on the same rows, and
the CPU path within SPEC's ulp of Z. The rows are built for its branches: the grade's
edges, runs it queues whole (values of 9 and more, float64 terms above 11, NaN, +inf), a
queue past its cap (the second read), a first floor at -inf, a tail after the last run
(V = 5003), K up to kOneReadMaxK (128).

Marked `gpu`: skipped without CUDA.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ddtree
from ddtree import _partials, reference
from test_gpu import assert_same_tree, assert_z_within_one_ulp, tree_with_stages
from test_gpu_partials import bits, whole_row_stage1

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def gaussian(rng, shape, scale=2.0, shift=0.0) -> np.ndarray:
    return rng.standard_normal(shape) * scale + shift


# The absolute grade's edges, 6 and 33, and each dtype's neighbours of them (bf16: 2^-5 and
# 2^-2 apart there; fp16: 2^-8 and 2^-5), so that the rounded row keeps the maximum it is
# built with.
EDGE_TOPS = {
    torch.bfloat16: [5.96875, 6.0, 6.03125, 12.0, 20.0, 32.75, 33.0, 33.25, 40.0],
    torch.float16: [5.99609375, 6.0, 6.00390625, 12.0, 20.0, 32.96875, 33.0, 33.03125, 40.0],
}


def edge_rows(rng, shape, dtype) -> np.ndarray:
    """Gaussian rows whose maxima sit at the absolute grade's edges and inside it."""
    x = gaussian(rng, shape)
    tops = np.array(EDGE_TOPS[dtype])
    top = tops[np.arange(shape[0] * shape[1]) % len(tops)].reshape(shape[0], shape[1], 1)
    return x - x.max(axis=2, keepdims=True) + top


def late_rows(rng, shape, dtype) -> np.ndarray:
    """Rows whose first batch (each thread's first eight runs: the first 65,536 tokens of a
    whole block) peaks under 6 or in [6, 33] while the row's maximum lies elsewhere: two
    reads at once with an absolute row (a late 12) or a relative one (a late 40), and one
    read falling back to two (an early 8 and a late 40)."""
    x = gaussian(rng, shape, scale=1.0)
    late = shape[2] - 100
    rows = x.reshape(-1, shape[2])
    for r, row in enumerate(rows):
        early, top = ((None, 12.0), (None, 40.0), (8.0, 40.0))[r % 3]
        if early is not None:
            row[3] = early
        row[late] = top
    return x


def tied_kept_rows(rng, shape, dtype) -> np.ndarray:
    """12,000 tokens tied at 8 (in 1,500 runs, under 9: summed in the loop, queued for their
    tokens, no overflow) inside the first batch: more kept tokens than shared memory
    holds (kTieCap, 8,192), so the one read's selection takes the radix select."""
    x = gaussian(rng, shape, shift=-5.0)
    x[:, :, 1000:13_000] = 8.0
    return x


def refloored_rows(rng, shape, dtype) -> np.ndarray:
    """A first batch that peaks at 6.5 over a low background, then 2,500 runs of values in
    [6.5, 8.5] past it: the first batch's floor sits in the background, so the one read
    queues those runs and more background ones than its queue holds; the whole row's
    floor (near 8.5) keeps few, so the second read (absolute_pass) fits its queue."""
    x = gaussian(rng, shape, shift=-2.0)
    x[:, :, 5] = 6.5
    hot = x[:, :, min(70_000, shape[2] // 2) : 90_000]  # a short row: its second half
    hot[...] = rng.uniform(6.5, 8.5, size=hot.shape)
    return x


def queued_rows(rng, shape, dtype) -> np.ndarray:
    """A few values in [9, 11] and (11, 30] in every row (runs queued whole, float64 terms)."""
    x = gaussian(rng, shape)
    for lo, hi in ((9.0, 11.0), (11.0, 30.0)):
        hot = rng.integers(0, shape[2], size=(shape[0], shape[1], 5))
        np.put_along_axis(x, hot, rng.uniform(lo, hi, size=hot.shape), axis=2)
    return x


def overflow_rows(rng, shape, dtype) -> np.ndarray:
    """Most runs hold a value of 9 or more: the queue passes its cap, and with more runs
    queued whole than it holds, the second read skips absolute_pass (token by token)."""
    return gaussian(rng, shape, shift=9.0)


def masked_rows(rng, shape, dtype) -> np.ndarray:
    """-inf but for a few values near 20: the first batch's floor is -inf, every run queued."""
    x = np.full(shape, -np.inf)
    hot = rng.integers(0, shape[2], size=(shape[0], shape[1], 40))
    np.put_along_axis(x, hot, rng.uniform(18.0, 22.0, size=hot.shape), axis=2)
    return x


def tied_rows(rng, shape, dtype) -> np.ndarray:
    """Most tokens tied at one far value, a few at the top (every term's error the same)."""
    x = np.full(shape, -7.25) + rng.integers(0, 2, size=(shape[0], shape[1], 1)) * 20.0
    hot = rng.integers(0, shape[2], size=(shape[0], shape[1], 3))
    np.put_along_axis(x, hot, 21.0, axis=2)
    return x


ROWS = {
    "edges": edge_rows,
    "late": late_rows,
    "queued": queued_rows,
    "overflow": overflow_rows,
    "refloored": refloored_rows,
    "masked": masked_rows,
    "tied": tied_rows,
    "tied_kept": tied_kept_rows,
}


def rows_of(kind: str, shape, dtype, seed: int, poison: bool) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(ROWS[kind](rng, shape, dtype).astype(np.float32)).to(dtype)
    if poison:  # a NaN and a +inf, each in a run far below the row's top
        x[0, 0, shape[2] // 3] = float("nan")
        x[-1, -1, shape[2] // 2] = float("inf")
    return x


def assert_as_two_reads(x: torch.Tensor, k: int) -> None:
    """The one-block kernel (one read) == the partials path (two reads) bit for bit, and
    its log-probs within SPEC's ulp of the CPU path's where the row is finite."""
    x = x.cuda()
    lp, ti = whole_row_stage1(x, k, stages=1 | 16)  # 16: one block a row, never clusters
    chunk = 4096 if k < 64 else x.shape[2]  # the merge holds 8192 entries: parts x K
    got_lp, got_ti, _, _ = _partials.candidates([x], k, chunk)
    assert torch.equal(got_ti, ti)
    assert torch.equal(bits(got_lp), bits(lp))
    xs = x.float().cpu().numpy().reshape(-1, x.shape[2])
    lps = lp.cpu().numpy()
    for r in range(xs.shape[0]):
        if not np.isfinite(xs[r][~np.isneginf(xs[r])]).all():
            continue  # a rejected row: checked equal above
        want = reference.candidates(xs[r][None], k)
        np.testing.assert_array_equal(ti[r].cpu().numpy(), want.ids[0])
        assert_z_within_one_ulp(xs[r][None], want.logprobs, lps[r][None])


@pytest.mark.parametrize("kind", sorted(ROWS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_one_read_equals_two_reads(kind, dtype):
    for vocab, k, poison in ((151_936, 63, False), (151_936, 128, True), (5003, 7, True)):
        x = rows_of(kind, (2, 9, vocab), dtype, seed=vocab + k, poison=poison)
        assert_as_two_reads(x, k)


@pytest.mark.parametrize("kind", sorted(ROWS))
def test_one_read_over_clusters_and_half_blocks_equals_one_block(kind):
    """bs = 1 takes the clustered kernel (two reads of each block's chunk), 150 rows the
    half blocks (one read): both bit for bit the one-block kernel's tree (stage bit 16)."""
    for bs in (1, 10):
        x = rows_of(kind, (bs, 15, 151_936), torch.bfloat16, seed=bs, poison=bs > 1).cuda()
        roots = torch.zeros(bs, dtype=torch.int64, device="cuda")
        built = ddtree.build_tree(x, roots, roots, budget=63)
        assert_same_tree(built, tree_with_stages(x, roots, roots, 63, None, 7 | 16))
