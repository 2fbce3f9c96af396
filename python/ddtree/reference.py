"""The reference DDTree round: SPEC.md stages 1–5 in plain Python/numpy, one request at a time.

This module is the oracle every other implementation is tested against. It favours clarity
over speed: each function is one SPEC stage (same names as the Rust crate `ddtree-core` and
the CUDA kernels), written the way SPEC.md words it.

Choices SPEC.md leaves open, made the same way everywhere in the project:
* ranks past the finite logits hold the ``-inf`` tokens in id order, with log-prob ``-inf``;
* a rejected request (NaN or ``+inf`` in its draft logits) has log-probs ``-inf`` and ids ``-1``
  at every rank, and status ``STATUS_NON_FINITE``;
* the greedy posterior treats NaN as ``-inf`` (first maximum wins).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

STATUS_OK = 0
STATUS_NON_FINITE = 1


# ---------------------------------------------------------------------------------------------
# Stage 1 — candidates per depth
# ---------------------------------------------------------------------------------------------


@dataclass
class Candidates:
    """Stage-1 output of one request: ``[L, K]`` arrays plus per-depth extras."""

    values: np.ndarray  # TV, float32 [L, K]
    ids: np.ndarray  # TI, int64 [L, K]
    logprobs: np.ndarray  # LP, float32 [L, K]
    z: np.ndarray  # float32 [L]
    eligible: np.ndarray  # int64 [L]: ranks 0..eligible[d] hold finite values
    rejected: bool


def rank_order(x: np.ndarray) -> np.ndarray:
    """Token ids sorted by value descending, equal values by id ascending."""
    ids = np.arange(x.shape[0])
    # lexsort sorts by the last key first; -x ascending is x descending (and -0.0 == 0.0).
    return np.lexsort((ids, -x))


def logsumexp(x: np.ndarray) -> np.float32:
    """SPEC's normaliser: float64 ``m + log(sum(exp(x - m)))`` rounded once to fp32."""
    finite = x[np.isfinite(x)]
    if finite.size == 0:
        return np.float32(-np.inf)
    m = np.float64(finite.max())
    return np.float32(m + np.log(np.sum(np.exp(x.astype(np.float64) - m))))


def candidates(draft_logits: np.ndarray, k: int) -> Candidates:
    """Stage 1 for one request: ``draft_logits`` is ``[L, V]`` (any float dtype)."""
    x_all = np.asarray(draft_logits, dtype=np.float32)
    depth = x_all.shape[0]
    rejected = bool(np.isnan(x_all).any() or np.isposinf(x_all).any())
    values = np.full((depth, k), -np.inf, dtype=np.float32)
    ids = np.full((depth, k), -1, dtype=np.int64)
    logprobs = np.full((depth, k), -np.inf, dtype=np.float32)
    z = np.full(depth, -np.inf, dtype=np.float32)
    eligible = np.zeros(depth, dtype=np.int64)
    if rejected:
        return Candidates(values, ids, logprobs, z, eligible, True)
    for d in range(depth):
        x = x_all[d]
        top = rank_order(x)[:k]
        values[d, : top.size] = x[top]
        ids[d, : top.size] = top
        z[d] = logsumexp(x)
        finite = np.isfinite(values[d])
        eligible[d] = int(finite.sum())
        logprobs[d, finite] = values[d, finite] - z[d]  # one fp32 subtraction
    return Candidates(values, ids, logprobs, z, eligible, False)


# ---------------------------------------------------------------------------------------------
# Stage 2 — selection
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    path: tuple[int, ...]  # the rank path (r1, ..., rd)
    score: float  # float64, accumulated left to right


def select(logprobs: np.ndarray, eligible: np.ndarray, budget: int) -> list[Node]:
    """The first ``budget`` rank paths in canonical order, by the best-first heap.

    Heap key ``(-score, path)``: Python compares tuples lexicographically with a proper prefix
    first, which is exactly SPEC's tie-break. Pop the best; push its next sibling (parent's
    score + next rank's LP) and its first child (own score + LP of rank 0 one level down).
    """
    depth_limit = logprobs.shape[0]

    def lp(d: int, r: int) -> float:  # d is 1-based
        return float(logprobs[d - 1, r])

    def ok(d: int, r: int) -> bool:
        return d <= depth_limit and r < eligible[d - 1]

    chosen: list[Node] = []
    score_of: dict[tuple[int, ...], float] = {(): 0.0}
    heap: list[tuple[float, tuple[int, ...]]] = []
    if ok(1, 0):
        heap.append((-lp(1, 0), (0,)))
    while heap and len(chosen) < budget:
        neg, path = heapq.heappop(heap)
        score = -neg
        chosen.append(Node(path, score))
        score_of[path] = score
        d, r = len(path), path[-1]
        if ok(d, r + 1):
            parent = path[:-1]
            sib = lp(d, r + 1) if not parent else score_of[parent] + lp(d, r + 1)
            heapq.heappush(heap, (-sib, parent + (r + 1,)))
        if ok(d + 1, 0):
            heapq.heappush(heap, (-(score + lp(d + 1, 0)), path + (0,)))
    return chosen


def path_score(logprobs: np.ndarray, path: tuple[int, ...]) -> float:
    """SPEC's score of a rank path, straight from the definition (used by brute force)."""
    s = float(logprobs[0, path[0]])
    for d, r in enumerate(path[1:], start=1):
        s = s + float(logprobs[d, r])
    return s


# ---------------------------------------------------------------------------------------------
# Stage 3 — verify inputs
# ---------------------------------------------------------------------------------------------


def emit(nodes: list[Node], ids: np.ndarray, root_token: int, prefix_len: int, budget: int):
    """Every verify input of one request (dict of numpy arrays of width Q = budget + 1)."""
    q = budget + 1
    words = (q + 31) // 32
    index = {(): 0}
    for i, node in enumerate(nodes, start=1):
        index[node.path] = i
    out = {
        "verify_ids": np.zeros(q, np.int64),
        "positions": np.full(q, prefix_len, np.int64),
        "depths": np.zeros(q, np.int64),
        "parents": np.full(q, -1, np.int64),
        "first_child": np.full(q, -1, np.int64),
        "next_sibling": np.full(q, -1, np.int64),
        "scores": np.full(q, -np.inf, np.float64),
    }
    out["verify_ids"][0] = root_token
    out["scores"][0] = 0.0
    ancestors: list[set[int]] = [{i} for i in range(q)]  # pads and root: self only
    last_child: dict[int, int] = {}
    for i, node in enumerate(nodes, start=1):
        d = len(node.path)
        parent = index[node.path[:-1]]
        out["verify_ids"][i] = ids[d - 1, node.path[-1]]
        out["depths"][i] = d
        out["positions"][i] = prefix_len + d
        out["parents"][i] = parent
        out["scores"][i] = node.score
        ancestors[i] = ancestors[parent] | {i}
        if parent not in last_child:  # nodes come in index order: the first one seen is first
            out["first_child"][parent] = i
        else:
            out["next_sibling"][last_child[parent]] = i
        last_child[parent] = i
    out["ancestor_bits"] = pack_bits(ancestors, words)
    return out


def pack_bits(rows: list[set[int]], words: int) -> np.ndarray:
    """Bit j % 32 of word j // 32 of row i is set iff j is in ``rows[i]`` (int32 words)."""
    packed = np.zeros((len(rows), words), dtype=np.uint32)
    for i, row in enumerate(rows):
        for j in row:
            packed[i, j // 32] |= np.uint32(1 << (j % 32))
    return packed.view(np.int32)


def visibility(ancestor_bits: np.ndarray) -> np.ndarray:
    """bool ``[Q, Q]``: row i sees column j iff bit j of row i is set."""
    q = ancestor_bits.shape[0]
    bits = ancestor_bits.view(np.uint32)
    return np.array(
        [[(int(bits[i, j // 32]) >> (j % 32)) & 1 == 1 for j in range(q)] for i in range(q)],
        dtype=bool,
    )


def sglang_custom_mask(ancestor_bits: np.ndarray, prefix_lens) -> np.ndarray:
    """SGLang's flat FULL mask: per request a row-major ``[Q, P_b + Q]`` block, concatenated."""
    blocks = []
    for bits, p in zip(ancestor_bits, prefix_lens, strict=True):
        vis = visibility(bits)
        prefix = np.ones((vis.shape[0], int(p)), dtype=bool)
        blocks.append(np.concatenate([prefix, vis], axis=1).ravel())
    return np.concatenate(blocks)


# ---------------------------------------------------------------------------------------------
# Stage 4 — accept
# ---------------------------------------------------------------------------------------------


def greedy_posterior(target_row: np.ndarray) -> int:
    """argmax, lowest id on ties; NaN counts as -inf."""
    x = np.asarray(target_row, dtype=np.float32)
    return int(np.argmax(np.where(np.isnan(x), -np.inf, x)))


def walk(tree: dict, posterior_tokens) -> tuple[list[int], int]:
    """Follow the child carrying the current node's posterior token; returns (path, bonus).

    ``posterior_tokens[i]`` is the posterior token at node i (greedy or sampled beforehand).
    """
    node, path = 0, [0]
    while True:
        token = int(posterior_tokens[node])
        child = int(tree["first_child"][node])
        while child >= 0 and int(tree["verify_ids"][child]) != token:
            child = int(tree["next_sibling"][child])
        if child < 0:
            return path, token
        node = child
        path.append(node)


def accept(tree: dict, posterior_tokens, depth: int, request: int = 0):
    """Acceptance outputs of one request (width L + 1, -1 padded)."""
    q = len(tree["verify_ids"])
    path, bonus = walk(tree, posterior_tokens)
    width = depth + 1
    nodes = np.full(width, -1, np.int64)
    nodes[: len(path)] = path
    tokens = np.full(width, -1, np.int64)
    tokens[: len(path)] = tree["verify_ids"][path]
    index = np.where(nodes >= 0, request * q + nodes, -1)
    return {
        "accepted_nodes": nodes,
        "accepted_tokens": tokens,
        "accept_len": len(path),
        "bonus": bonus,
        "accept_index": index,
    }


# ---------------------------------------------------------------------------------------------
# Stage 5 — commit
# ---------------------------------------------------------------------------------------------


def commit(accepted_nodes: np.ndarray, window_slots: np.ndarray, prefix_len: int):
    """KV slots kept (in path order), slots released, and the new prefix length."""
    path = [int(n) for n in accepted_nodes if n >= 0]
    kept = [int(window_slots[n]) for n in path]
    released = [int(window_slots[i]) for i in range(len(window_slots)) if i not in path]
    return {"kept_slots": kept, "released_slots": released, "prefix_len": prefix_len + len(path)}


# ---------------------------------------------------------------------------------------------
# A batch, the way the Tree / Acceptance objects hold it
# ---------------------------------------------------------------------------------------------


def build_tree(draft_logits, root_tokens, prefix_lens, *, budget: int, topk: int | None = None):
    """Stages 1–3 for a batch; returns a dict of numpy arrays named like ``ddtree.Tree``."""
    x = _as_numpy(draft_logits)
    bs, depth, vocab = x.shape
    k = min(budget, vocab, topk or budget)
    per_request = []
    for b in range(bs):
        c = candidates(x[b], k)
        nodes = [] if c.rejected else select(c.logprobs, c.eligible, budget)
        t = emit(nodes, c.ids, int(root_tokens[b]), int(prefix_lens[b]), budget)
        t.update(
            num_nodes=len(nodes),
            topk_logprobs=c.logprobs,
            topk_ids=c.ids,
            status=STATUS_NON_FINITE if c.rejected else STATUS_OK,
        )
        per_request.append(t)
    return {key: np.stack([np.asarray(t[key]) for t in per_request]) for key in per_request[0]}


def accept_greedy(tree: dict, target_logits):
    """Stage 4 (greedy) for a batch built by :func:`build_tree`."""
    t = _as_numpy(target_logits)
    bs = t.shape[0]
    depth = tree["topk_ids"].shape[1]
    rows = []
    for b in range(bs):
        one = {key: tree[key][b] for key in ("verify_ids", "first_child", "next_sibling")}
        posterior = _LazyGreedy(t[b])
        rows.append(accept(one, posterior, depth, request=b))
    return {key: np.stack([np.asarray(r[key]) for r in rows]) for key in rows[0]}


class _LazyGreedy:
    """Greedy posterior tokens, computed only for the nodes the walk visits."""

    def __init__(self, target: np.ndarray):
        self.target = target

    def __getitem__(self, node: int) -> int:
        return greedy_posterior(self.target[node])


def _as_numpy(x) -> np.ndarray:
    """fp32 numpy copy of a torch tensor or array (bf16 / fp16 upcast exactly)."""
    if hasattr(x, "detach"):
        return x.detach().to("cpu").float().numpy()
    return np.asarray(x, dtype=np.float32)
