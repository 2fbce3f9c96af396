"""The functional API: ``build_tree`` and ``accept_tree`` (they allocate their outputs)."""

from __future__ import annotations

import numbers

import torch

from . import _buffers, _cpu, _cuda, _sampling, _validate, _vocab_parallel
from ._types import Acceptance, Tree, checked


def build_tree(
    draft_logits, root_tokens, prefix_lens, *, budget, topk=None, group=None, vocab_start=None
) -> Tree:
    """SPEC stages 1–3: draft logits ``[bs, L, V]`` → the verify inputs of every request.
    With ``group`` (a ``torch.distributed`` process group), `draft_logits` is this rank's
    vocabulary shard ``[bs, L, V_r]`` and every rank gets the single-process tree."""
    if group is not None:
        args = (draft_logits, root_tokens, prefix_lens, budget, topk)
        return _vocab_parallel.build_tree(args, group, vocab_start)
    x, roots, prefix, budget, topk = check_build(
        draft_logits, root_tokens, prefix_lens, budget, topk
    )
    _vocab_parallel.no_vocab_start(group, vocab_start)
    bs, depth, vocab = x.shape
    k = k_of(budget, vocab, topk)
    tree = _buffers.new_tree(bs, depth, k, budget, x.device)
    if x.device.type == "cuda":
        scratch = _cuda.new_scratch(bs * depth, x.device)
        _cuda.launch_build(tree, scratch, x, roots, prefix, budget, k)
    else:
        _cpu.build_into(tree, x, roots, prefix, budget, topk)
    return tree


def k_of(budget: int, vocab: int, topk: int | None) -> int:
    """SPEC's K = min(B, V, topk cap)."""
    return min(budget, vocab, topk if topk is not None else budget)


def check_build(draft_logits, root_tokens, prefix_lens, budget, topk, whole_vocab=True):
    x = _validate.logits("draft_logits", draft_logits, max_depth=_validate.MAX_DEPTH)
    # First: the other inputs are checked against draft_logits' device, so an unsupported
    # one must be blamed on draft_logits rather than on whichever argument comes next.
    _validate.supported_device(x.device, "draft_logits")
    bs, depth, vocab = x.shape
    roots = _validate.index_vector("root_tokens", root_tokens, bs, x.device)
    prefix = _validate.index_vector("prefix_lens", prefix_lens, bs, x.device)
    budget = _validate.positive_int("budget", budget, limit=_validate.MAX_BUDGET)
    topk = _validate.optional_positive_int("topk", topk)
    # On the GPU these are not checked here (it would sync): a root outside the vocabulary
    # and a negative prefix are per-request `status` codes; overflowing positions are not
    # detected.
    if whole_vocab:  # a shard's V is not the vocabulary: checked after the gather
        _validate.in_vocab("root_tokens", roots, vocab)
    _validate.prefix_lens(prefix, depth)
    return x, roots, prefix, budget, topk


def accept_tree(
    tree: Tree,
    target_logits,
    *,
    temperature=None,
    top_k=None,
    top_p=None,
    generator=None,
    group=None,
    vocab_start=None,
) -> Acceptance:
    """SPEC stage 4: walk ``tree`` along the posterior tokens of ``target_logits``. With
    ``group``, `target_logits` is this rank's vocabulary shard ``[bs, Q, V_r]`` and every
    rank gets the single-process acceptance (sampling: give every rank the same seed)."""
    checked("tree", tree, Tree)
    acc = _buffers.new_acceptance(tree.batch_size, tree.depth, tree.device)
    if group is None:
        _vocab_parallel.no_vocab_start(group, vocab_start)
        accept_into(tree, target_logits, acc, temperature, top_k, top_p, generator)
        return acc
    sampling = (temperature, top_k, top_p, generator)
    _vocab_parallel.accept_into(tree, target_logits, acc, group, vocab_start, sampling)
    return acc


def accept_into(tree, target_logits, acc, temperature, top_k, top_p, generator) -> None:
    """Checks every argument, then runs the greedy or the sampling walk into ``acc``.
    (The Stepper's accept checks its target in the Rust engine instead, against the draft
    V of its last step.)"""
    t = check_target(tree, target_logits)
    if t.device.type == "cuda":
        cuda_accept_into(tree, t, acc, temperature, top_k, top_p, generator)
        return
    cpu_accept_into(tree, t, acc, temperature, top_k, top_p, generator)


def cpu_accept_into(tree, t, acc, temperature, top_k, top_p, generator) -> None:
    """The CPU walk for checked target logits: greedy, or with per-request sampling."""
    params, seed = cpu_sampling(tree.batch_size, temperature, top_k, top_p, generator)
    if params is None:
        _cpu.accept_greedy_into(tree, t, acc)
    else:
        _cpu.accept_sampled_into(tree, t, acc, params, seed)


def cpu_sampling(bs: int, temperature, top_k, top_p, generator) -> tuple:
    """The CPU path's (per-request parameter tensors, seed), or (None, 0) when every request
    is greedy: the parameters are checked first, and a seed is drawn (advancing a
    torch.Generator) only when some request samples."""
    params = sampling_params(bs, temperature, top_k, top_p)
    return (None, 0) if params is None else (params, seed_of(generator))


def cuda_accept_into(tree, t, acc, temperature, top_k, top_p, generator) -> None:
    """The GPU walk for checked target logits; sampling uses a fresh state seeded from
    ``generator``."""
    bs = tree.batch_size
    if _sampling.is_greedy(temperature):
        _cuda.accept_into(tree, t, acc, None)
        return
    state = _sampling.SamplingState(bs, t.device, seed_of(generator))
    state.load(bs, temperature, top_k, top_p)
    _cuda.accept_into(tree, t, acc, state)


def check_target(tree: Tree, target_logits, whole_vocab=True) -> torch.Tensor:
    t = _validate.logits("target_logits", target_logits)
    want = (tree.batch_size, tree.width)
    if tuple(t.shape[:2]) != want:
        raise ValueError(
            f"target_logits: shape must be [{want[0]}, {want[1]}, V] for this tree, "
            f"got {list(t.shape)}"
        )
    _validate.same_device("target_logits", t, tree.device)
    if whole_vocab:
        check_target_vocab(tree, t)
    return t


def check_target_vocab(tree: Tree, t: torch.Tensor) -> None:
    """The target must score the draft's vocabulary. A Tree does not record V, so only a
    target V too small for the tree's tokens is caught, and only on the CPU (on CUDA the
    check would sync). A Stepper knows its draft's V and checks equality (ddtree-core's
    round::Planner)."""
    v = t.shape[2]
    if t.device.type == "cpu":
        top = tree.verify_ids.max().item()
        if top >= v:
            raise ValueError(
                f"target_logits: vocabulary V = {v} does not hold token {top} of the tree; "
                "the target's V must be the draft's"
            )


def _per_request(name: str, value, bs: int, dtype, default, kind) -> torch.Tensor:
    """A scalar, None or a ``[bs]`` tensor → a contiguous CPU ``[bs]`` tensor of ``dtype``."""
    if value is None:
        return torch.full((bs,), default, dtype=dtype)
    if isinstance(value, torch.Tensor):
        if value.shape != (bs,):
            raise ValueError(
                f"{name}: must be a scalar or a [{bs}] tensor, got {list(value.shape)}"
            )
        return value.detach().to(device="cpu", dtype=dtype).contiguous()
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name}: expected None, a number or a tensor, got {type(value).__name__}")
    if name == "top_k":  # as on CUDA: a negative number is refused, a huge one is off
        if value < 0:
            raise ValueError("top_k: must be ≥ 0 (0 = off)")
        value = min(int(value), 2**63 - 1)
    return torch.full((bs,), value, dtype=dtype)


def sampling_params(bs: int, temperature, top_k, top_p):
    """Per-request (temperature, top_k, top_p) tensors, or None when every request is greedy."""
    temp = _per_request("temperature", temperature, bs, torch.float64, 0.0, numbers.Real)
    k = _per_request("top_k", top_k, bs, torch.int64, 0, numbers.Integral)
    p = _per_request("top_p", top_p, bs, torch.float64, 1.0, numbers.Real)
    if not bool(torch.isfinite(temp).all()) or bool((temp < 0).any()):
        raise ValueError(_sampling.TEMPERATURE_RULE)
    if bool(((temp > 0) & torch.isinf(1 / temp)).any()):
        raise ValueError("temperature: a positive temperature must have a finite inverse")
    if bool(((p <= 0) | (p > 1) | torch.isnan(p)).any()):
        raise ValueError(_sampling.TOP_P_RULE)
    if bool((temp == 0).all()):
        return None
    return temp, k, p


def seed_of(generator) -> int:
    """A 63-bit seed: an int as given, else drawn from ``generator`` (or torch's default)."""
    if isinstance(generator, numbers.Integral) and not isinstance(generator, bool):
        return int(generator) & ((1 << 64) - 1)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator: expected None, an int seed or a torch.Generator, "
            f"got {type(generator).__name__}"
        )
    return int(torch.randint(0, 2**63 - 1, (1,), generator=generator).item())
