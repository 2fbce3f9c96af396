"""A DDTree tree in the proposal form SGLang 0.5.23's UNO worker hands to EAGLE's verify.

SGLang 0.5.23 builds its GPU draft tree with ``build_uno_tree_proposal`` (in
``sglang/kernels/ops/speculative/uno_tree.py``) and passes the result — root tokens, the
Q − 1 draft tokens, and two index tensors in EAGLE's "candidate-lineage" encoding — to
``build_eagle_verify_input``. :func:`uno_proposal` takes the same arguments and returns the
same fields for the exact DDTree tree (SPEC stage 2, with ``candidate_top_k`` as the top-k
cap), so swapping the one call swaps the tree builder.

The encoding. Node i ≥ 1 of a request is the edge ``top_scores_index[i − 1] = parent · K +
rank``: its parent's node index times K plus the rank of its token among its depth's top K.
``parent_list[p]`` (``K·(L − 1) + 1`` wide) holds node p's own edge, so EAGLE's
``build_tree_kernel_efficient`` finds p as the node whose edge equals ``parent_list[edge //
K]``. It can therefore represent a tree only if every rank is below K (true of a DDTree tree
built with top-k cap K) and every parent index fits in ``parent_list``: Q − 1 ≤ K·(L − 1) + 1
when L > 1. Both limits are checked on the host before any work, as UNO checks them.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from . import _validate
from ._api import build_tree
from ._types import Tree

# EAGLE's build_tree_kernel_efficient takes at most 1024 verify nodes, as does ddtree's GPU
# build (budget ≤ 1023, crates/ddtree-cuda/src/launch.rs).
MAX_NODES = 1024


@dataclass(frozen=True)
class UnoProposal:
    """The fields of SGLang's ``UnoTreeProposal`` (same names, dtypes, shapes), plus ``tree``.

    ``draft_tokens``, ``top_scores_index``: int64 ``[bs, Q − 1]``; ``parent_list``: int64
    ``[bs, K·max(L − 1, 0) + 1]``; ``tree``: the ddtree :class:`~ddtree.Tree` they encode
    (``None`` when Q = 1), for ddtree's own accept and verify inputs.
    """

    root_tokens: torch.Tensor
    draft_tokens: torch.Tensor
    parent_list: torch.Tensor
    top_scores_index: torch.Tensor
    candidate_top_k: int
    max_depth: int
    tree: Tree | None = None

    @property
    def num_verify_tokens(self) -> int:
        return int(self.draft_tokens.shape[1]) + 1


def capacity(depth: int, k: int, stop_at: int) -> int:
    """Nodes a K-ary tree of depth L can hold, root included (counting stops at stop_at)."""
    total, width = 1, 1
    for _ in range(depth):
        width *= k
        total += width
        if total >= stop_at:
            break
    return total


def parent_width(depth: int, k: int) -> int:
    """EAGLE's ``parent_list`` width, ``K·(L − 1) + 1``."""
    return k * max(depth - 1, 0) + 1


def check_proposal_args(root_tokens, draft_logits, max_nodes, candidate_top_k, temperature):
    x = _validate.logits("draft_logits", draft_logits, max_depth=_validate.MAX_DEPTH)
    _validate.supported_device(x.device, "draft_logits")
    bs, depth, vocab = x.shape
    roots = _validate.tensor("root_tokens", root_tokens)
    if roots.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"root_tokens: dtype must be int32 or int64, got {roots.dtype}")
    if roots.shape != (bs,):
        raise ValueError(f"root_tokens: shape must be [{bs}], got {list(roots.shape)}")
    _validate.same_device("root_tokens", roots, x.device)
    q = _validate.positive_int("max_nodes", max_nodes, limit=MAX_NODES)
    k = _validate.positive_int("candidate_top_k", candidate_top_k)
    if k > vocab:
        raise ValueError(f"candidate_top_k: {k} exceeds the vocabulary size {vocab}")
    if capacity(depth, k, q) < q:
        raise ValueError(
            f"max_nodes: a tree of depth {depth} with {k} candidates per depth holds only "
            f"{capacity(depth, k, q)} nodes, fewer than max_nodes = {q}"
        )
    if depth > 1 and q - 1 > parent_width(depth, k):
        raise ValueError(
            f"max_nodes: EAGLE's parent_list (K·(L−1)+1 = {parent_width(depth, k)} wide) "
            f"cannot encode {q - 1} draft nodes; raise candidate_top_k"
        )
    check_temperature(temperature, bs, x.device)
    return x, roots.to(torch.int64), q, k


def check_temperature(temperature, bs: int, device: torch.device) -> None:
    """UNO's accepted forms: a number, or a float tensor that is scalar, [bs] or [bs, 1]."""
    if isinstance(temperature, numbers.Real) and not isinstance(temperature, bool):
        return
    t = _validate.tensor("temperature", temperature)
    if not t.is_floating_point():
        raise TypeError(f"temperature: dtype must be floating, got {t.dtype}")
    if t.dim() != 0 and tuple(t.shape) not in ((bs,), (bs, 1)):
        raise ValueError(f"temperature: shape must be [], [{bs}] or [{bs}, 1], got {list(t.shape)}")
    _validate.same_device("temperature", t, device)


def uno_proposal(
    root_tokens,
    draft_logits,
    *,
    max_nodes: int,
    candidate_top_k: int,
    temperature=0.0,
    workspace: dict | None = None,
) -> UnoProposal:
    """The DDTree tree of ``draft_logits`` in ``build_uno_tree_proposal``'s output form.

    Same arguments as SGLang 0.5.23's ``build_uno_tree_proposal``: ``root_tokens`` int
    ``[bs]``, ``draft_logits`` ``[bs, L, V]`` (row d − 1 is depth d), ``max_nodes`` = Q (root
    included), ``candidate_top_k`` = K. The tree is SPEC's: budget Q − 1, top-k cap K, every
    tie broken by token id; the CPU and GPU paths give the same tree (SPEC's one-ulp allowance
    on the normaliser aside). ``temperature`` is checked as UNO checks it but not applied:
    the tree is built from the logits as given (divide them first to build from tempered
    distributions); a proposal's ranking changes only how many tokens are accepted, never
    which. ``workspace`` holds the zero prefix lengths between calls.

    Where a row has fewer than Q − 1 rank paths (tokens masked with −inf), or gets a
    root-only tree (NaN or +inf logits: ``tree.status`` nonzero), the unused slots are
    encoded as children of the root carrying token 0, which EAGLE's verify may accept like
    any draft token (still lossless); ddtree's own tree leaves them unlinked. The tree is
    built with zero prefix lengths: :func:`ddtree.sglang.eagle_verify_fields` takes the real
    ones. No value is read on the host.
    """
    x, roots, q, k = check_proposal_args(
        root_tokens, draft_logits, max_nodes, candidate_top_k, temperature
    )
    bs, depth, _ = x.shape
    tree = None
    if q > 1:  # first: the build's own checks (the GPU's depth limit) run before any launch
        tree = build_tree(x, roots, zero_prefix(workspace, bs, x.device), budget=q - 1, topk=k)
    parents_out = torch.full((bs, parent_width(depth, k)), -1, dtype=torch.int64, device=x.device)
    if tree is None:
        empty = torch.empty((bs, 0), dtype=torch.int64, device=x.device)
        return UnoProposal(root_tokens, empty, parents_out, empty, k, depth)
    edges = node_edges(tree, k)
    used = min(q - 2, parents_out.shape[1] - 1)  # the last node is never a parent
    parents_out[:, 1 : used + 1] = edges[:, :used]
    return UnoProposal(root_tokens, tree.verify_ids[:, 1:], parents_out, edges, k, depth, tree)


def zero_prefix(workspace: dict | None, bs: int, device: torch.device) -> torch.Tensor:
    """Prefix lengths for the build (the proposal carries no positions): zeros, kept."""
    key = "ddtree_zero_prefix"
    cached = None if workspace is None else workspace.get(key)
    if cached is None or cached.shape != (bs,) or cached.device != device:
        cached = torch.zeros(bs, dtype=torch.int64, device=device)
        if workspace is not None:
            workspace[key] = cached
    return cached


def node_edges(tree: Tree, k: int) -> torch.Tensor:
    """int64 ``[bs, Q − 1]``: ``parent · K + rank`` of nodes 1..Q−1 (unused slots: 0)."""
    tokens = tree.verify_ids[:, 1:]
    depth = tree.depths[:, 1:]
    parent = tree.parents[:, 1:]
    real = parent >= 0
    rows = (depth - 1).clamp(min=0).unsqueeze(-1).expand(-1, -1, tree.topk_ids.shape[2])
    candidates = tree.topk_ids.gather(1, rows)  # [bs, Q-1, K]: the node's depth's top K
    rank = (candidates == tokens.unsqueeze(-1)).to(torch.int8).argmax(-1)
    return torch.where(real, parent * k + rank, 0)
