"""Sampled accept at a real vocabulary: top-k and top-p cuts that fall inside a group of
tied values (SPEC stage 4: ties by lower id). Every draw must land in the exact kept set,
computed here from a stable sort, independently of the kernel's bins and radix passes.

Each row is its own request (a root-only tree whose child carries token 3), so one call
gives one draw per row; many rows and seeds make a wrongly kept token show up.
Marked `gpu`: skipped without CUDA.
"""

from __future__ import annotations

import os

import pytest
import torch

import ddtree

DEV = os.environ.get("DDTREE_TIES_DEVICE", "cuda")  # "cpu": check the test on the CPU path

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEV == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = os.environ.get("DDTREE_TIES_DEVICE", "cuda")  # "cpu": check the test on the CPU path
V = 151936
SLICE = 18992  # the accept kernel's per-block slice at this V (8 blocks share a row)


def spec_ranks(rows: torch.Tensor) -> torch.Tensor:
    """Each token's position in SPEC's order (value descending, lower id first on ties)."""
    order = torch.sort(rows.float(), dim=1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(rows.shape[1], device=rows.device).expand_as(order))
    return ranks


def top_p_count(rows: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """How many tokens (in SPEC order) the top-p cut keeps, per row, in float64."""
    x = torch.sort(rows.double(), dim=1, descending=True).values
    p = torch.softmax(x / temperature, dim=1)
    cum = torch.cumsum(p, dim=1)
    return (cum < top_p).sum(dim=1) + 1


def mid_token_top_p(rows: torch.Tensor, temperature: float, keep: int) -> float:
    """A top_p whose crossing falls in the middle of the `keep`-th token of every row (the
    rows are identical in their order's masses), so rounding cannot move the cut."""
    x = torch.sort(rows[0].double(), descending=True).values
    cum = torch.cumsum(torch.softmax(x / temperature, 0), 0)
    return float((cum[keep - 2] + cum[keep - 1]) / 2)


def draws(rows: torch.Tensor, seeds, **sampling) -> torch.Tensor:
    """[len(seeds), n] first new tokens, one per row per seed."""
    n = rows.shape[0]
    x = torch.zeros(n, 1, 8, device=DEV)
    x[:, 0, 3] = 5.0
    z = torch.zeros(n, dtype=torch.int64, device=DEV)
    tree = ddtree.build_tree(x, z, z, budget=1)
    target = rows.unsqueeze(1).expand(n, 2, V).contiguous()
    out = []
    for seed in seeds:
        acc = ddtree.accept_tree(tree, target, generator=seed, **sampling)
        out.append(torch.where(acc.accept_len == 2, acc.accepted_tokens[:, 1], acc.bonus))
    return torch.stack(out)


def assert_inside(rows, tokens, keep, tie_ids) -> int:
    """No draw outside the first `keep` tokens of its row; returns the draws in the tie."""
    ranks = spec_ranks(rows)
    r = torch.gather(ranks, 1, tokens.T)
    outside = r >= keep.view(-1, 1)
    assert not outside.any(), (
        f"{int(outside.sum())} draws outside the kept set, e.g. token "
        f"{int(tokens.T[outside][0])} at rank {int(r[outside][0])} (keep {keep.tolist()[:4]})"
    )
    return int(torch.isin(tokens, tie_ids).sum())


def tie_rows(n, dtype, top, tie_value, tie_ids, tail, seed):
    """n rows: tail noise (mean, std), 8 tokens at `top`, `tie_ids` all at `tie_value`."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    rows = torch.randn(n, V, device=DEV, generator=g) * tail[1] + tail[0]
    rows[:, 100:108] = top
    rows[:, tie_ids] = tie_value
    return rows.to(dtype)


def scattered_ties(count, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randperm(V - 200, generator=g)[:count] + 200
    return ids.to(DEV)


def boundary_ties():
    """Ids on both sides of the boundary between the row's 3rd and 4th block."""
    return torch.arange(3 * SLICE - 600, 3 * SLICE + 600, device=DEV)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize(
    "case",
    ["near", "far_below", "block_boundary"],
)
def test_top_k_cut_inside_a_tie_keeps_only_the_lower_ids(dtype, case):
    if case == "near":  # the tie is 2 nats below the top: most draws land in it
        tie, rows = scattered_ties(3000, 1), None
        rows = tie_rows(512, dtype, 4.0, 2.0, tie, (-3.0, 0.5), 11)
    elif case == "far_below":  # 7 nats below the top at T=2, the tail 2.5 further down
        tie = scattered_ties(3000, 2)
        rows = tie_rows(512, dtype, 16.0, 2.0, tie, (-3.0, 0.5), 12)
    else:  # the tie straddles the boundary between the row's 3rd and 4th block
        tie = boundary_ties()
        rows = tie_rows(512, dtype, 4.0, 2.0, tie, (-3.0, 0.5), 13)
    temperature = 2.0 if case == "far_below" else 1.0
    in_tie = 0
    for extra in (1, 599, 600, 601, 1500):
        k = 8 + min(extra, len(tie) - 1)
        tokens = draws(rows, range(4), temperature=temperature, top_k=k)
        keep = torch.full((rows.shape[0],), k, device=DEV)
        in_tie += assert_inside(rows, tokens, keep, tie)
    assert in_tie > 500, f"only {in_tie} draws in the tie group: the test has no power"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", ["near", "block_boundary"])
def test_top_p_cut_inside_a_tie_keeps_only_the_lower_ids(dtype, case):
    tie = scattered_ties(3000, 3) if case == "near" else boundary_ties()
    # Identical rows (the tail is the same in each), so one top_p puts every row's crossing
    # in the middle of one token.
    rows = tie_rows(1, dtype, 4.0, 2.0, tie, (-3.0, 0.5), 14).expand(512, V).contiguous()
    in_tie = 0
    for extra in (1, 300, 600, 601):
        keep_n = 8 + extra
        top_p = mid_token_top_p(rows, 1.0, keep_n)
        assert int(top_p_count(rows[:1], 1.0, top_p)[0]) == keep_n
        tokens = draws(rows, range(4), temperature=1.0, top_p=top_p)
        keep = torch.full((rows.shape[0],), keep_n, device=DEV)
        in_tie += assert_inside(rows, tokens, keep, tie)
    assert in_tie > 500, f"only {in_tie} draws in the tie group: the test has no power"


def test_the_reported_case_top_k_1000_at_temperature_1_3():
    """Issue 12's rows: a flat normal tail (sigma 0.5) and 20 tokens raised by +9, bf16,
    T = 1.3, top_k = 1000 (the 1000th value is tied with its neighbours). Every row is a
    fresh random row, so the cut's tie differs row by row."""
    g = torch.Generator(device=DEV).manual_seed(5)
    n = 2048
    rows = torch.randn(n, V, device=DEV, generator=g) * 0.5
    hot = torch.randint(0, V, (n, 20), device=DEV, generator=g)
    rows.scatter_add_(1, hot, torch.full((n, 20), 9.0, device=DEV))
    rows = rows.to(torch.bfloat16)
    # A high temperature puts most of the mass in the tail, where the cut is.
    for temperature in (1.3, 6.0):
        tokens = draws(rows, range(8), temperature=temperature, top_k=1000)
        ranks = torch.gather(spec_ranks(rows), 1, tokens.T)
        assert int((ranks >= 1000).sum()) == 0, f"T={temperature}: {int((ranks >= 1000).sum())}"
        if temperature > 2:
            assert int((ranks >= 900).sum()) > 500  # draws reach the cut's neighbourhood
