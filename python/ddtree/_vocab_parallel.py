"""Vocab-parallel (tensor-parallel) build and accept: each rank holds the logits of a
contiguous slice of the vocabulary, and every rank returns the tree / acceptance the
single-process call gives on the concatenated logits, bit for bit.

What crosses the ranks (``torch.distributed.all_gather`` on ``group``), per row of the
``[bs, L]`` draft rows: the shard's best K tokens (values and global ids), its maximum and a
NaN flag, then its fixed-point exp-sum against the row's maximum — about 12·K + 21 bytes a
row, where gathering the logits would move 2·V. The merge is ``ddtree-core``'s (Rust), the
function the single-process path uses for stage 1's normaliser (`crates/ddtree-core/src/
shard.rs`). The accept gathers each node's best value and token per shard (12 bytes a node).

Supported here: CPU tensors (the gloo backend); greedy and temperature sampling on the shards
(Gumbel-max keyed on the global token id, as the single-process CPU sampler draws), top-k /
top-p by gathering the whole rows. CUDA tensors (NCCL, or gloo): the build
(`ShardBuild`: stage 1 as `ddtree._partials` parts) and the accept (`ShardKeys`: a greedy
and a draw key per node and rank, 16 bytes, the walk on the GPU), both run on one H200
with the ranks sharing it (sessions 18 and 19). Every functional call first gathers each
rank's argument checks (`agree`): a rank that refuses its arguments makes every rank
raise, rather than leaving the others waiting in a collective. A CUDA `Stepper(group=)`
agrees so at the first step and accept of a shape only and keeps the plans, so that its
later calls are kernels and in-place collectives (capturable with NCCL; run on one H200
in session 20: 2 and 3 ranks over gloo, a captured round over NCCL with one rank).
"""

from __future__ import annotations

import torch

from . import _buffers, _core, _cpu, _cuda, _sampling
from ._types import Acceptance, Tree

INT64_MAX = 2**63 - 1


def _dist():
    import torch.distributed as dist

    return dist


def wire(group) -> torch.device:
    """Where the group's collectives take tensors: this process's GPU for NCCL, else the
    CPU (gloo)."""
    if _dist().get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather(t: torch.Tensor, group) -> torch.Tensor:
    """Every rank's `t` (same shape on each), stacked in group-rank order ``[tp, ...]``, on
    `t`'s device (through the group's own device)."""
    dist = _dist()
    mine = t.contiguous().to(wire(group))
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, mine, group=group)
    return torch.stack(out).to(t.device)


def layout(v_local: int, group, vocab_start) -> tuple[int, int]:
    """(this rank's first global token id, the global vocabulary V)."""
    starts, sizes = shards(v_local, group, vocab_start)
    rank = _dist().get_rank(group)
    return int(starts[rank]), int((starts + sizes).max())


def shards(v_local: int, group, vocab_start) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's (first global token id, size) ``[tp]`` each. Shards are in rank order
    unless every rank passes ``vocab_start``; either way they must tile ``0..V``."""
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
    return starts, sizes


def checksum(x: torch.Tensor) -> int:
    """An order-sensitive 64-bit digest of an integer or float tensor's values."""
    x = x.detach().cpu().contiguous().flatten()
    bits = x.view(torch.int64) if x.element_size() == 8 else x.long()
    return int((bits * torch.arange(1, bits.numel() + 1)).sum())


def agree(group, check) -> object:
    """Runs the argument checks `check()` (which returns (result, signature ints)) on every
    rank, then compares: a rank whose check raised re-raises it, and every other rank raises
    a ValueError naming that rank — so no rank is left waiting in a later collective, and no
    rank goes on with arguments (shapes, roots, sampling) that differ from another's."""
    try:
        result, signature = check()
        error = None
    except (TypeError, ValueError) as e:
        result, signature, error = None, [], e
    width = 12
    mine = torch.zeros(width + 1, dtype=torch.int64)
    mine[0] = error is not None
    mine[1 : 1 + len(signature)] = torch.tensor(signature, dtype=torch.int64)
    every = gather(mine, group)
    if error is not None:
        raise error
    failed = every[:, 0].nonzero().flatten().tolist()
    if failed:
        raise ValueError(f"group: rank {failed[0]} refused its arguments (its error names them)")
    if not bool((every[:, 1:] == every[0, 1:]).all()):
        raise ValueError(
            "group: the ranks called with different shapes, token ids, prefix lengths or "
            "sampling parameters; every rank must pass the same ones (its own logits aside)"
        )
    return result


def no_vocab_start(group, vocab_start) -> None:
    """A `vocab_start` without a `group` names the mistake (it places a shard)."""
    if group is None and vocab_start is not None:
        raise ValueError("vocab_start: only meaningful with group=")


def check_device(x: torch.Tensor, name: str) -> None:
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: a vocab-parallel call takes CPU or CUDA tensors; got {x.device}")


DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def build_tree(args: tuple, group, vocab_start, into=None) -> Tree:
    """`ddtree.build_tree`'s arguments (draft logits, roots, prefix, budget, topk) with
    this rank's shard as the draft logits: checked and agreed on every rank, then built —
    into a new tree, or into ``into(bs, L, K, V)``'s (a Stepper's static views)."""
    x, roots, prefix, budget, topk = agreed_build_args(args, group)
    return build_into(x, roots, prefix, budget, topk, group, vocab_start, into)


def agreed_build_args(args: tuple, group, also=None) -> tuple:
    """`ddtree.build_tree`'s arguments checked on this rank (and by `also(x)`, a caller's
    own check), and the same on every rank (shapes, dtype, roots, prefix lengths, budget):
    one collective and a host sync; a rank whose check fails raises on every rank."""
    from ._api import check_build

    def check():
        x, roots, prefix, budget, topk = checked = check_build(*args, whole_vocab=False)
        check_device(x, "draft_logits")
        if also is not None:
            also(x)
        sig = [*x.shape[:2], budget, topk or 0, DTYPES.index(x.dtype), checksum(roots),
               checksum(prefix), x.device.type == "cuda"]  # fmt: skip
        return checked, sig

    return agree(group, check)


def build_into(x, roots, prefix, budget: int, topk, group, vocab_start, into=None) -> Tree:
    """SPEC stages 1–3 on this rank's shard `x` ``[bs, L, V_r]`` (checked and agreed)."""
    from ._api import k_of
    from ._validate import in_vocab

    if x.device.type == "cuda":
        return build_into_cuda(x, roots, prefix, budget, topk, group, vocab_start, into)
    bs, depth, v_local = x.shape
    start, vocab = layout(v_local, group, vocab_start)
    in_vocab("root_tokens", roots, vocab)
    k = k_of(budget, vocab, topk)
    # Every rank sees the same (bs, L, K, V): a refusal here is raised on all of them.
    tree = into(bs, depth, k, vocab) if into else _buffers.new_tree(bs, depth, k, budget, x.device)
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
    eligible = torch.empty(rows, dtype=torch.int32)
    _core.merge_partials(g_values.shape[0], rows, k, g_values, g_ids, g_bad, g_sums, row_max,
                         tree.topk_logprobs, tree.topk_ids, eligible)  # fmt: skip
    _cpu.select_emit(tree, eligible, roots, prefix, vocab)
    return tree


def build_into_cuda(x, roots, prefix, budget: int, topk, group, vocab_start, into=None) -> Tree:
    """SPEC stages 1–3 on this rank's CUDA shard `x` (checked and agreed): a `ShardBuild`
    for this call. Eager only (the layout is agreed on the host)."""
    plan = ShardBuild(x.shape, budget, topk, group, vocab_start, x.device)
    bs, depth, _ = x.shape
    tree = into(bs, depth, plan.k, plan.vocab) if into else _buffers.new_tree(
        bs, depth, plan.k, budget, x.device)  # fmt: skip
    plan.run(x, roots, prefix, tree)
    return tree


class ShardBuild:
    """Stages 1–3 on CUDA shards of one shape ``[bs, L, V_r]``: stage 1 as parts of every
    rank's shard (`ddtree._partials`), each rank writing its own parts into zeroed arrays
    that an integer sum across the ranks completes; the merge, then stages 2–3 from its
    candidates. Made once (the shard layout and the part size are agreed on the host,
    collectively); `run` then only launches kernels and in-place collectives on the current
    stream: no host sync, no allocation — capturable where the collective is (NCCL)."""

    def __init__(self, shape, budget: int, topk, group, vocab_start, device):
        from . import _partials
        from ._api import k_of

        bs, depth, v_local = shape
        starts, sizes = shards(v_local, group, vocab_start)
        rank = _dist().get_rank(group)
        self.start, self.vocab = int(starts[rank]), int((starts + sizes).max())
        self.k = k_of(budget, self.vocab, topk)
        self.budget, self.group = budget, group
        rows = bs * depth
        self.chunk, counts = part_layout(sizes.tolist(), self.k, rows, device, group)
        order = sorted(range(len(counts)), key=lambda r: int(starts[r]))
        self.base = sum(counts[r] for r in order[: order.index(rank)])
        self.arrays = _partials.part_arrays(rows, sum(counts), self.k, device)
        self.scratch = _cuda.new_scratch(rows, device)

    def run(self, x, roots, prefix, tree: Tree) -> None:
        """Stages 1–3 of this rank's shard `x` into `tree` (of this plan's bs, L and K)."""
        from . import _partials

        for t in self.arrays.values():
            t.zero_()  # the other ranks' entries: zero here, their bits after the sum
        _partials.parts(x, self.chunk, self.arrays, "parts", self.base, self.start)
        sum_bits(self.arrays, ("values", "ids", "maxima", "bad"), self.group)
        _partials.parts(x, self.chunk, self.arrays, "sums", self.base, self.start)
        sum_bits(self.arrays, ("sums",), self.group)
        bs, depth, _ = x.shape
        rows, k = bs * depth, self.k
        stage1 = (tree.topk_logprobs.view(rows, k), tree.topk_ids.view(rows, k))
        _partials.merge(self.arrays, (*stage1, self.scratch["eligible"], self.scratch["bad"]))
        # Stages 2–3 read stage 1's outputs, not the logits: a view of the whole rows'
        # shape (vocabulary stride 0) stands in for them.
        whole = torch.as_strided(x, (bs, depth, self.vocab), (x.stride(0), x.stride(1), 0))
        _cuda.launch_build(tree, self.scratch, whole, roots, prefix, self.budget, k, stages=6)


def part_layout(sizes: list[int], k: int, rows: int, device, group) -> tuple[int, list[int]]:
    """(tokens a part, each rank's part count), the same on every rank: parts that fill the
    GPU for the largest shard, widened until every rank's lists fit one merge."""
    from . import _partials

    room = _core.CUDA_MAX_PART_ENTRIES  # the merge's entries
    if len(sizes) * k > room:
        raise ValueError(
            f"group: {len(sizes)} ranks' lists of K = {k} exceed the merge's {room} entries"
        )
    chunk = _partials.chunk_for(max(sizes), k, rows, device)
    # Each rank's GPU proposes its own (SM counts may differ): all take the widest.
    chunk = int(gather(torch.tensor([chunk]), group).max())
    while sum(-(-s // chunk) for s in sizes) * k > room:
        chunk *= 2
    return chunk, [-(-s // chunk) for s in sizes]


def sum_bits(arrays: dict, names, group) -> None:
    """Each entry of these arrays was written by one rank and is zero on the others: an
    integer sum of the bits across the ranks gives every rank the writer's value exactly
    (a float sum would turn -0.0 into 0.0)."""
    for name in names:
        t = arrays[name]
        _dist().all_reduce(t.view(torch.int32) if t.dtype == torch.float32 else t, group=group)


def posterior(t: torch.Tensor, group, vocab_start, temperature, seed: int) -> torch.Tensor:
    """Each node's posterior token ``[bs, Q]`` (global ids) from this rank's shard `t`
    ``[bs, Q, V_r]``: every rank's best (`_core.shard_posteriors`: the first maximum for a
    greedy request, the Gumbel-max winner for a sampled one), then the best of those — the
    larger value, then the lower id; token 0 where no rank has one. That is the
    single-process posterior bit for bit: each token's value depends only on its logit,
    its global id and the draw's coordinates."""
    start, _ = layout(t.shape[2], group, vocab_start)
    bs, q, _ = t.shape
    values = torch.empty(bs, q, dtype=torch.float64)
    ids = torch.empty(bs, q, dtype=torch.int64)
    _core.shard_posteriors(t, start, temperature.contiguous(), seed, values, ids)
    g_values, g_ids = gather(values, group), gather(ids, group)
    g_values = torch.where(g_ids >= 0, g_values, float("-inf"))
    top = g_values.max(0).values
    first = torch.where((g_values == top) & (g_ids >= 0), g_ids, INT64_MAX).min(0).values
    return torch.where(first == INT64_MAX, 0, first).contiguous()


def whole_rows(t: torch.Tensor, group, vocab_start) -> torch.Tensor:
    """The whole target rows ``[bs, Q, V]`` from every rank's shard (the top-k / top-p
    filters need them): shards padded to the largest, gathered, put back in vocabulary
    order."""
    starts, sizes = shards(t.shape[2], group, vocab_start)
    padded = torch.zeros(*t.shape[:2], int(sizes.max()), dtype=t.dtype, device=t.device)
    padded[:, :, : t.shape[2]] = t
    parts = gather(padded, group)
    out = torch.empty(*t.shape[:2], int((starts + sizes).max()), dtype=t.dtype, device=t.device)
    for r, (s, n) in enumerate(zip(starts.tolist(), sizes.tolist(), strict=True)):
        out[:, :, s : s + n] = parts[r, :, :, :n]
    return out


def agreed_target(tree: Tree, target, group, also=None) -> torch.Tensor:
    """The target shard checked on this rank (and by `also(t)`) against `tree`, with the
    same shape, dtype and tree on every rank: one collective and a host sync."""
    from ._api import check_target

    def check():
        t = check_target(tree, target, whole_vocab=False)
        check_device(t, "target_logits")
        if also is not None:
            also(t)
        sig = [*t.shape[:2], DTYPES.index(t.dtype), checksum(tree.verify_ids)]
        return t, sig + [int(t.device.type == "cuda")]

    return agree(group, check)


def accept_into(tree: Tree, target, acc: Acceptance, group, vocab_start, sampling) -> None:
    """SPEC stage 4 over shards: `target` is this rank's shard, `sampling` the (temperature,
    top_k, top_p, generator) of `ddtree.accept_tree`. The seed is group rank 0's, so the
    ranks draw alike. A request with top_k or top_p makes every rank gather the whole rows
    and sample them as one process would."""
    from ._api import check_target, cpu_accept_into, cuda_accept_into, sampling_params, seed_of

    temperature, top_k, top_p, generator = sampling

    def check():
        t = check_target(tree, target, whole_vocab=False)
        check_device(t, "target_logits")
        params = sampling_params(tree.batch_size, temperature, top_k, top_p)
        seed = 0 if params is None else seed_of(generator)  # checks generator, then draws
        sig = [*t.shape[:2], DTYPES.index(t.dtype), checksum(tree.verify_ids)]
        sig.append(int(t.device.type == "cuda"))  # the two paths run other collectives
        sig += [checksum(x) for x in params] if params is not None else [0, 0, 0]
        return (t, params, seed), sig

    t, params, seed = agree(group, check)
    if params is None:
        temperature = torch.zeros(tree.batch_size, dtype=torch.float64)
    else:
        seed = int(gather(torch.tensor([seed]), group)[0])
        temperature, top_k, top_p = params
        if bool((top_k > 0).any()) or bool((top_p < 1).any()):
            rows = whole_rows(t, group, vocab_start)
            if rows.device.type == "cuda":  # the sampling state takes device tensors
                on = rows.device
                top_k = top_k.clamp(max=2**31 - 1)  # int32 there: a copy would wrap
                cuda_accept_into(tree, rows, acc, temperature.to(on), top_k.to(on),
                                 top_p.to(on), seed)  # fmt: skip
            else:
                cpu_accept_into(tree, rows, acc, temperature, top_k, top_p, seed)
            return
    if t.device.type == "cuda":
        accept_keys_cuda(tree, t, acc, group, vocab_start, None if params is None else temperature,
                         seed)  # fmt: skip
        return
    _cpu.accept_tokens_into(tree, posterior(t, group, vocab_start, temperature, seed), acc)


def accept_keys_cuda(tree: Tree, t, acc: Acceptance, group, vocab_start, temperature, seed):
    """The accept on CUDA shards: a `ShardKeys` for this call. `temperature` [bs] (float64,
    host) or None for greedy; `seed` rank 0's."""
    state = None
    if temperature is not None:
        state = _sampling.SamplingState(tree.batch_size, t.device, seed)
        state.load(tree.batch_size, temperature.to(t.device), None, None)
    ShardKeys(t.shape, group, vocab_start, t.device).run(t, tree, acc, state)


class ShardKeys:
    """SPEC stage 4 on CUDA shards ``[bs, Q, V_r]``: each node's greedy and draw keys over
    this rank's tokens (`shard_keys`), every rank's keys gathered (16 bytes a node), and
    the walk along their maximum (`walk_keys`): the single-GPU walk's tokens, bit for bit.
    Made once (the layout agreed on the host); `run` then launches and gathers in place."""

    def __init__(self, shape, group, vocab_start, device):
        bs, q, v_local = shape
        self.start, self.vocab = layout(v_local, group, vocab_start)
        self.group, tp = group, _dist().get_world_size(group)
        self.mine = torch.empty(2, bs, q, dtype=torch.int64, device=device)
        self.every = torch.empty(2, tp, bs, q, dtype=torch.int64, device=device)

    def run(self, t, tree: Tree, acc: Acceptance, state) -> None:
        """Into `acc`; `state` a ``SamplingState`` (its temperature and generator are read)
        or None for greedy."""
        shard_keys(t, self.start, self.vocab, state, out=self.mine)
        for i in range(2):  # greedy keys, then draw keys: each [tp, bs, Q] contiguous
            gather_into(self.every[i], self.mine[i], self.group)
        walk_gathered(tree, acc, self.every[0], self.every[1], state)


def gather_into(out: torch.Tensor, mine: torch.Tensor, group) -> None:
    """Every rank's `mine` into `out` ``[tp, *mine.shape]`` in group-rank order: in place
    with NCCL (capturable), through the host with gloo."""
    if _dist().get_backend(group) == "nccl":
        _dist().all_gather_into_tensor(out, mine, group=group)
    else:
        out.copy_(gather(mine, group))


def shard_keys(t: torch.Tensor, start: int, vocab: int, state, out=None) -> torch.Tensor:
    """This shard's keys ``[2, bs, Q]`` (int64 holding uint64), into `out` or a new tensor:
    each node's greedy key, then its draw key (0 for a greedy request or with no
    contender); `state` a ``SamplingState`` (its temperature and generator are read) or None
    for greedy."""
    keys = torch.empty(2, *t.shape[:2], dtype=torch.int64, device=t.device) if out is None else out
    _core.cuda_shard_keys(*_cuda.launch_on(t.device), t, start, vocab, keys[0], keys[1], state)
    return keys


def walk_keys(tree: Tree, acc: Acceptance, every: torch.Tensor, state) -> None:
    """The walk along every rank's keys ``[tp, 2, bs, Q]`` into `acc`."""
    walk_gathered(tree, acc, every[:, 0].contiguous(), every[:, 1].contiguous(), state)


def walk_gathered(tree: Tree, acc: Acceptance, greedy, sampled, state) -> None:
    """The walk along every rank's greedy and draw keys (``[tp, bs, Q]`` each, contiguous)."""
    temps = None if state is None else state.temperature
    _core.cuda_walk_keys(*_cuda.launch_on(tree.device), greedy.shape[0], greedy, sampled, tree,
                         acc, temps)  # fmt: skip
