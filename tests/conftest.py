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

KINDS = ("gaussian", "peaked", "quantised", "all_equal", "masked")


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
    else:  # masked: -inf everywhere but a few tokens; some rows have one token (LP exactly 0)
        x = np.full(shape, -np.inf)
        keep = rng.integers(1, min(vocab, 4) + 1)
        idx = rng.integers(0, vocab, size=(bs, depth, keep))
        np.put_along_axis(x, idx, rng.integers(-2, 2, size=idx.shape) * 1.0, axis=2)
    return torch.from_numpy(x.astype(np.float32)).to(dtype)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def has_cuda() -> bool:
    return torch.cuda.is_available()
