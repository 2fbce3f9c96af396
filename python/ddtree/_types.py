"""The result objects: ``Tree`` (SPEC stages 1–3) and ``Acceptance`` (stage 4)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import _validate


@dataclass(frozen=True)
class Tree:
    """Verify inputs of a batch; every field is a tensor on the input device (API.md)."""

    verify_ids: torch.Tensor  # int64 [bs, Q]
    positions: torch.Tensor  # int64 [bs, Q]
    depths: torch.Tensor  # int64 [bs, Q]
    parents: torch.Tensor  # int64 [bs, Q]
    first_child: torch.Tensor  # int64 [bs, Q]
    next_sibling: torch.Tensor  # int64 [bs, Q]
    ancestor_bits: torch.Tensor  # int32 [bs, Q, ceil(Q/32)]
    num_nodes: torch.Tensor  # int64 [bs]
    scores: torch.Tensor  # float64 [bs, Q]
    topk_logprobs: torch.Tensor  # float32 [bs, L, K]
    topk_ids: torch.Tensor  # int64 [bs, L, K]
    status: torch.Tensor  # int32 [bs]

    @property
    def batch_size(self) -> int:
        return self.verify_ids.shape[0]

    @property
    def width(self) -> int:
        """Q = budget + 1."""
        return self.verify_ids.shape[1]

    @property
    def depth(self) -> int:
        """L, the depth limit."""
        return self.topk_ids.shape[1]

    def visibility(self) -> torch.Tensor:
        """bool ``[bs, Q, Q]``: ``[b, i, j]`` is True iff j is i or an ancestor of i."""
        q = self.width
        j = torch.arange(q, device=self.ancestor_bits.device)
        words = self.ancestor_bits[:, :, j // 32]
        return ((words >> (j % 32).to(torch.int32)) & 1).bool()

    def sglang_custom_mask(
        self, seq_lens, out: torch.Tensor | None = None, *, prefix_columns: bool = True
    ) -> torch.Tensor:
        """SGLang's flat FULL bool mask: request b is a row-major ``[Q, P_b + Q]`` block.

        ``seq_lens`` are the prefix lengths ``P_b`` (tokens already in the KV cache). Prefix
        columns are set True unless ``prefix_columns=False`` (then only the tree columns are
        written, e.g. into a buffer whose prefix columns are already True).

        Without ``out`` a new tensor of exactly the mask's size is returned (on CUDA this
        reads ``seq_lens`` on the host, a sync). With ``out``, the mask is written into it:
        on the CPU the view of its first ``sum(Q * (P_b + Q))`` elements is returned; on CUDA
        the offsets are computed on the device (no sync, graph-capturable), ``out`` itself is
        returned, and rows that would not fit in ``out`` are not written.

        Wherever ``seq_lens`` are read on the host, a negative one, or ones whose mask would
        not fit in the device's memory, raise ``ValueError`` before anything is allocated.
        """
        from . import _cpu, _cuda

        seq_lens = _validate.index_vector("seq_lens", seq_lens, self.batch_size, self.device)
        cuda = self.device.type == "cuda"
        total = None  # on CUDA with `out`, the values stay on the device
        if out is None or not cuda:
            total = _validate.mask_elements(seq_lens.cpu(), self.width, self.device)
        if out is None:
            out = torch.empty(total, dtype=torch.bool, device=self.device)
        else:
            _validate.mask_out(out, total, self.device)
        if cuda:
            _cuda.full_mask(self.ancestor_bits, seq_lens, out, prefix_columns)
            return out if total is None else out[:total]
        return out[: _cpu.full_mask(self.ancestor_bits, seq_lens, out, prefix_columns)]

    @property
    def device(self) -> torch.device:
        return self.verify_ids.device


@dataclass(frozen=True)
class Acceptance:
    """Result of the walk (API.md); every field is a tensor on the input device."""

    accepted_nodes: torch.Tensor  # int64 [bs, L+1], -1 padded
    accepted_tokens: torch.Tensor  # int64 [bs, L+1], -1 padded
    accept_len: torch.Tensor  # int64 [bs], 1..L+1
    bonus: torch.Tensor  # int64 [bs]
    accept_index: torch.Tensor  # int64 [bs, L+1]: b*Q + node, -1 padded
    # int32 [bs]: 0, or the STATUS_* code of a bad index the accept (corrupt tree links) or
    # a commit function (a node or KV slot out of range) found for the request.
    status: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.accepted_nodes.shape[0]

    @property
    def path_len(self) -> int:
        """L + 1."""
        return self.accepted_nodes.shape[1]

    @property
    def device(self) -> torch.device:
        return self.accepted_nodes.device


def checked(name: str, x, cls):
    """``x`` if it is a ``cls`` (``Tree`` or ``Acceptance``), else a TypeError naming the
    argument: passing one where the other belongs would fail later on a missing field."""
    if not isinstance(x, cls):
        raise TypeError(f"{name}: expected a ddtree.{cls.__name__}, got {type(x).__name__}")
    return x
