"""The CPU sampler: committed tokens follow the target's filtered distribution (chi-square)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import ddtree

VOCAB = 8
LOGITS = torch.tensor([2.0, 1.5, 1.5, 1.0, 0.3, 0.0, -0.5, -1.0])


def first_new_tokens(draws: int, seed, device="cpu", **sampling) -> np.ndarray:
    """The first token committed after the root, for `draws` independent requests.

    The tree is root → one child; the first new token is the root's posterior either way
    (accepted as the child's token, or as the bonus), so its law is the filtered target's.
    """
    x = torch.zeros(draws, 1, VOCAB)
    x[:, 0, 3] = 5.0  # the child carries token 3
    z = torch.zeros(draws, dtype=torch.int64)
    tree = ddtree.build_tree(x.to(device), z.to(device), z.to(device), budget=1)
    target = LOGITS.expand(draws, 2, VOCAB).contiguous().to(device)
    acc = ddtree.accept_tree(tree, target, generator=seed, **sampling)
    return torch.where(acc.accept_len == 2, acc.accepted_tokens[:, 1], acc.bonus).cpu().numpy()


def filtered(temperature: float, top_k: int | None, top_p: float | None) -> np.ndarray:
    """SPEC stage 4's distribution, written out independently of the implementation."""
    p = torch.softmax(LOGITS.double() / temperature, 0).numpy()
    order = sorted(range(VOCAB), key=lambda i: (-p[i], i))
    keep = order[: top_k or VOCAB]
    if top_p is not None:
        mass, cut = p[keep].sum(), []
        for i in keep:
            if sum(p[j] for j in cut) >= top_p * mass:
                break
            cut.append(i)
        keep = cut
    q = np.zeros(VOCAB)
    q[keep] = p[keep]
    return q / q.sum()


def chi_square_limit(df: int, z: float = 3.29) -> float:
    """Wilson–Hilferty upper quantile of chi-square (z = 3.29: p ≈ 0.9995)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi_square(tokens: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    counts = np.bincount(tokens, minlength=VOCAB)
    assert counts[probs == 0].sum() == 0, f"drew a filtered-out token: {counts}"
    live = probs > 0
    expected = probs[live] * tokens.size
    return float(((counts[live] - expected) ** 2 / expected).sum()), int(live.sum()) - 1


CASES = [
    (1.0, None, None),
    (0.6, None, None),
    (1.7, 3, None),
    (1.0, None, 0.8),
    (1.0, 5, 0.9),
    (1.0, 2, None),  # a top-k boundary inside a tie (tokens 1 and 2 tie): lower id kept
]


@pytest.mark.parametrize("temperature, top_k, top_p", CASES)
def test_sampled_tokens_follow_the_filtered_distribution(temperature, top_k, top_p):
    tokens = first_new_tokens(40_000, 11, temperature=temperature, top_k=top_k, top_p=top_p)
    stat, df = chi_square(tokens, filtered(temperature, top_k, top_p))
    assert stat < chi_square_limit(max(df, 1)), stat


def test_the_chi_square_test_catches_a_wrong_temperature_or_top_p():
    tokens = first_new_tokens(40_000, 5, temperature=1.0)
    stat, df = chi_square(tokens, filtered(1.2, None, None))
    assert stat > chi_square_limit(df)
    # top_p one token short: the sample holds a token the wrong law forbids.
    tokens = first_new_tokens(40_000, 5, temperature=1.0, top_p=0.8)
    wrong = filtered(1.0, None, 0.6)
    with pytest.raises(AssertionError, match="filtered-out"):
        chi_square(tokens, wrong)


def test_same_seed_same_draws_and_generators_advance():
    a = first_new_tokens(500, 3, temperature=1.0)
    assert np.array_equal(a, first_new_tokens(500, 3, temperature=1.0))
    assert not np.array_equal(a, first_new_tokens(500, 4, temperature=1.0))
    g = torch.Generator().manual_seed(0)
    b1 = first_new_tokens(500, g, temperature=1.0)
    b2 = first_new_tokens(500, g, temperature=1.0)
    assert not np.array_equal(b1, b2)
    g.manual_seed(0)
    assert np.array_equal(b1, first_new_tokens(500, g, temperature=1.0))


def test_per_request_temperature_zero_is_greedy():
    temps = torch.tensor([0.0, 1.0] * 200)
    tokens = first_new_tokens(400, 9, temperature=temps)
    assert (tokens[::2] == 0).all()  # argmax of LOGITS
    assert len(set(tokens[1::2].tolist())) > 1


def test_a_temperature_too_small_to_divide_by_is_refused():
    """1 / 1e-310 is inf: the scaled logits would be NaN or inf, and the draw wrong."""
    with pytest.raises(ValueError, match="temperature: a positive temperature must have"):
        first_new_tokens(2, 0, temperature=1e-310)
    assert (first_new_tokens(50, 0, temperature=1e-300) == 0).all()  # tiny but usable: argmax
