"""A batch's decode state on the device, carried from round to round without the host.

Every decoder's round ends with `DecodeState.commit`: the round's committed tokens are
appended to a history on the device, the next round's root and prefix length are computed
there, and a request that reached its end-of-turn token or ``max_new`` tokens is marked
finished. A finished request stays in the batch as padding until the batch ends: its root
and prefix length freeze, so its later rounds write only past its committed prefix and its
history is not extended. The host reads `finished` (a count, 8 bytes) to know when to stop
queuing rounds, and the whole history once, at the end.
"""

from __future__ import annotations

import torch


class DecodeState:
    """Roots, prefix lengths, token history and finished flags of `bs` requests."""

    def __init__(self, bs: int, max_new: int, extra: int, eos: int, device):
        self.bs, self.max_new, self.eos = bs, max_new, eos
        self.cap = max_new + extra  # a round may overshoot max_new by up to `extra` - 1
        dev = torch.device(device)
        i64 = {"dtype": torch.int64, "device": dev}
        self.rows = torch.arange(bs, **i64)
        self.roots = torch.zeros(bs, **i64)  # the next round's root token (not in the KV)
        self.prefix = torch.zeros(bs, **i64)  # tokens in the KV pool
        # Column `cap` is a dump: padding's writes land there.
        self.history = torch.zeros(bs, self.cap + 1, **i64)
        self.margins = torch.zeros(bs, self.cap + 1, dtype=torch.float32, device=dev)
        self.count = torch.zeros(bs, **i64)  # tokens in the history
        # Per request, each round's tokens that tokens() keeps (a round past the end of turn
        # or max_new counts only up to it), until it finished: a round commits at least one
        # token, so max_new + 1 columns hold them; the last is the dump.
        self.accepts = torch.zeros(bs, max_new + 2, **i64)
        self.rounds = torch.zeros(bs, **i64)
        self.done = torch.zeros(bs, dtype=torch.bool, device=dev)
        self.finished = torch.zeros((), **i64)  # done.sum(), what the host polls
        # Over the rounds, per unfinished request: rounds and committed tokens.
        self.active_rounds = torch.zeros((), **i64)
        self.active_tokens = torch.zeros((), **i64)

    def start(self, roots, prefix, margins=None) -> None:
        """After the prefill: the first generated token of each request and its prompt
        length (eager, before any round)."""
        self.roots.copy_(roots)
        self.prefix.copy_(prefix)
        self.history.zero_()
        self.history[:, 0] = roots
        self.margins.zero_()
        if margins is not None:
            self.margins[:, 0] = margins
        self.count.fill_(1)
        self.accepts.zero_()
        self.rounds.zero_()
        self.done.copy_((roots == self.eos) | (self.max_new <= 1))
        self.finished.copy_(self.done.sum())
        self.active_rounds.zero_()
        self.active_tokens.zero_()

    def commit(self, tokens, n, next_root, margins=None) -> None:
        """Append the round's committed `tokens` [bs, w] (the first `n` [bs] of each row)
        and move to `next_root`; device ops only (captured in the round's graph)."""
        before = self.done.clone()
        live = ~before
        cols = torch.arange(tokens.shape[1], device=tokens.device)
        valid = (cols < n.unsqueeze(1)) & live.unsqueeze(1)
        at = (self.count.unsqueeze(1) + cols).clamp(max=self.cap - 1)
        at = torch.where(valid, at, self.cap)
        self.history.scatter_(1, at, tokens)
        if margins is not None:
            self.margins.scatter_(1, at, margins)
        step = torch.where(live, n, 0)
        self._record_round(tokens, valid, step, live)
        self.count.add_(step)
        self.prefix.add_(step)
        self.roots.copy_(torch.where(live, next_root, self.roots))
        hit = ((tokens == self.eos) & valid).any(1)
        self.done.logical_or_(hit | (self.count >= self.max_new))
        self.finished.copy_(self.done.sum())
        self.active_rounds.add_(live.sum())
        self.active_tokens.add_(step.sum())

    def tokens(self) -> list[list[int]]:
        """Each request's generated tokens, cut after its end-of-turn token and at max_new
        (reads the device: after the decode)."""
        out = []
        for row, count in zip(self.history.tolist(), self.count.tolist(), strict=True):
            row = row[: min(count, self.max_new)]
            if self.eos in row:
                row = row[: row.index(self.eos) + 1]
            out.append(row)
        return out

    def _record_round(self, tokens, valid, step, live) -> None:
        """This round's tokens as `tokens()` will keep them (cut after the end-of-turn token
        and at max_new) into the per-round record."""
        hit = (tokens == self.eos) & valid
        upto_eos = torch.where(hit.any(1), hit.long().argmax(1) + 1, step)
        room = (self.max_new - self.count).clamp(min=0)
        kept = torch.minimum(torch.minimum(step, upto_eos), room)
        dump = self.accepts.shape[1] - 1
        slot = torch.where(live, self.rounds.clamp(max=dump - 1), dump)
        self.accepts.scatter_(1, slot.unsqueeze(1), kept.unsqueeze(1))
        self.rounds.add_(live.long())

    def accept_rows(self) -> list[list[int]]:
        """Each request's tokens committed per round, until it finished (reads the device)."""
        return [row[:n] for row, n in zip(self.accepts.tolist(), self.rounds.tolist(),
                                          strict=True)]  # fmt: skip

    def margin_rows(self, tokens: list[list[int]]) -> list[list[float]]:
        return [m[: len(t)] for m, t in zip(self.margins.tolist(), tokens, strict=True)]

    def mean_accepted(self) -> float:
        """Committed tokens per round of an unfinished request."""
        rounds = int(self.active_rounds)
        return int(self.active_tokens) / rounds if rounds else 0.0
