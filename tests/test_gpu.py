"""The GPU build (SPEC stages 1–3): kernels == the Rust CPU path, capture, no sync, no alloc.

Marked `gpu`: skipped without CUDA. Run on the lent H200 by tests/gpu_run.sh.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import KINDS, draft_logits
from test_parity import TREE_FIELDS

import ddtree
from ddtree import _api, _buffers, _cuda, reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

BUDGETS = (1, 2, 16, 31, 32, 33, 64, 255, 1023)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DEV = "cuda"


def random_case(rng, case: int):
    kind = KINDS[case % len(KINDS)]
    budget = BUDGETS[case % len(BUDGETS)] if case % 3 else int(rng.integers(1, 300))
    depth = int(rng.integers(1, 16))
    vocab = int(rng.choice([2, 7, 64, 300, 1000, 5000]))
    bs = int(rng.integers(1, 9))
    topk = None if case % 4 else int(rng.integers(1, 40))
    if case % 97 == 5:
        vocab, bs, depth = 163840, 2, 3
    if case % 89 == 7:
        vocab, bs, depth = 151936, 2, 2
    return kind, (bs, depth, vocab), budget, topk, DTYPES[case % 3]


def make_inputs(rng, kind, shape, dtype, strided: bool, nan_rows: bool):
    bs, depth, vocab = shape
    if strided:  # a view with a leading row dropped and a padded vocabulary
        big = draft_logits(rng, (bs, depth + 1, vocab + 3), kind, dtype)
        x = big[:, 1:, 2 : 2 + vocab]
    else:
        x = draft_logits(rng, shape, kind, dtype)
    if nan_rows and bs > 1:
        x[bs - 1, depth - 1, vocab // 2] = float("nan") if rng.integers(2) else float("inf")
    roots = torch.from_numpy(rng.integers(0, vocab, size=bs))
    prefix = torch.from_numpy(rng.integers(0, 9000, size=bs))
    return x, roots, prefix


def assert_z_within_one_ulp(x: np.ndarray, lp_cpu: np.ndarray, lp_gpu: np.ndarray) -> None:
    """LP = fp32(TV - Z): a one-ulp change of Z moves every LP of the row by about ulp(Z)
    (many ulps of a small LP). So the rows may differ by at most ulp(Z) plus the rounding of
    the two subtractions, Z taken from the reference."""
    for d in range(x.shape[0]):
        finite = np.isfinite(lp_cpu[d])
        z = reference.logsumexp(x[d])
        diff = np.abs(lp_cpu[d][finite].astype(np.float64) - lp_gpu[d][finite])
        tol = np.spacing(np.abs(z)) + np.spacing(np.abs(lp_cpu[d][finite]))
        assert (diff <= tol).all(), (d, diff.max(), tol.min())


def compare(cpu: ddtree.Tree, gpu: ddtree.Tree, x, roots, prefix, budget) -> int:
    """Asserts GPU == CPU bit for bit; returns how many requests had Z one ulp apart
    (SPEC allows it), whose trees are then checked against the reference built on the GPU's
    log-probs."""
    g = {name: getattr(gpu, name).cpu() for name in gpu.__dataclass_fields__}
    assert torch.equal(g["topk_ids"], cpu.topk_ids)
    assert torch.equal(g["status"], cpu.status)
    lp_c, lp_g = cpu.topk_logprobs.numpy(), g["topk_logprobs"].numpy()
    same = (lp_c.view(np.int32) == lp_g.view(np.int32)).all(axis=(1, 2))
    rows = torch.from_numpy(same)
    for name in TREE_FIELDS:
        want, got = getattr(cpu, name)[rows], g[name][rows]
        if want.dtype == torch.float64:
            want, got = want.view(torch.int64), got.view(torch.int64)
        assert torch.equal(got, want), name
    xs = x.float().numpy()
    for b in np.flatnonzero(~same):
        assert_z_within_one_ulp(xs[b], lp_c[b], lp_g[b])
        c = reference.candidates(xs[b], lp_g.shape[2])
        nodes = reference.select(lp_g[b], c.eligible, budget)
        t = reference.emit(nodes, c.ids, int(roots[b]), int(prefix[b]), budget)
        for name, want in t.items():
            got = g[name][b].numpy()
            if want.dtype == np.float64:
                want, got = want.view(np.int64), got.view(np.int64)
            np.testing.assert_array_equal(got, want, err_msg=name)
    return int((~same).sum())


@pytest.mark.parametrize("chunk", range(10))
def test_kernels_equal_the_cpu_path_on_random_batches(chunk):
    """10 chunks x 110 = 1100 random batches."""
    rng = np.random.default_rng(4000 + chunk)
    z_diffs = 0
    for case in range(110):
        kind, shape, budget, topk, dtype = random_case(rng, case)
        x, roots, prefix = make_inputs(rng, kind, shape, dtype, case % 5 == 1, case % 7 == 0)
        cpu = ddtree.build_tree(x, roots, prefix, budget=budget, topk=topk)
        gpu = ddtree.build_tree(x.to(DEV), roots.to(DEV), prefix.to(DEV), budget=budget, topk=topk)
        z_diffs += compare(cpu, gpu, x, roots, prefix, budget)
    print(f"requests with Z one ulp apart: {z_diffs}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("top", [None, 4.0, 3.9, 5.5, -25.5, -25.0])
def test_z_within_one_ulp_where_it_is_small(dtype, top):
    """Log-probability rows (Z near 0, so an ulp of Z is tiny), and the same rows moved so
    that the maximum sits at an edge of fixed_sum.cuh's fast grade (4.0, -25.5), inside it
    (5.5) or inside the precise one (3.9, -25.0): half of them with most tokens tied far
    below the top."""
    rng = np.random.default_rng(77)
    x, roots, prefix = make_inputs(rng, "logprob", (4, 15, 151936), torch.float32, False, False)
    if top is not None:
        x = x - x.amax(dim=2, keepdim=True) + top
    x = x.to(dtype)
    cpu = ddtree.build_tree(x, roots, prefix, budget=63)
    gpu = ddtree.build_tree(x.to(DEV), roots.to(DEV), prefix.to(DEV), budget=63)
    print(f"requests with Z one ulp apart: {compare(cpu, gpu, x, roots, prefix, 63)}")


def tree_with_stages(x, roots, prefix, budget, topk, stages: int) -> ddtree.Tree:
    """The GPU build with launch_build's stage bits: 7 | 8 forces the selection onto the
    best-first warp, 7 | 16 stage 1 onto one block a row."""
    bs, depth, vocab = x.shape
    k = _api.k_of(budget, vocab, topk)
    tree = _buffers.new_tree(bs, depth, k, budget, x.device)
    scratch = _cuda.new_scratch(bs * depth, x.device)
    _cuda.launch_build(tree, scratch, x, roots, prefix, budget, k, stages=stages)
    return tree


def assert_same_tree(a: ddtree.Tree, b: ddtree.Tree) -> None:
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if x.dtype == torch.float64:
            x, y = x.view(torch.int64), y.view(torch.int64)
        assert torch.equal(x, y), name


@pytest.mark.parametrize("chunk", range(3))
def test_parallel_selection_equals_the_best_first_warp(chunk):
    """The two selection kernels on the same stage-1 results: 3 x 100 random batches, the
    parallel search forced (stage bit 32) where small budgets would take the warp."""
    rng = np.random.default_rng(9000 + chunk)
    for case in range(100):
        kind, shape, budget, topk, dtype = random_case(rng, case)
        x, roots, prefix = make_inputs(rng, kind, shape, dtype, case % 5 == 1, case % 7 == 0)
        x, roots, prefix = x.to(DEV), roots.to(DEV), prefix.to(DEV)
        parallel = tree_with_stages(x, roots, prefix, budget, topk, 7 | 32)
        assert_same_tree(parallel, tree_with_stages(x, roots, prefix, budget, topk, 7 | 8))
        # The launcher's own choice (the warp up to B = 31) builds the same tree.
        assert_same_tree(parallel, ddtree.build_tree(x, roots, prefix, budget=budget, topk=topk))


@pytest.mark.parametrize("chunk", range(3))
def test_stage1_over_a_cluster_equals_one_block_a_row(chunk):
    """Few rows (at most 16 on the H200: every row's cluster of 8 blocks on the GPU at once)
    of V >= 4096 and K <= 256 take the clustered stage-1 kernel; bit for bit the one-block
    kernel's tree, over 3 x 60 random batches:
    every kind (ties across the blocks' chunks, all-equal rows that overflow a chunk's tie
    store), dtype, strided views and NaN/+inf rows (the cases of K above 256 take one
    block a row both ways)."""
    rng = np.random.default_rng(7000 + chunk)
    for case in range(60):
        kind, _, budget, topk, dtype = random_case(rng, case)
        vocab = int(rng.choice([4096, 5000, 8200, 40000, 151936]))
        bs = int(rng.integers(1, 3))
        shape = (bs, int(rng.integers(1, 16 // bs + 1)), vocab)
        x, roots, prefix = make_inputs(rng, kind, shape, dtype, case % 5 == 1, case % 7 == 0)
        x, roots, prefix = x.to(DEV), roots.to(DEV), prefix.to(DEV)
        clustered = ddtree.build_tree(x, roots, prefix, budget=budget, topk=topk)
        assert_same_tree(clustered, tree_with_stages(x, roots, prefix, budget, topk, 7 | 16))


@pytest.mark.parametrize("chunk", range(3))
def test_stage1_in_half_blocks_equals_whole_blocks(chunk):
    """More rows than a wave of whole blocks (over 132 on the H200) with K <= 256 take half
    blocks (512 threads, two an SM: launch::candidate_threads); bit for bit the whole
    blocks' tree, over 3 x 12 random batches: every kind, dtype, strided views and
    NaN/+inf rows, in both normaliser grades. Where two half blocks do not fit an SM (sm_120)
    both builds take whole blocks. Against the previous kernels: gpu_run.sh's build-ab
    digests (tests/gpu_stage1_digest.py)."""
    rng = np.random.default_rng(7500 + chunk)
    for case in range(12):
        kind, _, _, topk, dtype = random_case(rng, case)
        budget = int(rng.choice([1, 15, 63, 255]))
        vocab = int(rng.choice([300, 4096, 5000, 40000]))
        shape = (int(rng.integers(10, 20)), 15, vocab)
        x, roots, prefix = make_inputs(rng, kind, shape, dtype, case % 5 == 1, case % 7 == 0)
        if case % 2:  # maxima >= 8: the fast grade, its loop and its queued runs
            x.mul_(2).add_(12)  # in place: a strided view stays one
        x, roots, prefix = x.to(DEV), roots.to(DEV), prefix.to(DEV)
        halves = ddtree.build_tree(x, roots, prefix, budget=budget, topk=topk)
        assert_same_tree(halves, tree_with_stages(x, roots, prefix, budget, topk, 7 | 16))


@pytest.mark.parametrize("bs", [1, 16])
def test_the_diagnostics_buffer_leaves_the_build_as_it_was(bs):
    """Stage 1 with and without the stage-1 diagnostics slots (`bench_gpu.stage1_clocks`:
    half blocks at bs = 16; at bs = 1 whole blocks, the clustered kernel keeping no slots):
    the same tree, bit for bit, on every kind and dtype. A release build writes no slot; a
    diagnostics build (DDTREE_STAGE1_CLOCKS) a start and an end on every row, and phases
    that add up to the row."""
    from ddtree import bench_gpu

    rng = np.random.default_rng(7700 + bs)
    for case, dtype in enumerate(DTYPES * 2):
        kind = KINDS[case % len(KINDS)]
        budget = (63, 255)[case % 2]
        x, roots, prefix = make_inputs(rng, kind, (bs, 15, 40000), dtype, case == 1, False)
        x, roots, prefix = x.to(DEV), roots.to(DEV), prefix.to(DEV)
        plain = tree_with_stages(x, roots, prefix, budget, None, 7 | 16)
        k = _api.k_of(budget, x.shape[2], None)
        tree = _buffers.new_tree(bs, 15, k, budget, x.device)
        scratch = _cuda.new_scratch(bs * 15, x.device)
        phases = bench_gpu.stage1_clocks(tree, scratch, x, roots, prefix, budget, k)
        _cuda.launch_build(tree, scratch, x, roots, prefix, budget, k, stages=6)
        assert_same_tree(plain, tree)
        if phases is None:
            continue
        print(f"case {case}: a row {phases['row_cycles']:.0f} cycles, {phases['taken']}")
        assert phases["rows"] == bs * 15 and phases["taken"]["write"] == bs * 15
        assert sum(phases["cycles"].values()) == pytest.approx(phases["row_cycles"])
        assert phases["span_us"] > 0 and phases["row_us"] > 0


@pytest.mark.parametrize("budget, topk, store", [(63, None, 8), (255, None, 8), (63, 8, 16)])
def test_the_first_threshold_spares_the_raises(budget, topk, store):
    """On DFlash-like rows the selection starts from the greedy chain's departures: the
    parallel path runs with no threshold raise and a store of a few budgets (from -inf the
    store overflowed at the third level and t was raised), and the tree is still the CPU
    path's. With few candidates a depth (top-k 8) the departures bound the B-th score less
    tightly: the store is larger (about 11 budgets on these rows), still without a raise."""
    from ddtree import bench_gpu

    x = bench_gpu.peaked_logits(4, 15, 151936, 3, DEV)
    roots = torch.randint(0, 151936, (4,), device=DEV)
    prefix = torch.randint(0, 4000, (4,), device=DEV)
    stepper = ddtree.Stepper(
        max_batch=4, budget=budget, depth=15, vocab=151936, topk=topk, device=DEV
    )
    tree = stepper.step(x, roots, prefix)
    k = _api.k_of(budget, 151936, topk)
    scratch = {n: t[: 4 * 15] for n, t in stepper._scratch.items()}
    stats = bench_gpu.selection_stats(tree, scratch, x, roots, prefix, budget, k)
    assert stats["parallel"] == 1.0
    assert stats["prunes"] == 0
    assert stats["store"] <= store * budget
    cpu = ddtree.build_tree(x.cpu(), roots.cpu(), prefix.cpu(), budget=budget, topk=topk)
    compare(cpu, tree, x.cpu(), roots.cpu(), prefix.cpu(), budget)


@pytest.mark.parametrize(
    "shape, budget",
    [
        ((2, 3, 64), 1023),  # depth 2 holds 4096 tied paths: no threshold fits the store
        ((2, 15, 2), 1023),  # 2^d tied paths per depth: the B-th score is tied 1024 ways
        ((2, 15, 3), 255),
        ((1, 4, 1000), 1023),
        # small budgets: ties at the B-th score settled by the store's ranks
        ((2, 15, 2), 127),
        ((2, 3, 64), 127),
        ((2, 15, 3), 63),
        ((3, 4, 1000), 31),
        ((2, 2, 7), 20),
    ],
)
def test_selection_through_ties(shape, budget):
    """All-equal rows: the parallel path's fallback, its threshold search and its tie ranks,
    against the CPU path and the best-first warp."""
    rng = np.random.default_rng(5)
    for dtype in DTYPES:
        x, roots, prefix = make_inputs(rng, "all_equal", shape, dtype, False, False)
        cpu = ddtree.build_tree(x, roots, prefix, budget=budget)
        gx, groots, gprefix = x.to(DEV), roots.to(DEV), prefix.to(DEV)
        gpu = ddtree.build_tree(gx, groots, gprefix, budget=budget)
        compare(cpu, gpu, x, roots, prefix, budget)
        assert_same_tree(gpu, tree_with_stages(gx, groots, gprefix, budget, None, 7 | 8))


@pytest.mark.parametrize("budget", [3, 40, 127, 200])
def test_negative_zero_scores_keep_their_sign(budget):
    """Rows whose one finite token is -0.0 have Z = 0 and LP = -0.0, so the paths through
    them score -0.0 (SPEC's float64 sums: -0.0 + -0.0). Selection keys order -0.0 with 0.0,
    but the scores written out keep the sign, on the CPU path and in both selections."""
    x = torch.full((2, 3, 500), float("-inf"), dtype=torch.float32)
    x[:, :, 7] = -0.0
    x[1, 1, 9] = 0.0  # a +0.0 beside it at depth 2 of request 1: two children tie at 0
    x[0, 2, :] = torch.linspace(-3.0, 0.0, 500)  # an ordinary row below two -0.0 rows
    roots = torch.tensor([1, 2])
    prefix = torch.tensor([0, 5])
    cpu = ddtree.build_tree(x, roots, prefix, budget=budget)
    gx, groots, gprefix = x.to(DEV), roots.to(DEV), prefix.to(DEV)
    gpu = ddtree.build_tree(gx, groots, gprefix, budget=budget)
    assert compare(cpu, gpu, x, roots, prefix, budget) == 0
    assert (cpu.scores[:, 1].view(torch.int64) == -(2**63)).all()  # -0.0's bits
    assert_same_tree(gpu, tree_with_stages(gx, groots, gprefix, budget, None, 7 | 8))


def test_full_mask_equals_the_cpu_path():
    rng = np.random.default_rng(3)
    x, roots, prefix = make_inputs(rng, "quantised", (3, 4, 50), torch.float32, False, False)
    cpu = ddtree.build_tree(x, roots, prefix, budget=40)
    gpu = ddtree.build_tree(x.to(DEV), roots.to(DEV), prefix.to(DEV), budget=40)
    seq = torch.tensor([0, 7, 130])
    want = cpu.sglang_custom_mask(seq)
    assert torch.equal(gpu.sglang_custom_mask(seq.to(DEV)).cpu(), want)
    out = torch.zeros(want.numel() + 64, dtype=torch.bool, device=DEV)
    gpu.sglang_custom_mask(seq.to(DEV), out=out, prefix_columns=False)
    host_out = torch.zeros(want.numel() + 64, dtype=torch.bool)
    tree_only = cpu.sglang_custom_mask(seq, out=host_out, prefix_columns=False)
    assert torch.equal(out[: want.numel()].cpu(), tree_only)
    assert not out[want.numel() :].any()


def stepper_inputs(bs=8, depth=15, vocab=151936, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(bs, depth, vocab, device=DEV, generator=g).to(torch.bfloat16)
    roots = torch.randint(0, vocab, (bs,), device=DEV, generator=g)
    prefix = torch.randint(0, 4000, (bs,), device=DEV, generator=g)
    return x, roots, prefix


def snapshot(tree: ddtree.Tree) -> dict:
    return {name: getattr(tree, name).clone() for name in tree.__dataclass_fields__}


def test_graph_capture_and_replay_match_eager():
    stepper = ddtree.Stepper(max_batch=8, budget=255, depth=15, vocab=151936, device=DEV)
    x, roots, prefix = stepper_inputs()
    stepper.step(x, roots, prefix)  # warm-up outside capture (module load)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tree = stepper.step(x, roots, prefix)
    for seed in range(1, 6):
        nx, nroots, nprefix = stepper_inputs(seed=seed)
        x.copy_(nx)
        roots.copy_(nroots)
        prefix.copy_(nprefix)
        graph.replay()
        replayed = snapshot(tree)
        eager = snapshot(stepper.step(nx, nroots, nprefix))
        for name in eager:
            assert torch.equal(replayed[name], eager[name]), (seed, name)
        cpu = ddtree.build_tree(nx.cpu(), nroots.cpu(), nprefix.cpu(), budget=255)
        assert torch.equal(replayed["topk_ids"].cpu(), cpu.topk_ids)


def test_step_never_syncs_the_host():
    stepper = ddtree.Stepper(max_batch=8, budget=255, depth=15, vocab=151936, device=DEV)
    x, roots, prefix = stepper_inputs()
    stepper.step(x, roots, prefix)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(10):
            stepper.step(x, roots, prefix)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_a_whole_round_never_syncs_or_allocates():
    # step, accept (greedy, scalar and tensor sampling parameters, an int seed), kept_slots
    # and a readback() poll: no torch sync and no allocation once the graphs are built.
    stepper = ddtree.Stepper(max_batch=8, budget=63, depth=6, vocab=1000, device=DEV)
    g = torch.Generator(device=DEV).manual_seed(3)
    x = torch.randn(8, 6, 1000, device=DEV, generator=g)
    roots = torch.randint(0, 1000, (8,), device=DEV, generator=g)
    prefix = torch.full((8,), 10, dtype=torch.int64, device=DEV)
    target = torch.randn(8, 64, 1000, device=DEV, generator=g)
    window = torch.arange(8 * 64, device=DEV).view(8, 64)
    temps = torch.full((8,), 0.7, device=DEV)
    ks = torch.full((8,), 20, dtype=torch.int64, device=DEV)

    def round_(seed):
        stepper.step(x, roots, prefix)
        stepper.accept(target)
        stepper.accept(target, 0.9, 10, 0.8, generator=seed)
        stepper.accept(target, temps, ks, None, generator=seed, readback=False)
        stepper.kept_slots(window, readback=True)
        stepper.readback()

    round_(0)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for seed in range(1, 50):
            round_(seed)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    for key in ("allocation.all.allocated", "allocated_bytes.all.allocated"):
        assert after[key] == before[key], key


def test_step_never_allocates():
    stepper = ddtree.Stepper(max_batch=8, budget=255, depth=15, vocab=151936, device=DEV)
    x, roots, prefix = stepper_inputs()
    stepper.step(x, roots, prefix)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    for _ in range(1000):
        stepper.step(x, roots, prefix)
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    for key in ("allocation.all.allocated", "allocated_bytes.all.allocated"):
        assert after[key] == before[key], key


def test_repeated_runs_are_identical():
    stepper = ddtree.Stepper(max_batch=8, budget=1023, depth=15, vocab=151936, device=DEV)
    x, roots, prefix = stepper_inputs()
    first = snapshot(stepper.step(x, roots, prefix))
    for _ in range(20):
        again = snapshot(stepper.step(x, roots, prefix))
        for name in first:
            assert torch.equal(first[name], again[name]), name


def test_gpu_limits_raise_before_launch():
    x, roots, prefix = stepper_inputs(bs=2, vocab=3000)
    with pytest.raises(ValueError, match="budget"):
        ddtree.build_tree(x, roots, prefix, budget=2000)
    with pytest.raises(ValueError, match="root_tokens"):
        ddtree.build_tree(x, roots.cpu(), prefix, budget=20)


def test_bad_requests_get_a_status_not_an_exception():
    x, roots, prefix = stepper_inputs(bs=3, vocab=3000)
    roots[1] = 5000  # outside the vocabulary
    prefix[2] = -4
    tree = ddtree.build_tree(x, roots, prefix, budget=20)
    assert tree.status.tolist() == [
        ddtree.STATUS_OK,
        ddtree.STATUS_ROOT_OUT_OF_VOCAB,
        ddtree.STATUS_NEGATIVE_PREFIX,
    ]
    assert tree.num_nodes.tolist() == [20, 0, 0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["all_equal", "quantised", "masked"])
def test_huge_ties_take_the_fallback_paths(kind, dtype):
    """Rows whose ties overflow shared memory (all equal, or few distinct values over a
    large vocabulary) take the radix select and the id-ordered collect."""
    rng = np.random.default_rng(77)
    for budget, topk in ((255, None), (1023, None), (63, 7)):
        x, roots, prefix = make_inputs(rng, kind, (3, 2, 20000), dtype, False, False)
        cpu = ddtree.build_tree(x, roots, prefix, budget=budget, topk=topk)
        gpu = ddtree.build_tree(x.to(DEV), roots.to(DEV), prefix.to(DEV), budget=budget, topk=topk)
        compare(cpu, gpu, x, roots, prefix, budget)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_largest_vocabulary(dtype):
    """V = 262144 (the issue's upper bound), the largest budget, a strided view."""
    rng = np.random.default_rng(262144)
    x, roots, prefix = make_inputs(rng, "peaked", (2, 3, 262144), dtype, True, False)
    cpu = ddtree.build_tree(x, roots, prefix, budget=1023)
    gpu = ddtree.build_tree(x.to(DEV), roots.to(DEV), prefix.to(DEV), budget=1023)
    compare(cpu, gpu, x, roots, prefix, 1023)
