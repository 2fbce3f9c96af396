"""SGLang adapter: a ddtree ``Tree`` / ``Acceptance`` as the tensors of SGLang's EAGLE-style
tree verify path, with SGLang's names, dtypes and shapes (import it as ``ddtree.sglang``).

* :func:`verify_input` — the fields of ``EagleVerifyInput`` (and of the DDTree PR's
  ``DDTreeVerifyInput``): ``draft_token``, ``positions``, ``custom_mask``,
  ``retrive_index``, ``retrive_next_token``, ``retrive_next_sibling``, ``retrive_cum_len``,
  ``draft_token_num``, ``spec_steps``, ``topk``, ``seq_lens_sum``.
* :func:`verify_output` — what ``verify_tree_greedy`` /
  ``tree_speculative_sampling_target_only`` leave in ``predict``, ``accept_index`` and
  ``accept_length``, plus ``verified_id`` (the committed tokens, bonus included) per request.
* :func:`kv_keep_free` — the kept KV slots (``out_cache_loc[accept_index]``) and SGLang's
  ``evict_mask``, from :func:`ddtree.kept_slots`.

Every function is torch ops only, on the CPU and on CUDA alike; none reads a value on the
host (no ``.item()``, ``.tolist()``, ``.cpu()``, no data-dependent shape), so on CUDA nothing
syncs — except :func:`verify_input` without ``seq_lens_sum`` or ``custom_mask_out``, which
has to read ``seq_lens`` on the host to size the mask (one sync, as ``Tree.sglang_custom_mask``
without ``out``).

Conventions, and the SGLang source each was read from (sgl-project/sglang, files as stored
at the commits named; SGLang was not installed or run here):

* ``sgl-kernel/csrc/speculative/eagle_utils.cu`` (commit 0e6ed14d1473, ``VerifyTreeGreedy``
  and its host wrapper ``verify_tree_greedy``): ``candidates`` (= ``draft_token`` viewed
  ``[bs, draft_token_num]``), ``retrive_index``, ``retrive_next_token``,
  ``retrive_next_sibling`` and ``target_predict`` must be int64 ``[bs, draft_token_num]``;
  ``predicts`` int32 1-D, ``accept_index`` int32 ``[bs, num_spec_step]``,
  ``accept_token_num`` int32 ``[bs]``. The walk starts at node 0 with
  ``accept_index[b, 0] = retrive_index[b, 0]``, follows ``retrive_next_token`` (first child)
  then ``retrive_next_sibling`` until a child's token equals ``target_predict`` at the last
  accepted slot; per accepted child it writes ``predicts[last_slot] = target token``,
  ``accept_index[b, n] = retrive_index[b, child]``; at the end
  ``accept_token_num[b] = n`` (accepted *draft* tokens: neither the root nor the bonus is
  counted) and ``predicts[last_slot] = target_predict[last_slot]`` (the bonus). Slots off
  the path are not written. ``build_tree_efficient`` (same file) sets
  ``retrive_index[b, i] = b * draft_token_num + i``, links a node's children lowest index
  first (``retrive_next_token`` = first child, siblings in increasing index), −1 = none,
  and writes only the tree columns of the FULL mask into a buffer pre-filled True.
* ``python/sglang/srt/speculative/eagle_info.py`` (commit 0007d13b0099,
  ``EagleVerifyInput.verify``): ``predict = torch.empty([bs * draft_token_num + 1], int32)``,
  ``accept_index = torch.full((bs, spec_steps + 1), -1, int32)``,
  ``accept_length = torch.empty((bs,), int32)``; then
  ``verified_id = predict[accept_index[accept_index != -1]]`` (all committed tokens, bonus
  included, flat), ``seq_lens += accept_length + 1``, ``evict_mask`` True for every draft
  slot not in ``accept_index`` and (page size 1)
  ``out_cache_loc = out_cache_loc[accept_index]``. ``create_idle_input`` gives the dtypes
  of the inputs: ``draft_token`` long, ``custom_mask`` bool, ``positions`` int64,
  ``retrive_*`` long, ``retrive_cum_len=None``.
* The DDTree PR (sgl-project/sglang#29907; ``python/sglang/srt/speculative/ddtree_worker.py``
  and ``ddtree_info.py`` at commit 93e9850e4300, ``ddtree_utils.py`` at 6c52d319a429):
  ``draft_token_num = budget + 1``, node 0 the root (the last round's bonus),
  ``positions = seq_lens + depth``, ``retrive_index`` the identity ``b*D + k``,
  first-child / next-sibling links in increasing index order (``build_eagle_tree_format``),
  the flat FULL bool mask per request ``[D, seq_len + D]`` (prefix True, tree columns the
  ancestor-or-self visibility; ``_build_flat_tree_mask``), ``spec_steps=tree_budget``,
  ``topk=2`` for a branching tree; ``verify`` runs ``eagle_sample`` and commits
  ``predict[slot]`` for every slot of ``accept_index`` row b, ``accept_length`` = drafts
  only.

Where ddtree differs (documented in ``docs/sglang.md``): ddtree's padding nodes (index >
``num_nodes``) keep their prefix columns and their own bit (the PR masks those rows
entirely); they are unreachable from the root either way. ``spec_steps`` is the tree's
depth L (the longest path), not the budget, so ``accept_index`` is ``[bs, L+1]`` —
exactly ``Acceptance.accept_index``'s shape. Node order is ddtree's (score order: every
parent before its children), not the PR's breadth-first relabelling.
"""

from __future__ import annotations

import torch

from ._commit import kept_slots
from ._sglang_uno import UnoProposal, uno_proposal
from ._types import Acceptance, Tree, checked

__all__ = [
    "UnoProposal",
    "eagle_verify_fields",
    "eagle_verify_result",
    "kv_keep_free",
    "uno_proposal",
    "verify_input",
    "verify_output",
]


def retrive_index(bs: int, q: int, device) -> torch.Tensor:
    """int64 ``[bs, q]``: ``b * q + i``, SGLang's identity ``retrive_index``."""
    rows = torch.arange(bs, dtype=torch.int64, device=device).unsqueeze(1) * q
    return rows + torch.arange(q, dtype=torch.int64, device=device)


def verify_input(
    tree: Tree,
    seq_lens,
    *,
    seq_lens_sum: int | None = None,
    custom_mask_out: torch.Tensor | None = None,
    mask_prefix_columns: bool = True,
) -> dict:
    """The ``EagleVerifyInput`` fields of ``tree`` (SGLang names, dtypes and shapes).

    ``seq_lens`` are the prefix lengths P_b (SGLang's ``batch.seq_lens``; int64 ``[bs]`` on
    the tree's device, or a list of ints) — the KV-cache tokens before the root; the tree
    must have been built with the same ``prefix_lens`` (its ``positions`` are P_b + depth).
    ``seq_lens_sum`` (SGLang's ``batch.seq_lens_sum``, a host int) sizes the mask without
    reading ``seq_lens``; ``custom_mask_out`` is a preallocated contiguous 1-D bool buffer
    of at least ``seq_lens_sum * Q + bs * Q * Q`` elements to write it into (with
    ``mask_prefix_columns=False`` only the tree columns are written, for a buffer already
    filled True as SGLang's ``build_tree_kernel_efficient`` does). With either, nothing is
    read on the host; with neither, the mask's size is read from ``seq_lens`` (on CUDA, one
    sync). ``seq_lens=None`` builds no mask (``custom_mask`` None): the verify attention
    ``ddtree.tree_attention`` reads ``tree.ancestor_bits`` instead (docs/sglang.md).

    Returns a dict:

    ============================ ============================== ==========================
    key                          dtype, shape                   content
    ============================ ============================== ==========================
    ``draft_token``              int64 ``[bs*Q]``               ``tree.verify_ids``, root
                                                                first per request
    ``positions``                int64 ``[bs*Q]``               P_b + depth
    ``custom_mask``              bool ``[Σ Q*(P_b+Q)]``         flat FULL mask (None
                                                                without ``seq_lens``)
    ``retrive_index``            int64 ``[bs, Q]``              ``b*Q + i``
    ``retrive_next_token``       int64 ``[bs, Q]``              first child, −1 none
    ``retrive_next_sibling``     int64 ``[bs, Q]``              next sibling, −1 none
    ``retrive_cum_len``          None                           (unused by tree verify)
    ``draft_token_num``          int                            Q = budget + 1
    ``spec_steps``               int                            L (accept_index: L+1 wide)
    ``topk``                     int                            K, the most children a
                                                                node can have
    ``seq_lens_sum``             int or None                    as given
    ============================ ============================== ==========================

    ``capture_hidden_mode`` (``CaptureHiddenMode.FULL``) and ``seq_lens_cpu`` are SGLang
    objects the caller already holds; they are not produced here.
    """
    tree = checked("tree", tree, Tree)
    bs, q = tree.batch_size, tree.width
    dev = tree.device
    out = custom_mask_out
    if out is None and seq_lens_sum is not None:
        if isinstance(seq_lens_sum, bool) or not isinstance(seq_lens_sum, int):
            raise TypeError(f"seq_lens_sum: expected an int, got {type(seq_lens_sum).__name__}")
        if seq_lens_sum < 0:
            raise ValueError(f"seq_lens_sum: must be ≥ 0, got {seq_lens_sum}")
        if not mask_prefix_columns:
            raise ValueError(
                "mask_prefix_columns: False needs custom_mask_out (a buffer already True)"
            )
        out = torch.empty(seq_lens_sum * q + bs * q * q, dtype=torch.bool, device=dev)
    mask = None
    if seq_lens is not None:
        mask = tree.sglang_custom_mask(seq_lens, out, prefix_columns=mask_prefix_columns)
    return {
        "draft_token": tree.verify_ids.reshape(-1),
        "positions": tree.positions.reshape(-1),
        "custom_mask": mask,
        "retrive_index": retrive_index(bs, q, dev),
        "retrive_next_token": tree.first_child.contiguous(),
        "retrive_next_sibling": tree.next_sibling.contiguous(),
        "retrive_cum_len": None,
        "draft_token_num": q,
        "spec_steps": tree.depth,
        "topk": tree.topk_ids.shape[2],
        "seq_lens_sum": seq_lens_sum,
    }


def verify_output(acc: Acceptance, tree: Tree) -> dict:
    """What SGLang's tree-verify kernels return for this acceptance, and its committed tokens.

    ``tree`` is the tree ``acc`` was accepted on (for Q). Returns a dict:

    ================== ======================= ============================================
    key                dtype, shape            content
    ================== ======================= ============================================
    ``accept_index``   int32 ``[bs, L+1]``     ``b*Q + node`` along the path, root first,
                                               −1 padded (``accept_index`` of the kernels)
    ``accept_length``  int32 ``[bs]``          accepted draft tokens: ``accept_len − 1``
                                               (neither root nor bonus counted; SGLang adds
                                               1 to get the committed count)
    ``predict``        int32 ``[bs*Q + 1]``    at the slot of path node j, the token after
                                               it: node j+1's token, the bonus at the last
                                               node; −1 everywhere else (SGLang leaves those
                                               entries unwritten)
    ``verified_id``    int32 ``[bs, L+1]``     ``predict[accept_index]`` row by row: the
                                               committed tokens (accepted drafts, then the
                                               bonus), −1 padded
    ``bonus``          int64 ``[bs]``          the next round's root (the DDTree PR's
                                               ``new_verified_id``)
    ================== ======================= ============================================

    SGLang's flat forms are ``accept_index[accept_index != -1]`` and
    ``verified_id[verified_id != -1]`` (data-dependent sizes: on CUDA those indexings sync,
    in SGLang as here). Nothing in this function reads a value on the host.
    """
    acc = checked("acc", acc, Acceptance)
    tree = checked("tree", tree, Tree)
    bs, path_len, q = acc.batch_size, acc.path_len, tree.width
    if tree.batch_size != bs or tree.device != acc.device:
        raise ValueError(
            f"tree: batch {tree.batch_size} on {tree.device}, the acceptance has {bs} on "
            f"{acc.device}"
        )
    dev = acc.device
    cols = torch.arange(path_len, device=dev)
    n = acc.accept_len.unsqueeze(1)  # committed tokens per request, 1..L+1
    on_path = cols < n
    # Token after path node j: the next node's token, the bonus after the last node.
    nxt = torch.cat([acc.accepted_tokens[:, 1:], acc.accepted_tokens[:, :1]], dim=1)
    nxt = torch.where(cols == n - 1, acc.bonus.unsqueeze(1), nxt)
    verified = torch.where(on_path, nxt, -1)
    index = torch.where(on_path, acc.accept_index, -1)
    predict = torch.full((bs * q + 1,), -1, dtype=torch.int64, device=dev)
    dump = bs * q  # the spare last entry takes the padding's writes, then is reset
    predict.scatter_(0, torch.where(on_path, index, dump).reshape(-1), verified.reshape(-1))
    predict[dump:].fill_(-1)  # a slice: an index assignment would sync on CUDA
    return {
        "accept_index": index.to(torch.int32),
        "accept_length": (acc.accept_len - 1).to(torch.int32),
        "predict": predict.to(torch.int32),
        "verified_id": verified.to(torch.int32),
        "bonus": acc.bonus,
    }


def kv_keep_free(acc: Acceptance, out_cache_loc: torch.Tensor):
    """The KV slots to keep and to free after the walk, from :func:`ddtree.kept_slots`.

    ``out_cache_loc`` is SGLang's ``batch.out_cache_loc`` of the verify forward: int64
    ``[bs*Q]`` (or ``[bs, Q]``), slot of node i of request b at ``b*Q + i``. Returns
    ``(keep, free)``: ``keep`` int64 ``[bs, L+1]``, the slots of the accepted path in path
    order (−1 padded; row b's valid prefix is SGLang's ``out_cache_loc[accept_index]`` for
    that request), and ``free`` bool ``[bs*Q]``, SGLang's ``evict_mask`` (True = free the
    slot). ``allocator.free(out_cache_loc[free])`` and ``keep[keep != -1]`` are SGLang's
    page-size-1 calls (boolean indexing: a sync on CUDA, in SGLang too). A request whose
    path or slots are out of range keeps nothing, frees nothing and gets a code in
    ``acc.status`` (see ``ddtree.kept_slots``).
    """
    acc = checked("acc", acc, Acceptance)
    if not isinstance(out_cache_loc, torch.Tensor):
        raise TypeError(
            f"out_cache_loc: expected a torch.Tensor, got {type(out_cache_loc).__name__}"
        )
    window = out_cache_loc.to(torch.int64).reshape(acc.batch_size, -1).contiguous()
    keep, release = kept_slots(acc, window)
    return keep, release.reshape(-1)


def eagle_verify_fields(tree: Tree, seq_lens, *, mask: bool = True, **mask_args) -> dict:
    """SGLang 0.5.23's ``EagleVerifyInput`` constructor arguments for ``tree``.

    What ``build_eagle_verify_input`` passes to ``EagleVerifyInput(...)``, with 0.5.23's
    field names (``retrieve_*``), from ddtree's emit instead of ``build_tree_kernel_efficient``;
    ``seq_lens`` int ``[bs]`` tensor (the verify batch's), ``mask_args`` :func:`verify_input`'s
    mask options; ``mask=False`` builds no FULL mask (``custom_mask`` None: for a verify
    attention that reads ``tree.ancestor_bits``, as ``ddtree.tree_attention`` does). Positions
    are ``seq_lens + depth``, whatever prefix the tree was built with (so the tree of
    :func:`uno_proposal` serves). Usage:
    ``EagleVerifyInput(**eagle_verify_fields(tree, batch.seq_lens, seq_lens_sum=...),
    capture_hidden_mode=None, prepared_out_cache_loc=None, prepared_mrope_positions=None)``.
    """
    v = verify_input(tree, seq_lens if mask else None, **mask_args)
    # From seq_lens, not tree.positions: a proposal's tree is built with zero prefixes.
    positions = (_check_seq_lens(seq_lens, tree.batch_size, tree.device).unsqueeze(1)
                 + tree.depths).reshape(-1)  # fmt: skip
    return {
        "draft_token": v["draft_token"],
        "custom_mask": v["custom_mask"],
        "positions": positions,
        "retrieve_index": v["retrive_index"],
        "retrieve_next_token": v["retrive_next_token"],
        "retrieve_next_sibling": v["retrive_next_sibling"],
        "retrieve_cum_len": None,
        "spec_steps": v["spec_steps"],
        "topk": v["topk"],
        "draft_token_num": v["draft_token_num"],
        "seq_lens_sum": None,
        "seq_lens_cpu": None,
        "draft_probs": None,
    }


def eagle_verify_result(acc: Acceptance, tree: Tree, seq_lens) -> dict:
    """What SGLang 0.5.23's ``run_eagle_verify`` derives from its walk, from ddtree's accept.

    ``seq_lens``: int ``[bs]``, the verify batch's ``seq_lens`` (tokens in the KV cache before
    the root). Returns a dict:

    ==================== ===================== ============================================
    key                  dtype, shape          content
    ==================== ===================== ============================================
    ``predict``          int32 ``[bs*Q]``      ``eagle_sample``'s: at path node j's slot the
                                               token after it, 0 off the path
    ``accept_lens``      int32 ``[bs]``        committed tokens: accepted drafts + the bonus
                                               (= ``acc.accept_len``)
    ``accept_index``     int32 ``[bs, L+1]``   ``b*Q + node``, root first, −1 padded
    ``new_seq_lens``     ``seq_lens``' dtype   ``seq_lens + accept_lens``
    ``bonus_tokens``     int32 ``[bs]``        the next root
    ``next_token_ids``   int32 ``[bs*Q]``      ``predict`` with each request's path moved
                                               to the front of its Q slots, as
                                               ``_compact_accept_to_front`` does when K > 1
                                               (K = 1: ``predict`` itself)
    ==================== ===================== ============================================

    Nothing is read on the host.
    """
    out = verify_output(acc, tree)
    bs, q = acc.batch_size, tree.width
    seq_lens = _check_seq_lens(seq_lens, bs, acc.device)
    predict = out["predict"][: bs * q].clamp(min=0)  # SGLang's predict starts as zeros
    accept_lens = acc.accept_len.to(torch.int32)
    compacted = predict
    if tree.topk_ids.shape[2] > 1:
        compacted = _compact_to_front(predict, out["accept_index"], bs, q)
    return {
        "predict": predict,
        "accept_lens": accept_lens,
        "accept_index": out["accept_index"],
        "new_seq_lens": seq_lens + accept_lens,
        "bonus_tokens": acc.bonus.to(torch.int32),
        "next_token_ids": compacted,
    }


def _check_seq_lens(seq_lens, bs: int, device) -> torch.Tensor:
    if not isinstance(seq_lens, torch.Tensor):
        raise TypeError(f"seq_lens: expected a torch.Tensor, got {type(seq_lens).__name__}")
    if seq_lens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"seq_lens: dtype must be int32 or int64, got {seq_lens.dtype}")
    if seq_lens.shape != (bs,):
        raise ValueError(f"seq_lens: shape must be [{bs}], got {list(seq_lens.shape)}")
    if seq_lens.device != device:
        raise ValueError(f"seq_lens: is on {seq_lens.device}, the acceptance on {device}")
    return seq_lens


def _compact_to_front(x: torch.Tensor, accept_index: torch.Tensor, bs: int, q: int):
    """Each request's path entries gathered into its first L+1 slots (SGLang's padding
    entries read global slot 0, past ``accept_lens``, where nothing reads them)."""
    width = min(accept_index.shape[1], q)  # a path never has more than Q nodes
    gathered = x[accept_index[:, :width].to(torch.int64).clamp(min=0).reshape(-1)]
    out = x.clone()
    out.view(bs, q)[:, :width] = gathered.view(bs, width)
    return out
