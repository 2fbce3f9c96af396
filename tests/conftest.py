"""Shared pytest fixtures and the random-logits generators of the parity suites."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

# Without a GPU, SGLang's Triton kernels (tests/sglang_release.py) run in Triton's
# interpreter; the switch must be on before anything imports triton.language, whose own
# @jit helpers (tl.sum, …) are decorated then. Nothing else here uses Triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

KINDS = ("gaussian", "peaked", "quantised", "all_equal", "masked", "logprob")


def raised(fn, errors=(TypeError, ValueError)):
    """(exception type name, message) of what ``fn()`` raises among ``errors``, or None:
    for tests that compare two paths' errors word for word."""
    try:
        fn()
    except errors as e:
        return type(e).__name__, str(e)
    return None


def draft_logits(rng: np.random.Generator, shape, kind: str, dtype=torch.float32) -> torch.Tensor:
    """Random logits of one of the mixes the issue names (ties, zero log-probs, -inf)."""
    bs, depth, vocab = shape
    if kind == "gaussian":
        x = rng.standard_normal(shape) * 2.0
    elif kind == "peaked":
        x = rng.standard_normal(shape)
        hot = rng.integers(0, vocab, size=(bs, depth, 3))
        np.put_along_axis(x, hot, rng.uniform(8, 20, size=hot.shape), axis=2)
    elif kind == "quantised":
        # Few distinct values, exactly representable in bf16: many exact ties.
        x = rng.integers(-6, 3, size=shape) * 0.5
    elif kind == "all_equal":
        x = np.full(shape, rng.integers(-3, 3) * 0.25)
    elif kind == "logprob":
        x = log_prob_rows(rng, shape)
    else:  # masked: -inf everywhere but a few tokens; some rows have one token (LP exactly 0)
        x = np.full(shape, -np.inf)
        keep = rng.integers(1, min(vocab, 4) + 1)
        idx = rng.integers(0, vocab, size=(bs, depth, keep))
        np.put_along_axis(x, idx, rng.integers(-2, 2, size=idx.shape) * 1.0, axis=2)
    return torch.from_numpy(x.astype(np.float32)).to(dtype)


def log_prob_rows(rng: np.random.Generator, shape) -> np.ndarray:
    """Rows that are already log-probabilities (a drafter whose head ends in log_softmax),
    so Z is near 0 and an ulp of Z is tiny. Every other row puts most tokens at one value
    3.5-15 below the top few: the same rounding error in every such term of the sum, which a
    normaliser with fp32 terms does not average out."""
    bs, depth, vocab = shape
    x = rng.standard_normal(shape) * 2.0
    tied = rng.integers(0, 2, size=(bs, depth, 1)).astype(bool)
    far = -rng.uniform(3.5, 15.0, size=(bs, depth, 1))
    x = np.where(tied, far, x)
    hot = rng.integers(0, vocab, size=(bs, depth, 3))
    np.put_along_axis(x, hot, np.where(tied, 0.0, np.take_along_axis(x, hot, 2)), axis=2)
    m = x.max(axis=2, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=2, keepdims=True)))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def has_cuda() -> bool:
    return torch.cuda.is_available()
