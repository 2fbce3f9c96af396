"""A small GPU round for compute-sanitizer (memcheck, racecheck): every kernel, every dtype,
a strided view, a NaN row, the largest budget, the FULL mask, accept (greedy and sampling),
the commit kernels and a Stepper's readback kernel. Exits non-zero on error."""

import torch

import ddtree


def round_kernels(tree, dtype, vocab, g) -> None:
    """Stages 4–5: greedy and sampling accept, kept slots, KV compaction, hidden gather."""
    dev = tree.device
    bs, q = tree.verify_ids.shape
    target = torch.randn(bs, q, vocab, device=dev, generator=g).to(dtype)
    ddtree.accept_tree(tree, target)
    for kw in ({"top_p": 0.8}, {"top_k": 5}, {}):  # the shortlist's passes, each cut alone
        ddtree.accept_tree(tree, target, temperature=0.9, generator=2, **kw)
    acc = ddtree.accept_tree(tree, target, temperature=0.9, top_k=5, top_p=0.8, generator=1)
    window = torch.randperm(bs * q + 5, device=dev, generator=g)[: bs * q].view(bs, q)
    ddtree.kept_slots(acc, window)
    ddtree.compact_kv(acc, window, [torch.randn(bs * q + 5, 2, 8, device=dev) for _ in range(2)])
    ddtree.gather_hidden(acc, torch.randn(bs * q, 40, device=dev))


def main() -> None:
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for bs, depth, vocab, budget in ((3, 4, 1000, 63), (2, 15, 5000, 1023), (2, 3, 7, 16)):
            x = torch.randn(bs, depth + 1, vocab + 2, device=dev, generator=g).to(dtype)
            x = x[:, 1:, 1 : vocab + 1]
            x[0, 0, 3] = float("nan")
            roots = torch.randint(0, vocab, (bs,), device=dev, generator=g)
            prefix = torch.randint(0, 50, (bs,), device=dev, generator=g)
            tree = ddtree.build_tree(x, roots, prefix, budget=budget, topk=min(budget, 40))
            tree.sglang_custom_mask(prefix)
            round_kernels(tree, dtype, vocab, g)
        # K = B: the parallel selection raises its threshold and compacts its store.
        x = torch.randn(2, 8, 3000, device=dev, generator=g).to(dtype)
        z = torch.zeros(2, dtype=torch.int64, device=dev)
        ddtree.build_tree(x, z, z, budget=255)
        # All-equal rows: the tie fallbacks (radix select, id-ordered collect), the
        # selection's tie ranks, and its fall back to the best-first warp.
        for shape, budget in (((2, 2, 20000), 255), ((2, 15, 2), 1023), ((1, 4, 1000), 1023)):
            x = torch.zeros(shape, device=dev, dtype=dtype)
            ddtree.build_tree(x, z[: shape[0]], z[: shape[0]], budget=budget)
        # More rows than a wave, in the fast grade (maxima >= 8): stage 1 in half blocks,
        # its queued runs, and (all-equal rows) the queue's overflow.
        z = torch.zeros(10, dtype=torch.int64, device=dev)
        x = torch.randn(10, 15, 5000, device=dev, generator=g).mul(2.0).add(12.0).to(dtype)
        ddtree.build_tree(x, z, z, budget=63)
        flat = torch.full((10, 15, 40000), 12.0, device=dev, dtype=dtype)
        ddtree.build_tree(flat, z, z, budget=15)
    # A Stepper round with its readback kernel into mapped pinned memory.
    stepper = ddtree.Stepper(max_batch=3, budget=63, depth=4, vocab=1000, device=dev)
    x = torch.randn(3, 4, 1000, device=dev, generator=g)
    z = torch.zeros(3, dtype=torch.int64, device=dev)
    stepper.step(x, z, z)
    stepper.accept(torch.randn(3, 64, 1000, device=dev, generator=g), temperature=1.0)
    assert stepper.readback(wait=True)["bonus"].shape == (3,)
    out_of_range(dev)
    partials(dev, g)
    shard_accept(dev, g)
    attention(dev)
    torch.cuda.synchronize()
    print("gpu_small: ok")


def partials(dev, g) -> None:
    """Stage 1 as parts and their merge (`ddtree._partials`): uneven shards, a part shorter
    than K (padded lists), a NaN in one part, all -inf parts, every dtype."""
    from ddtree import _partials

    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = torch.randn(2, 3, 9000, device=dev, generator=g).to(dtype)
        x[0, 1, 8990] = float("nan")
        x[1, 2, :5000] = float("-inf")
        shards = [x[:, :, :30].contiguous(), x[:, :, 30:].contiguous()]
        _partials.candidates(shards, 64, 4096)
        _partials.candidates([x], 900, 1024)  # 9 parts of 900: near the merge's room


def shard_accept(dev, g) -> None:
    """The vocab-parallel accept's kernels (`ddtree._vocab_parallel`): two shards' keys, one
    a strided view, greedy and sampled, then the walk along them."""
    from ddtree import _buffers, _sampling
    from ddtree import _vocab_parallel as vp

    x = torch.randn(2, 4, 1000, device=dev, generator=g)
    tree = ddtree.build_tree(x, [1, 2], [3, 4], budget=15)
    target = torch.randn(2, 16, 1000, device=dev, generator=g).bfloat16()
    target[1, 2, 700] = float("nan")
    for state in (None, _sampling.SamplingState(2, torch.device(dev), 7)):
        if state is not None:
            state.load(2, 0.8, None, None)
        left = vp.shard_keys(target[:, :, :600], 0, 1000, state)
        right = vp.shard_keys(target[:, :, 600:].contiguous(), 600, 1000, state)
        every = torch.stack([left, right])
        vp.walk_keys(tree, _buffers.new_acceptance(2, tree.depth, torch.device(dev)), every, state)


def out_of_range(dev) -> None:
    """The commit kernels and the accept with indices out of range in one request each:
    memcheck must see no access outside the tensors."""
    from test_gpu_bounds import BAD, copy_acc, guarded_caches, round_on, window

    tree, target, acc = round_on(dev)
    slots = acc.batch_size * tree.width + 40
    w = window(dev, slots)
    w[2, 0], w[4, 1] = BAD, -5
    _, caches = guarded_caches(dev, slots)
    bad = copy_acc(acc)
    bad.accepted_nodes[1, 1] = 10**6
    ddtree.kept_slots(bad, w, num_slots=slots)
    ddtree.compact_kv(bad, w, caches)
    ddtree.gather_hidden(bad, torch.randn(acc.batch_size * tree.width, 64, device=dev))
    fields = {n: getattr(tree, n).clone() for n in tree.__dataclass_fields__}
    fields["first_child"][3, 0] = BAD
    acc = ddtree.accept_tree(ddtree.Tree(**fields), target, temperature=1.0)
    assert bad.status.tolist()[1:3] == [ddtree.STATUS_NODE_OUT_OF_RANGE, 6]
    assert acc.status.tolist()[3] == ddtree.STATUS_BAD_TREE_LINK


def attention(dev) -> None:
    """The tree attention kernels (check, blocks with cp.async stages, merge) on MLA and GQA
    shapes with ragged paged prefixes and one bad page."""
    from attention_cases import make_case

    for case in (
        {"mla": True, "hq": 8, "dqk": 576, "prefix": (300, 0), "page_size": 1},
        {"hq": 9, "hkv": 3, "dqk": 64, "prefix": (33, 170), "page_size": 16},
        {"hq": 8, "hkv": 2, "dqk": 128, "prefix": (1000, 5)},
        {"hq": 4, "hkv": 4, "dqk": 256, "prefix": (64, 65), "dtype": torch.float16},
    ):
        c = make_case(device=dev, **case)
        ddtree.tree_attention(**c, return_lse=True)
    # The Stepper's own workspace (the engine's launch path), MLA with V a view of K.
    stepper = ddtree.Stepper(max_batch=2, budget=15, depth=4, vocab=50, device=dev)
    c = make_case(device=dev, mla=True, hq=8, dqk=576, prefix=(2000, 7))
    stepper.step(torch.randn(2, 4, 50, device=dev), [0, 1], c["prefix_lens"])
    stepper.tree_attention(**{k: v for k, v in c.items() if k != "tree"}, return_lse=True)
    c = make_case(device=dev, hq=4, hkv=2, prefix=(40, 9), page_size=16)
    c["kv_indices"][0] = 10**6
    status = torch.zeros(2, dtype=torch.int32, device=dev)
    ddtree.tree_attention(**c, status=status)
    assert status.tolist() == [ddtree.STATUS_SLOT_OUT_OF_RANGE, 0]


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["attention"]:  # the attention kernels alone (the portable path's run)
        attention("cuda")
        torch.cuda.synchronize()
        print("gpu_small attention: ok")
    else:
        main()
