"""``Stepper``: static buffers, one build and one accept per round, views as results."""

from __future__ import annotations

import numbers

import torch

from . import _api, _attention, _buffers, _commit, _cuda, _sampling, _validate, _vocab_parallel
from ._readback import READBACK_SLOTS, ReadbackRing
from ._types import Acceptance, Tree

_READBACK = ("accept_len", "accepted_tokens", "bonus", "status")  # what readback() holds


class RoundGraph:
    """A captured round (step → verify → accept) and the views its replays rewrite; run it
    with ``Stepper.replay(bs)``."""

    def __init__(self, graph, tree: Tree, acc: Acceptance, round_: tuple | None = None):
        self.graph, self.tree, self.acc = graph, tree, acc
        self.round = round_  # the CUDA engine's (bs, depth, K, V) of the captured step


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
        group=None,
        vocab_start=None,
    ):
        self.max_batch = _validate.positive_int("max_batch", max_batch)
        self.budget = _validate.positive_int("budget", budget, limit=_validate.MAX_BUDGET)
        self.depth = _validate.positive_int("depth", depth, limit=_validate.MAX_DEPTH)
        self.vocab = _validate.positive_int("vocab", vocab)
        self.topk = _validate.optional_positive_int("topk", topk)
        device = torch.device(device)
        _validate.supported_device(device, "device")
        _validate.cuda_present(device, "device")
        self.device = _validate.concrete_device(device)
        self._cuda = self.device.type == "cuda"
        # Vocab-parallel: step and accept take this rank's vocabulary shard (`vocab` is the
        # whole vocabulary). On CUDA the shard layout of each shape is agreed once, at its
        # first step / accept (`_vocab_parallel.ShardBuild`, `ShardKeys`).
        self._group, self._vocab_start = group, vocab_start
        self._shard_builds: dict[tuple, _vocab_parallel.ShardBuild] = {}
        self._shard_keys: dict[tuple, _vocab_parallel.ShardKeys] = {}
        _vocab_parallel.no_vocab_start(group, vocab_start)
        if group is not None and self._cuda:
            # Sampled accepts draw from each rank's own generator state: one seed for all.
            _vocab_parallel.agree(group, lambda: (None, [int(seed) & _sampling.SEED_MASK]))
        if self._cuda:
            self._check_cuda_limits()
            _cuda.prepare(self.device)
        k = _api.k_of(self.budget, self.vocab, self.topk)
        largest_tree = _buffers.tree_shapes(self.max_batch, self.depth, k, self.budget)
        largest_acc = _buffers.acceptance_shapes(self.max_batch, self.depth)
        self._tree_bufs = _buffers.FlatBuffers(largest_tree, self.device)
        self._acc_bufs = _buffers.FlatBuffers(largest_acc, self.device)
        rows = self.max_batch * self.depth
        self._scratch = _cuda.new_scratch(rows, self.device) if self._cuda else {}
        # Views of the static buffers per (bs, L, K): the tree and the acceptance of its accept.
        self._trees: dict[tuple, tuple[Tree, Acceptance]] = {}
        self._accs: dict[tuple, Acceptance] = {}  # per (bs, L)
        self._kept_views: dict[tuple, tuple] = {}  # CUDA kept_slots outputs per (bs, L+1, Q)
        self._tree: Tree | None = None
        self._next_acc: Acceptance | None = None  # the last step's tree's acceptance view
        self._round: tuple | None = None  # the engine's (bs, L, K, V) of the last step
        self._acc: Acceptance | None = None
        self._round_state(seed)

    def _round_state(self, seed: int) -> None:
        """The Rust engine of this device and, on CUDA, the sampling state, the readback
        ring and the commit outputs it launches into."""
        self._sampling = None
        self._ring: ReadbackRing | None = None
        # The CPU path's published acceptance (readback's copy, taken when published), its
        # round, and whether readback() returned it.
        self._cpu_published: dict | None = None
        self._cpu_returned = True
        self._graphs: dict[int, RoundGraph] = {}
        self._caches: _commit.CacheTable | None = None
        self._engine = None
        if not self._cuda:
            self._engine = self._new_cpu_engine()
            return
        self._sampling = _sampling.SamplingState(self.max_batch, self.device, seed)
        n, path = self.max_batch, self.depth + 1
        self._ring = ReadbackRing(n, path, self.device, READBACK_SLOTS)
        q = self.budget + 1
        self._kept = torch.empty(n, path, dtype=torch.int64, device=self.device)
        self._release = torch.empty(n, q, dtype=torch.bool, device=self.device)
        self._engine = self._new_cuda_engine()

    def _limits(self) -> tuple:
        return (self.max_batch, self.budget, self.depth, self.vocab, self.topk)

    def _largest_tree(self) -> Tree:
        k = _api.k_of(self.budget, self.vocab, self.topk)
        return self._views((self.max_batch, self.depth, k))[0]

    def _new_cpu_engine(self):
        """The CPU twin of the CUDA engine: the same checks and round state, then the Rust
        CPU path into the static buffers."""
        from . import _core

        largest_acc = self._acc_view(self.max_batch, self.depth)
        return _core.CpuEngine(self._limits(), self._largest_tree(), largest_acc)

    def _new_cuda_engine(self):
        """The Rust round engine: it keeps the static buffers' addresses (read once, here)
        and the last step's shape, so a call passes only its own tensors."""
        from . import _core

        largest_acc = self._acc_view(self.max_batch, self.depth)
        return _core.CudaEngine(
            _cuda.device_index(self.device),
            self._limits(),
            self._largest_tree(),
            largest_acc,
            self._scratch,
            self._sampling,
            self._ring.device_side,
            (self._kept, self._release),
        )

    def _check_cuda_limits(self) -> None:
        from . import _core

        if self.budget > _core.CUDA_MAX_BUDGET:
            raise ValueError(f"budget: at most {_core.CUDA_MAX_BUDGET} on CUDA, got {self.budget}")
        if self.depth > _core.CUDA_MAX_DEPTH:
            raise ValueError(f"depth: at most {_core.CUDA_MAX_DEPTH} on CUDA, got {self.depth}")

    def step(self, draft_logits, root_tokens, prefix_lens) -> Tree:
        """SPEC stages 1–3 into the static buffers; returns views sliced to the batch size.

        The Rust engine checks every tensor (naming it) before any work; lists of ints
        become tensors here first. On CUDA, token and prefix values are status codes (a host
        check would sync); on the CPU they are checked on the host."""
        self._check_open()
        if self._group is not None and self._cuda:
            return self._step_group_cuda(draft_logits, root_tokens, prefix_lens)
        if self._group is not None:
            return self._step_group(draft_logits, root_tokens, prefix_lens)
        if not (isinstance(root_tokens, torch.Tensor) and isinstance(prefix_lens, torch.Tensor)):
            bs = _validate.logits("draft_logits", draft_logits).shape[0]
            root_tokens = _validate.index_vector("root_tokens", root_tokens, bs, self.device)
            prefix_lens = _validate.index_vector("prefix_lens", prefix_lens, bs, self.device)
        round_ = self._engine.step(draft_logits, root_tokens, prefix_lens)
        tree, self._next_acc = self._views(round_[:3])
        self._tree, self._round = tree, round_
        return tree

    def _step_group(self, draft_logits, root_tokens, prefix_lens) -> Tree:
        """`step` on this rank's vocabulary shard, into the static buffers."""

        def into(bs: int, depth: int, k: int, vocab: int) -> Tree:
            if vocab != self.vocab:
                raise ValueError(f"draft_logits: the shards hold V = {vocab} tokens, the "
                                 f"Stepper's vocab is {self.vocab}")  # fmt: skip
            if bs > self.max_batch or depth > self.depth:
                raise ValueError(f"draft_logits: [{bs}, {depth}, ...] exceeds the Stepper's "
                                 f"max_batch {self.max_batch} / depth {self.depth}")  # fmt: skip
            return self._views((bs, depth, k))[0]

        args = (draft_logits, root_tokens, prefix_lens, self.budget, self.topk)
        tree = _vocab_parallel.build_tree(args, self._group, self._vocab_start, into)
        self._tree, self._next_acc = self._views(tuple(tree.topk_ids.shape))
        self._round = (*tree.topk_ids.shape, self.vocab)
        return tree

    def _step_group_cuda(self, draft_logits, root_tokens, prefix_lens) -> Tree:
        """`step` on this rank's CUDA shard. The first step of a shape checks the arguments
        on every rank and agrees on the shard layout (host syncs: not in a capture); later
        ones check this rank's arguments on the host and launch kernels and in-place
        collectives only (capturable with NCCL). The ranks must then pass the same roots
        and prefix lengths: comparing them again would sync."""
        args = (draft_logits, root_tokens, prefix_lens, self.budget, self.topk)
        plan = self._shard_builds.get(tuple(getattr(draft_logits, "shape", ())))
        if plan is None:  # every check inside the agreement: no rank is left waiting
            self._agree_outside_capture("step")
            also = lambda x: self._check_shard(x, "draft_logits")  # noqa: E731
            x, roots, prefix, _, _ = _vocab_parallel.agreed_build_args(args, self._group, also)
            plan = _vocab_parallel.ShardBuild(x.shape, self.budget, self.topk, self._group,
                                              self._vocab_start, self.device)  # fmt: skip
            self._check_vocab(plan.vocab, "draft_logits")
            self._shard_builds[tuple(x.shape)] = plan
        else:
            x, roots, prefix, _, _ = _api.check_build(*args, whole_vocab=False)
            self._check_shard(x, "draft_logits")
        bs, depth, _ = x.shape
        tree, self._next_acc = self._views((bs, depth, plan.k))
        plan.run(x, roots, prefix, tree)
        self._tree, self._round = tree, (bs, depth, plan.k, self.vocab)
        return tree

    def _agree_outside_capture(self, what: str) -> None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"Stepper.{what}: with group= the first call of a shape agrees on the shard "
                "layout on the host; make it once before capturing"
            )

    def _check_shard(self, x: torch.Tensor, name: str) -> None:
        if x.device != self.device:
            raise ValueError(f"{name}: on {x.device}, the Stepper's device is {self.device}")
        bs, depth = x.shape[:2]
        if name == "draft_logits" and (bs > self.max_batch or depth > self.depth):
            raise ValueError(f"draft_logits: [{bs}, {depth}, ...] exceeds the Stepper's "
                             f"max_batch {self.max_batch} / depth {self.depth}")  # fmt: skip

    def _check_vocab(self, vocab: int, name: str) -> None:
        if vocab != self.vocab:
            raise ValueError(f"{name}: the shards hold V = {vocab} tokens, the Stepper's "
                             f"vocab is {self.vocab}")  # fmt: skip

    def _views(self, key: tuple) -> tuple[Tree, Acceptance]:
        """Views of the static buffers for one (bs, L, K): the tree, and the acceptance its
        accept writes (looked up here once, so an accept does not)."""
        views = self._trees.get(key)
        if views is None:
            bs, depth, k = key
            tree = Tree(**self._tree_bufs.view(_buffers.tree_shapes(bs, depth, k, self.budget)))
            views = self._trees[key] = (tree, self._acc_view(bs, depth))
        return views

    def _acc_view(self, bs: int, depth: int) -> Acceptance:
        acc = self._accs.get((bs, depth))
        if acc is None:
            acc = Acceptance(**self._acc_bufs.view(_buffers.acceptance_shapes(bs, depth)))
            self._accs[(bs, depth)] = acc
        return acc

    def accept(
        self,
        target_logits,
        temperature=None,
        top_k=None,
        top_p=None,
        generator=None,
        *,
        readback=True,
    ):
        """SPEC stage 4 for the tree of the last ``step``; returns views of static buffers.

        On CUDA, ``readback=True`` also stores the acceptance into the next pinned slot of
        the readback ring (``readback()`` finds it). Pass False when a commit call later in
        the round publishes instead (``kept_slots(..., readback=True)``), so that the slot
        carries that call's status codes too."""
        self._check_open()
        if self._tree is None:
            raise RuntimeError("Stepper.accept: call step() first")
        tree, acc = self._tree, self._next_acc
        if self._cuda and self._group is not None:
            self._accept_group_cuda(target_logits, temperature, top_k, top_p, generator)
            self._acc = acc
            self._publish(acc, readback)
            return acc
        if self._cuda:  # the engine publishes within the accept's graph
            self._accept_cuda(target_logits, temperature, top_k, top_p, generator, readback)
            self._acc = acc
            return acc
        if self._group is not None:
            sampling = (temperature, top_k, top_p, generator)
            _vocab_parallel.accept_into(tree, target_logits, acc, self._group,
                                        self._vocab_start, sampling)  # fmt: skip
            self._acc = acc
            self._publish(acc, readback)
            return acc
        # Every argument is checked before a seed is drawn (that advances a torch.Generator).
        self._engine.check_target(target_logits)  # shape, vocabulary, device: named
        params, seed = _api.cpu_sampling(tree.batch_size, temperature, top_k, top_p, generator)
        self._engine.accept(target_logits, params, seed)
        self._acc = acc
        self._publish(acc, readback)
        return acc

    def _accept_cuda(self, target_logits, temperature, top_k, top_p, generator, readback):
        """One engine call: it checks the target and each parameter (None, a number or a
        ``[bs]`` tensor) and runs greedy when temperature is None or 0, else loads them in
        the accept's own graph."""
        params = (temperature, top_k, top_p)
        if generator is None or _sampling.is_greedy_number(temperature):
            self._engine.accept(target_logits, readback, params)
            return
        # Every argument is checked before anything changes: drawing a seed from a
        # torch.Generator advances it.
        if isinstance(generator, torch.Generator):
            self._engine.check_target(target_logits, params)
        seed = _api.seed_of(generator) & _sampling.SEED_MASK
        self._engine.accept(target_logits, readback, params, seed)

    def _accept_group_cuda(self, target_logits, temperature, top_k, top_p, generator):
        """`accept` on this rank's CUDA shard of the target: greedy, or sampled by
        temperature with the Stepper's own generator state (reseeded by `generator` as the
        single-GPU accept is), so every rank draws what a single-GPU Stepper of the same
        seed draws. The first accept of a shape agrees on the layout (host syncs); later
        ones launch and gather in place. top_k / top_p need whole rows: refused here
        (`ddtree.accept_tree(group=)` gathers them)."""
        greedy = _sampling.is_greedy_number(temperature)
        if not greedy:
            refuse_row_filter("top_k", top_k, lambda v: v <= 0)
            refuse_row_filter("top_p", top_p, lambda v: v >= 1)
        tree, acc = self._tree, self._next_acc
        plan = self._shard_keys.get(tuple(getattr(target_logits, "shape", ())))
        if plan is None:  # every check inside the agreement, as the step's
            self._agree_outside_capture("accept")
            also = lambda t: self._check_shard(t, "target_logits")  # noqa: E731
            t = _vocab_parallel.agreed_target(tree, target_logits, self._group, also)
            plan = _vocab_parallel.ShardKeys(t.shape, self._group, self._vocab_start,
                                             self.device)  # fmt: skip
            self._check_vocab(plan.vocab, "target_logits")
            self._shard_keys[tuple(t.shape)] = plan
        else:
            t = _api.check_target(tree, target_logits, whole_vocab=False)
            self._check_shard(t, "target_logits")
        state = None
        if not greedy:
            state = self._sampling
            state.load(tree.batch_size, temperature, None, None)  # checks, then writes
            if generator is not None:  # as the engine's load: (seed, 0)
                state.reseed(_api.seed_of(generator))
        plan.run(t, tree, acc, state)
        if state is not None:
            state.rng[1:].add_(1)  # the engine's advance after a sampled accept
        # The commit calls (kept_slots, compact_kv, gather_hidden) and the readback are the
        # engine's: they read the static buffers this round wrote.
        self._engine.resume(self._round)

    def _publish(self, acc: Acceptance, readback: bool) -> None:
        if not readback:
            return
        if self._cuda:
            self._engine.publish()
            return
        round_ = -1 if self._cpu_published is None else self._cpu_published["round"]
        self._cpu_published = {name: getattr(acc, name).clone() for name in _READBACK}
        self._cpu_published["round"] = round_ + 1
        self._cpu_returned = False

    def readback(self, wait: bool = False):
        """Host copy of a published acceptance: ``accept_len``, ``accepted_tokens``,
        ``bonus``, ``status`` (int32) and ``round`` (which readback write, counted from 0 —
        eager calls and replays of any graph alike). Returns the newest one the GPU has
        finished that was not returned before, or None; never blocks, syncs or reads an
        event. ``wait=True`` first waits for the current stream (not inside a graph
        capture) and returns the newest one even if it was returned before. The tensors are
        the caller's own copies.

        On the CPU path the same rules hold for the acceptance published last (copied when
        it was published): returned once, None until the next publishing call.
        """
        self._check_open()
        if not self._cuda:
            if self._cpu_published is None or (self._cpu_returned and not wait):
                return None
            self._cpu_returned = True
            return {k: v.clone() if isinstance(v, torch.Tensor) else v
                    for k, v in self._cpu_published.items()}  # fmt: skip
        if wait:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("Stepper.readback(wait=True): not allowed inside a capture")
            torch.cuda.current_stream(self.device).synchronize()
            return self._ring.newest(fresh_only=False)
        return self._ring.newest()

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

        One graph per batch size: the readback kernel picks its ring slot from a cursor in
        device memory, so each replay writes the next slot and a host a few replays behind
        still reads the newest finished round whole."""
        self._check_open()
        if not self._cuda:
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
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            tree, acc = round_()
        self._graphs[bs] = RoundGraph(graph, tree, acc, self._round)
        return self._graphs[bs]

    def replay(self, bs: int):
        """Replays the round captured for batch size ``bs``; returns its ``RoundGraph``."""
        self._check_open()
        graph = self._graphs.get(bs)
        if graph is None:
            raise ValueError(f"bs: no round captured for batch size {bs}; call capture() first")
        graph.graph.replay()
        self._tree, self._acc, self._round = graph.tree, graph.acc, graph.round
        self._next_acc = graph.acc
        self._engine.resume(graph.round)
        return graph

    def kept_slots(self, out_cache_loc, *, readback=False):
        """SPEC stage 5 for the last acceptance: the kept KV slots ``[bs, L+1]`` in path
        order (−1 padded) and the release mask ``[bs, Q]``, as views of static buffers.
        With registered caches, window slots outside them give ``STATUS_SLOT_OUT_OF_RANGE``
        in ``acc.status``; ``readback=True`` then publishes the acceptance (see ``accept``)."""
        acc = self._last_acceptance("kept_slots")
        slots = self._caches.slots if self._caches is not None else None
        if self._cuda:  # the CUDA engine checks the window, launches, publishes
            self._engine.kept_slots(out_cache_loc, slots, readback)
            return self._kept_view(acc.batch_size, acc.path_len, self._tree.width)
        self._check_window(out_cache_loc)
        result = _commit.kept_slots(acc, out_cache_loc, num_slots=slots)
        self._publish(acc, readback)
        return result

    def _kept_view(self, bs: int, path: int, q: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Contiguous views of the static kept/release outputs for one shape (the tree may
        be shallower than the Stepper's depth), made once."""
        key = (bs, path, q)
        views = self._kept_views.get(key)
        if views is None:
            kept = self._kept.view(-1)[: bs * path].view(bs, path)
            release = self._release.view(-1)[: bs * q].view(bs, q)
            views = self._kept_views[key] = (kept, release)
        return views

    def _check_window(self, out_cache_loc) -> None:
        """The verify window must be [bs, Q] of the last step's tree."""
        q = self._tree.width
        shape = getattr(out_cache_loc, "shape", None)
        if shape is not None and len(shape) == 2 and shape[1] != q:
            raise ValueError(f"out_cache_loc: must be [bs, {q}] (Q of the tree), got {list(shape)}")

    def _check_hidden(self, hidden, bs: int) -> None:
        """The verify forward's hidden rows must be bs·Q of the last step's tree (the
        functional gather_hidden, which knows no Q, takes it from the rows)."""
        rows = self._tree.width * bs
        shape = getattr(hidden, "shape", None)
        # Only what the shared checks let through (a whole number of rows per request, at
        # least 2-D): theirs name the other problems, with the functional API's messages.
        if shape is not None and len(shape) >= 2 and shape[0] % bs == 0 and shape[0] != rows:
            raise ValueError(
                f"hidden: must have bs·Q = {rows} rows (Q of the tree), got {list(shape)}"
            )

    def register_caches(self, caches) -> None:
        """The paged KV caches ``compact_kv`` moves rows in (each ``[slots, ...]``, rows
        contiguous and of one size): their device address table is built once, here."""
        self._check_open()
        self._caches = _commit.CacheTable(caches, self.device)
        if self._cuda:
            t = self._caches
            self._engine.register_caches(t.table, len(t.caches), t.row_bytes, t.slots)

    def compact_kv(self, out_cache_loc, *, readback=False) -> None:
        """Moves, in every registered cache, each request's accepted rows to the first
        ``accept_len`` slots of its verify window (one launch; sources read first). A
        request with a slot out of the caches moves nothing (``acc.status``);
        ``readback=True`` then publishes the acceptance (see ``accept``)."""
        acc = self._last_acceptance("compact_kv")
        if self._caches is None:
            raise RuntimeError("Stepper.compact_kv: call register_caches() first")
        if self._cuda:  # the CUDA engine checks the window, launches, publishes
            self._engine.compact_kv(out_cache_loc, readback)
            return
        self._check_window(out_cache_loc)
        _commit.compact_kv(acc, out_cache_loc, self._caches)
        self._publish(acc, readback)

    def gather_hidden(self, hidden, out, *, readback=False):
        """The accepted nodes' hidden rows ``[bs*Q, H]`` → ``out`` ``[bs, L+1, H]`` in path
        order (zeros past each path); ``accept_len`` counts the real rows."""
        acc = self._last_acceptance("gather_hidden")
        self._check_hidden(hidden, acc.batch_size)
        if self._cuda and out is not None:  # the engine checks and launches
            self._engine.gather_hidden(hidden, out, readback)
            return out
        result = _commit.gather_hidden(acc, hidden, out=out)
        self._publish(acc, readback)
        return result

    def prepare_attention(self, *, hq: int, hkv: int, dqk: int, dv: int) -> None:
        """Makes the engine's workspace for ``tree_attention`` calls of this head shape (up
        to ``max_batch`` requests of the Stepper's Q = budget+1 nodes): it allocates, so do
        it before capturing a round that calls ``tree_attention``. Once per shape; a no-op
        on the CPU."""
        self._check_open()
        heads = [_validate.positive_int(n, v) for n, v in (("hq", hq), ("hkv", hkv))]
        dims = [_validate.positive_int(n, v) for n, v in (("dqk", dqk), ("dv", dv))]
        if heads[0] % heads[1]:
            raise ValueError(f"hkv: {hkv} KV heads do not divide hq={hq} query heads")
        if self._cuda:
            self._engine.prepare_attention(tuple(heads), tuple(dims))

    def tree_attention(
        self,
        q,
        k_new,
        v_new,
        k_cache,
        v_cache,
        kv_indptr,
        kv_indices,
        prefix_lens,
        *,
        sm_scale,
        page_size=1,
        out=None,
        return_lse=False,
        lse_out=None,
        status=None,
    ):
        """``ddtree.tree_attention`` for the last step's tree, with the engine's workspace
        (made on first use of a head shape, or by ``prepare_attention``): the verify
        forward's attention inside a captured round needs no tree or workspace argument."""
        self._check_open()
        if self._tree is None:
            raise RuntimeError("Stepper.tree_attention: call step() first")
        given = dict(locals())
        given.pop("self")
        given["tree"] = self._tree
        a = _attention._check(given)  # every argument, named, before anything runs
        if self._cuda:
            with torch.cuda.device(self.device):  # this device's stream, whichever is current
                capturing = torch.cuda.is_current_stream_capturing()
            if not capturing:  # inside a capture the workspace must exist already
                self.prepare_attention(hq=a["hq"], hkv=a["hkv"], dqk=a["dqk"], dv=a["dv"])
            self._engine.tree_attention(_attention.launch_arg(a))
        else:
            _attention._cpu_attention(a)
        return (a["out"], a["lse"]) if return_lse else a["out"]

    def _last_acceptance(self, what: str) -> Acceptance:
        self._check_open()
        if self._acc is None:
            raise RuntimeError(f"Stepper.{what}: call accept() first")
        return self._acc

    def close(self) -> None:
        """Releases the static buffers; the Stepper cannot be used afterwards. On CUDA it
        first waits for the device, since queued readback kernels still store into the
        pinned ring (a graph that captured this Stepper must not be replayed afterwards)."""
        if self._cuda and self._ring is not None:
            torch.cuda.synchronize(self.device)
        self._tree_bufs = self._acc_bufs = None
        self._shard_builds, self._shard_keys = {}, {}
        self._tree = self._acc = self._next_acc = None
        self._trees.clear()
        self._accs.clear()
        self._kept_views.clear()
        self._engine = None
        self._scratch = {}
        self._sampling = self._caches = None
        self._ring, self._graphs = None, {}

    def _check_open(self) -> None:
        if self._tree_bufs is None:
            raise RuntimeError("Stepper: used after close()")


def refuse_row_filter(name: str, value, off) -> None:
    """A CUDA Stepper(group=) samples by temperature alone: a top-k / top-p value that
    filters (a tensor, or a number not `off`) needs whole rows."""
    if value is None or (isinstance(value, numbers.Real) and off(value)):
        return
    raise ValueError(f"{name}: a vocab-parallel Stepper on CUDA samples by temperature only; "
                     "ddtree.accept_tree(group=) gathers whole rows for top-k / top-p")  # fmt: skip
