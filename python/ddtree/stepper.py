"""``Stepper``: static buffers, one build and one accept per round, views as results."""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import _api, _buffers, _commit, _cpu, _cuda, _sampling, _validate
from ._types import Acceptance, Tree


class _Plan(NamedTuple):
    tree: Tree
    launch: object  # _cuda.LaunchPlan on CUDA


_READBACK = ("accept_len", "accepted_tokens", "bonus")
READBACK_SLOTS = 4  # pinned readback buffers: how many accepts the host may run ahead


class _Readback:
    """One pinned host copy of an acceptance's readback fields and the event that says it
    has landed. The fields sit adjacent in the Stepper's device buffer, so one copy moves
    them: a kernel storing into the pinned buffer through its device mapping, or, where
    the driver does not map it, a memcpy (which costs the stream a switch to the copy
    engine and back, ~8 µs each way on the H200)."""

    def __init__(self, bufs: _buffers.FlatBuffers):
        self.device_span = bufs.span(_READBACK)
        self.host = torch.empty_like(self.device_span, device="cpu", pin_memory=True)
        self.mapped = _cuda.mapped_pointer(self.device_span.device, self.host)
        base = min(bufs.regions[name][1] for name in _READBACK)
        self.fields = {name: bufs.regions[name][1] - base for name in _READBACK}
        self.event = _new_event()
        self.stamp = -1  # which readback write this slot holds (-1: none yet)
        self.bs, self.path = 0, 0  # the shape of what it holds: [bs, path] tokens

    def start(self, acc: Acceptance, stamp: int) -> None:
        self.hold(acc, stamp)
        if self.mapped is None:
            self.host.copy_(self.device_span, non_blocking=True)
        else:
            _cuda.readback_into(self.device_span, self.mapped)
        self.event.record()

    def hold(self, acc: Acceptance, stamp: int) -> None:
        """Says what the slot holds once its pending write lands."""
        self.bs, self.path = acc.accepted_tokens.shape
        self.stamp = stamp

    def result(self) -> dict:
        bs, path = self.bs, self.path
        shapes = {"accept_len": (bs,), "bonus": (bs,), "accepted_tokens": (bs, path)}
        out = {
            name: self.host[at : at + _buffers._numel(shapes[name])].view(shapes[name])
            for name, at in self.fields.items()
        }
        out["round"] = self.stamp
        return out


class RoundGraph:
    """A captured round (step → verify → accept) and the views its replays rewrite; run it
    with ``Stepper.replay(bs)``."""

    def __init__(self, graph, tree: Tree, acc: Acceptance, slot: _Readback):
        self.graph, self.tree, self.acc, self.slot = graph, tree, acc, slot


def _new_event():
    """An event that records as an external node under graph capture (so that ``query``
    after a replay reports that replay's progress)."""
    try:
        return torch.cuda.Event(external=True)
    except TypeError:  # older torch: a plain event
        return torch.cuda.Event()


class Stepper:
    """Owns every output buffer of a round; ``step`` and ``accept`` return views of them.

    The next call overwrites the views. On CUDA, ``step`` launches on PyTorch's current
    stream, never synchronizes and never allocates, so it may be captured in a CUDA graph
    (the Stepper must outlive the graph). ``device="cpu"`` runs the Rust CPU path.
    """

    def __init__(
        self,
        max_batch=64,
        budget=255,
        depth=15,
        vocab=151936,
        device="cuda:0",
        topk=None,
        seed=0,
    ):
        self.max_batch = _validate.positive_int("max_batch", max_batch)
        self.budget = _validate.positive_int("budget", budget, limit=_validate.MAX_BUDGET)
        self.depth = _validate.positive_int("depth", depth, limit=_validate.MAX_DEPTH)
        self.vocab = _validate.positive_int("vocab", vocab)
        self.topk = _validate.optional_positive_int("topk", topk)
        self.device = _validate.concrete_device(torch.device(device))
        _validate.supported_device(self.device, "device")
        if self.device.type == "cuda":
            self._check_cuda_limits()
            _cuda.prepare(self.device)
        k = _api.k_of(self.budget, self.vocab, self.topk)
        largest_tree = _buffers.tree_shapes(self.max_batch, self.depth, k, self.budget)
        largest_acc = _buffers.acceptance_shapes(self.max_batch, self.depth)
        self._tree_bufs = _buffers.FlatBuffers(largest_tree, self.device)
        self._acc_bufs = _buffers.FlatBuffers(largest_acc, self.device)
        rows = self.max_batch * self.depth
        self._scratch = _cuda.new_scratch(rows, self.device) if self.device.type == "cuda" else {}
        self._plans: dict[tuple, _Plan] = {}
        self._tree: Tree | None = None
        self._acc: Acceptance | None = None
        self._cuda_round_state(seed)

    def _cuda_round_state(self, seed: int) -> None:
        """Sampling state, readback pinned buffers and event, commit outputs (CUDA only)."""
        self._sampling = None
        self._ring: list[_Readback] = []
        self._cursor = 0  # readback writes issued: eager accepts, captures and replays
        self._stamp = -1  # readback writes issued (accepts and graph replays)
        self._returned = -1  # stamp of the last readback returned
        self._graphs: dict[int, list[RoundGraph]] = {}
        self._caches: _commit.CacheTable | None = None
        if self.device.type != "cuda":
            return
        self._sampling = _sampling.SamplingState(self.max_batch, self.device, seed)
        n, path = self.max_batch, self.depth + 1
        self._ring = [_Readback(self._acc_bufs) for _ in range(READBACK_SLOTS)]
        q = self.budget + 1
        self._kept = torch.empty(n, path, dtype=torch.int64, device=self.device)
        self._release = torch.empty(n, q, dtype=torch.bool, device=self.device)

    def _check_cuda_limits(self) -> None:
        from . import _core

        if self.budget > _core.CUDA_MAX_BUDGET:
            raise ValueError(f"budget: at most {_core.CUDA_MAX_BUDGET} on CUDA, got {self.budget}")
        if self.depth > _core.CUDA_MAX_DEPTH:
            raise ValueError(f"depth: at most {_core.CUDA_MAX_DEPTH} on CUDA, got {self.depth}")

    def step(self, draft_logits, root_tokens, prefix_lens) -> Tree:
        """SPEC stages 1–3 into the static buffers; returns views sliced to the batch size."""
        self._check_open()
        x = _validate.logits("draft_logits", draft_logits, max_depth=self.depth)
        _validate.same_device("draft_logits", x, self.device)
        bs, depth, vocab = x.shape
        if bs > self.max_batch:
            raise ValueError(f"draft_logits: batch size {bs} exceeds max_batch={self.max_batch}")
        if vocab > self.vocab:
            raise ValueError(f"draft_logits: vocabulary {vocab} exceeds vocab={self.vocab}")
        roots = _validate.index_vector("root_tokens", root_tokens, bs, self.device)
        prefix = _validate.index_vector("prefix_lens", prefix_lens, bs, self.device)
        _validate.in_vocab("root_tokens", roots, vocab)  # CPU only: on CUDA, a status code
        _validate.non_negative("prefix_lens", prefix)
        k = _api.k_of(self.budget, vocab, self.topk)
        plan = self._plan(bs, depth, k)
        if self.device.type == "cuda":
            _cuda.launch_build(plan.launch, x, roots, prefix, self.budget, k)
        else:
            _cpu.build_into(plan.tree, x, roots, prefix, self.budget, self.topk)
        self._tree = plan.tree
        return plan.tree

    def _plan(self, bs: int, depth: int, k: int) -> _Plan:
        """Views of the static buffers (and their pointers) for one shape, made once."""
        key = (bs, depth, k)
        plan = self._plans.get(key)
        if plan is None:
            shapes = _buffers.tree_shapes(bs, depth, k, self.budget)
            tree = Tree(**self._tree_bufs.view(shapes))
            scratch = {name: t[: bs * depth] for name, t in self._scratch.items()}
            launch = _cuda.LaunchPlan.of(tree, scratch) if self.device.type == "cuda" else None
            plan = self._plans[key] = _Plan(tree, launch)
        return plan

    def accept(self, target_logits, temperature=None, top_k=None, top_p=None, generator=None):
        """SPEC stage 4 for the tree of the last ``step``; returns views of static buffers."""
        self._check_open()
        if self._tree is None:
            raise RuntimeError("Stepper.accept: call step() first")
        tree = self._tree
        shapes = _buffers.acceptance_shapes(tree.batch_size, tree.depth)
        acc = Acceptance(**self._acc_bufs.view(shapes))
        _api.accept_into(
            tree, target_logits, acc, temperature, top_k, top_p, generator, self._sampling
        )
        self._acc = acc
        if self.device.type == "cuda":
            self._start_readback(acc)
        return acc

    def _start_readback(self, acc: Acceptance) -> None:
        """Async copies of the acceptance into the next pinned slot of a ring, then its
        event (an external event node when this runs inside a graph capture). The ring lets
        the host run a few rounds ahead and still find an older round's tokens ready."""
        slot = self._ring[self._cursor % READBACK_SLOTS]
        self._cursor += 1
        self._stamp += 1
        slot.start(acc, self._stamp)

    def readback(self, wait: bool = False):
        """Host copy of an acceptance (``accept_len``, ``accepted_tokens``, ``bonus``, and
        ``round``: which accept or ``replay``, counted from 0): the newest one the GPU has
        finished and that was not returned before, or None (never blocks). ``wait=True``
        blocks on the newest one's event (not inside a graph capture). Tensors are views of
        pinned buffers, rewritten READBACK_SLOTS accepts later.

        On the CPU path the results are on the host as soon as ``accept`` returns.
        """
        self._check_open()
        if self._acc is None:
            return None
        if self.device.type != "cuda":
            acc = self._acc
            return {name: getattr(acc, name) for name in _READBACK}
        if wait:
            newest = max(self._ring, key=lambda s: s.stamp)
            newest.event.synchronize()
            self._returned = max(self._returned, newest.stamp)
            return newest.result()
        for slot in sorted(self._ring, key=lambda s: -s.stamp):
            if slot.stamp <= self._returned:
                break
            if slot.event.query():
                self._returned = slot.stamp
                return slot.result()
        return None

    def capture(
        self,
        draft_logits,
        root_tokens,
        prefix_lens,
        verify,
        *,
        before=None,
        after=None,
        **sampling,
    ):
        """Captures one round for this batch size — ``before()`` (e.g. the draft forward
        that writes ``draft_logits``) → ``step`` → ``verify(tree)`` (the caller's verify
        forward, returning target logits) → ``accept`` → ``after(tree, acc)`` (e.g. next
        roots) — as a CUDA graph kept per batch-size bucket; ``replay(bs)`` runs it on new
        values written into the same input tensors. Returns the ``RoundGraph`` (its
        ``tree`` and ``acc`` are the views each replay rewrites).

        The round is captured READBACK_SLOTS times, graph i writing readback slot i (the
        graphs share one memory pool: they never run at once); a replay runs the graph of
        the next slot of the ring that eager accepts also advance. So a host running a few
        replays ahead still finds an older replay's tokens ready, as in eager mode; with
        one graph every replay would rewrite the slot the host waits on. The slots' earlier
        contents are dropped at capture (readback returns None until a write lands)."""
        self._check_open()
        if self.device.type != "cuda":
            raise ValueError("Stepper.capture: CUDA graphs need device='cuda'")
        bs = draft_logits.shape[0]

        def round_():
            if before is not None:
                before()
            tree = self.step(draft_logits, root_tokens, prefix_lens)
            acc = self.accept(verify(tree), **sampling)
            if after is not None:
                after(tree, acc)
            return tree, acc

        round_()  # warm-up outside capture (cuBLAS handles, caching allocator)
        torch.cuda.synchronize(self.device)
        graphs, pool, cursor = [], None, self._cursor
        for i in range(READBACK_SLOTS):
            self._cursor = i  # graph i writes slot i
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                tree, acc = round_()
            pool = graph.pool()
            graphs.append(RoundGraph(graph, tree, acc, self._ring[i]))
        self._cursor = cursor
        for slot in self._ring:  # captured writes have not run: the slots hold nothing yet
            slot.stamp = -1
        self._graphs[bs] = graphs
        return graphs[0]

    def replay(self, bs: int):
        """Replays the round captured for batch size ``bs``; returns its ``RoundGraph``."""
        self._check_open()
        graphs = self._graphs.get(bs)
        if graphs is None:
            raise ValueError(f"bs: no round captured for batch size {bs}; call capture() first")
        # Eager accepts and every bucket's replays take slots from one cursor, so a slot is
        # rewritten only READBACK_SLOTS readback writes later.
        graph = graphs[self._cursor % READBACK_SLOTS]
        self._cursor += 1
        graph.graph.replay()
        self._stamp += 1
        graph.slot.hold(graph.acc, self._stamp)
        self._tree, self._acc = graph.tree, graph.acc
        return graph

    def kept_slots(self, out_cache_loc):
        """SPEC stage 5 for the last acceptance: the kept KV slots ``[bs, L+1]`` in path
        order (−1 padded) and the release mask ``[bs, Q]``, as views of static buffers."""
        acc = self._last_acceptance("kept_slots")
        if self.device.type != "cuda":
            return _commit.kept_slots(acc, out_cache_loc)
        bs = acc.batch_size
        kept, release = self._kept[:bs], self._release[:bs]
        return _commit.kept_slots(acc, out_cache_loc, kept=kept, release=release)

    def register_caches(self, caches) -> None:
        """The paged KV caches ``compact_kv`` moves rows in (each ``[slots, ...]``, rows
        contiguous and of one size): their device address table is built once, here."""
        self._check_open()
        self._caches = _commit.CacheTable(caches, self.device)

    def compact_kv(self, out_cache_loc) -> None:
        """Moves, in every registered cache, each request's accepted rows to the first
        ``accept_len`` slots of its verify window (one launch; sources read first)."""
        acc = self._last_acceptance("compact_kv")
        if self._caches is None:
            raise RuntimeError("Stepper.compact_kv: call register_caches() first")
        _commit.compact_kv(acc, out_cache_loc, self._caches)

    def gather_hidden(self, hidden, out):
        """The accepted nodes' hidden rows ``[bs*Q, H]`` → ``out`` ``[bs, L+1, H]`` in path
        order (zeros past each path); ``accept_len`` counts the real rows."""
        acc = self._last_acceptance("gather_hidden")
        return _commit.gather_hidden(acc, hidden, out=out)

    def _last_acceptance(self, what: str) -> Acceptance:
        self._check_open()
        if self._acc is None:
            raise RuntimeError(f"Stepper.{what}: call accept() first")
        return self._acc

    def close(self) -> None:
        """Releases the static buffers; the Stepper cannot be used afterwards."""
        self._tree_bufs = self._acc_bufs = None
        self._tree = self._acc = None
        self._plans.clear()
        self._scratch = {}
        self._sampling = self._caches = None
        self._ring, self._graphs = [], {}

    def _check_open(self) -> None:
        if self._tree_bufs is None:
            raise RuntimeError("Stepper: used after close()")
