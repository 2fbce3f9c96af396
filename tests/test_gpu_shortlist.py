"""The draw by shortlist (kernels/include/ddtree/shortlist.cuh) is sample_row's draw, token
for token: the same batches accepted in this process and in one started with
``DDTREE_SAMPLING=exhaustive`` (every draw by sample_row's passes) give identical
acceptances. Inputs mix bf16 ties, peaked and flat rows, -inf and NaN entries, logits large
enough to turn pruning off, and per-request temperature / top-k / top-p (with greedy
requests among them), at a small and a real vocabulary.

Marked `gpu`: skipped without CUDA. Run on the lent H200 by tests/gpu_run.sh.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import ddtree
from ddtree import Tree

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = "cuda"

# Run in a fresh process (the switch is read when the device is first used).
EXHAUSTIVE = """
import sys, torch, ddtree
cases = torch.load(sys.argv[1])
out = []
for c in cases:
    tree = ddtree.Tree(**{k: v.cuda() for k, v in c["tree"].items()})
    kw = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in c["sampling"].items()}
    acc = ddtree.accept_tree(tree, c["target"].cuda(), generator=c["seed"], **kw)
    out.append({k: getattr(acc, k).cpu() for k in ("accepted_nodes", "accepted_tokens",
                                                  "accept_len", "bonus")})
torch.save(out, sys.argv[2])
"""


def target_rows(g: torch.Generator, tree: Tree, vocab: int, dtype) -> torch.Tensor:
    """[bs, Q, vocab] rows of five kinds, chosen per request; each node's first child's token
    raised by a random amount so that walks go deep."""
    bs, q = tree.verify_ids.shape
    kind = torch.randint(0, 5, (bs, 1, 1), device=DEV, generator=g)
    noise = torch.randn(bs, q, vocab, device=DEV, generator=g)
    ties = torch.randint(-6, 3, (bs, q, vocab), device=DEV, generator=g).float() * 0.5
    peaked = noise * 2.0
    hot = torch.randint(0, vocab, (bs, q, 6), device=DEV, generator=g)
    peaked.scatter_(2, hot, 6.0 + 6.0 * torch.rand(bs, q, 6, device=DEV, generator=g))
    x = torch.where(kind == 0, ties, torch.where(kind == 1, peaked, noise * 3.0))
    x = torch.where(kind == 3, ties * 4.0e6, x)  # |m / T| beyond 2^20: pruning off
    masked = torch.rand(bs, q, vocab, device=DEV, generator=g) < 0.2
    x = torch.where((kind == 4) & masked, torch.full_like(x, -float("inf")), x)
    x[kind.view(-1) == 4, :, 1] = float("nan")
    child = tree.first_child.clamp(min=0)
    token = torch.gather(tree.verify_ids, 1, child)
    lift = (tree.first_child >= 0) * (4.0 + 20.0 * torch.rand(bs, q, device=DEV, generator=g))
    x.scatter_add_(2, token.unsqueeze(2), lift.unsqueeze(2).to(x.dtype))
    return x.to(dtype)


def sampling(g: torch.Generator, bs: int) -> dict:
    pick = lambda values: torch.tensor(values, device=DEV)[  # noqa: E731
        torch.randint(0, len(values), (bs,), device=DEV, generator=g)
    ]
    return {
        "temperature": pick([0.0, 0.3, 0.7, 1.0, 1.0, 2.5]),
        "top_k": pick([0, 0, 1, 3, 20, 1000]),
        "top_p": pick([1.0, 1.0, 0.3, 0.9, 0.95, 0.999]),
    }


def cases() -> list[dict]:
    out = []
    for i, (vocab, bs, dtype) in enumerate([
        (1000, 256, torch.bfloat16),
        (1000, 256, torch.float16),
        (1000, 256, torch.float32),
        (151_936, 48, torch.bfloat16),
        (151_936, 16, torch.float32),
    ]):  # fmt: skip
        g = torch.Generator(device=DEV).manual_seed(i)
        draft = torch.randn(bs, 6, vocab, device=DEV, generator=g) * 2
        roots = torch.randint(0, vocab, (bs,), device=DEV, generator=g)
        tree = ddtree.build_tree(draft, roots, torch.zeros_like(roots), budget=31)
        params = sampling(g, bs)
        for seed, kw in ((i, params), (100 + i, {"temperature": 1.0, "top_p": 0.9})):
            out.append({
                "tree": {k: getattr(tree, k) for k in tree.__dataclass_fields__},
                "target": target_rows(g, tree, vocab, dtype),
                "sampling": kw,
                "seed": seed,
            })  # fmt: skip
    return out


def accept(c: dict) -> dict:
    acc = ddtree.accept_tree(Tree(**c["tree"]), c["target"], generator=c["seed"], **c["sampling"])
    return {k: getattr(acc, k).cpu() for k in ("accepted_nodes", "accepted_tokens",
                                              "accept_len", "bonus")}  # fmt: skip


@pytest.mark.skipif(os.environ.get("DDTREE_SAMPLING") == "exhaustive",
                    reason="compares the shortlist with the exhaustive draw")  # fmt: skip
def test_the_shortlist_draws_what_sample_row_draws(tmp_path):
    batch = cases()
    ours = [accept(c) for c in batch]
    cpu = [
        {
            "tree": {k: v.cpu() for k, v in c["tree"].items()},
            "target": c["target"].cpu(),
            "sampling": {k: v.cpu() if torch.is_tensor(v) else v for k, v in c["sampling"].items()},
            "seed": c["seed"],
        }
        for c in batch
    ]
    torch.save(cpu, tmp_path / "cases.pt")
    env = dict(os.environ, DDTREE_SAMPLING="exhaustive")
    subprocess.run(
        [sys.executable, "-c", EXHAUSTIVE, str(tmp_path / "cases.pt"), str(tmp_path / "out.pt")],
        env=env, check=True, timeout=600,
    )  # fmt: skip
    theirs = torch.load(tmp_path / "out.pt")
    deep = 0
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        for k in a:
            assert torch.equal(a[k], b[k]), (i, k, (a[k] != b[k]).nonzero()[:5])
        deep += int((a["accept_len"] > 2).sum())
    assert deep > 300, deep  # the walks visited many rows, not just the root's
