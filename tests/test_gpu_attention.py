"""The CUDA tree verify attention against the dense float64 reference (random cases across
MLA and GQA shapes, page sizes, ragged and long prefixes, shuffled pages, strided views,
real trees with pads), in a captured graph, without allocation, and with a bad page.

Marked `gpu`: skipped without CUDA.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import ddtree
from attention_cases import dense_reference, make_case

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = "cuda"


def random_case(rng: np.random.Generator, seed: int) -> dict:
    """One random case of either family."""
    mla = bool(rng.random() < 0.4)
    if mla:
        shape = {"mla": True, "hq": int(rng.choice([8, 16, 32, 64, 128])), "dqk": 576}
    else:
        hkv = int(rng.choice([1, 2, 3, 4, 8]))
        ratio = int(rng.choice([1, 2, 3, 4, 8]))
        shape = {"hq": hkv * ratio, "hkv": hkv, "dqk": int(rng.choice([64, 128, 256]))}
    bs = int(rng.integers(1, 4))
    choices = [0, 1, 2, 7, 31, 64, 100, 257, 1000, 3001]
    prefix = tuple(int(rng.choice(choices)) for _ in range(bs))
    return make_case(
        bs=bs,
        budget=int(rng.choice([7, 15, 31, 63])),
        prefix=prefix,
        page_size=int(rng.choice([1, 16])),
        dtype=torch.bfloat16 if rng.random() < 0.6 else torch.float16,
        device=DEV,
        strided_q=bool(rng.random() < 0.3),
        index_dtype=torch.int32 if rng.random() < 0.5 else torch.int64,
        seed=seed,
        **shape,
    )


def check(c, what):
    out, lse = ddtree.tree_attention(**c, return_lse=True)
    want, want_lse = dense_reference(c)
    err = float((out.cpu().double() - want).norm() / want.norm())
    lse_err = float((lse.cpu().double() - want_lse).abs().max())
    assert err <= 5e-3 and lse_err <= 1e-2, (what, err, lse_err)
    return err


@pytest.mark.parametrize("hq", [8, 16, 128])
@pytest.mark.parametrize("prefix", [(0, 257), (3001,)])
def test_mla_with_v_copied_out_of_k_equals_v_as_a_view_of_k(hq, prefix):
    # V a view of K takes the kernel that reads the values from its K tiles; the same
    # numbers in a separate V tensor take the general one. Both match the reference, and
    # each other to the bf16 rounding of the output.
    c = make_case(device=DEV, hq=hq, dqk=576, mla=True, prefix=prefix, bs=len(prefix),
                  budget=31, seed=hq)  # fmt: skip
    view = check(c, "view")
    copied = dict(c, v_cache=c["v_cache"].contiguous(), v_new=c["v_new"].contiguous())
    assert copied["v_cache"].data_ptr() != c["k_cache"].data_ptr()
    check(copied, "copied")
    a, b = ddtree.tree_attention(**c), ddtree.tree_attention(**copied)
    assert float((a.float() - b.float()).norm() / b.float().norm()) <= 4e-3, view


@pytest.mark.parametrize("prefix", [(0, 257), (3001,)])
def test_v_equal_to_all_of_k_takes_a_tile_that_covers_its_576_columns(prefix):
    # V = K with Dv = Dqk = 576: more value columns than the V-in-K tiles hold (their values
    # start at K's column 0), so the call must take the tile that loads V.
    c = make_case(device=DEV, hq=16, dqk=576, mla=True, prefix=prefix, bs=len(prefix),
                  budget=31, seed=7)  # fmt: skip
    c = dict(c, v_cache=c["k_cache"], v_new=c["k_new"])
    check(c, "v = k")


@pytest.mark.parametrize("sm_scale", [0.0, -0.07])
@pytest.mark.parametrize(
    "shape",
    [
        {"mla": True, "hq": 16, "dqk": 576},
        {"hq": 8, "hkv": 2, "dqk": 64},
        {"hq": 8, "hkv": 2, "dqk": 128},
        {"hq": 8, "hkv": 2, "dqk": 256},
    ],
    ids=["mla", "d64", "d128", "d256"],
)
def test_a_zero_or_negative_scale_equals_the_dense_reference(shape, sm_scale):
    # Any finite scale (the API's contract): a kernel that took the maximum of the raw
    # scores for that of the scaled ones would weigh the wrong keys most, and 0 times a
    # masked key's -inf is NaN.
    c = make_case(device=DEV, prefix=(0, 300), bs=2, budget=31, seed=3, **shape)
    check(dict(c, sm_scale=sm_scale), sm_scale)


@pytest.mark.parametrize("chunk", range(6))
def test_random_cases_equal_the_dense_reference(chunk):
    """6 x 55 = 330 random cases."""
    rng = np.random.default_rng(1000 + chunk)
    worst = 0.0
    for i in range(55):
        seed = chunk * 100 + i
        worst = max(worst, check(random_case(rng, seed), seed))
    print(f"\nchunk {chunk}: worst relative L2 {worst:.2e}")


@pytest.mark.parametrize(
    "case",
    [
        {"mla": True, "hq": 8, "dqk": 576, "prefix": (65536,), "bs": 1, "budget": 63},
        {"hq": 32, "hkv": 8, "dqk": 128, "prefix": (70001, 3), "bs": 2, "budget": 31},
        {"hq": 9, "hkv": 3, "dqk": 64, "prefix": (65537,), "bs": 1, "page_size": 16},
    ],
    ids=["mla-64k", "gqa-70k-ragged", "smollm-64k-paged"],
)
def test_long_prefixes(case):
    check(make_case(device=DEV, **case), case)


@pytest.mark.parametrize(
    "dims, tile", [((576, 512), "d576vk"), ((128, 128), "d128"), ((64, 64), "d64")]
)
def test_compute_capability_9_takes_the_hopper_kernel_unless_told_portable(dims, tile):
    """The tests of this file run twice on the H200 (tests/gpu_run.sh): as is, through the
    sm_90a kernel, and with DDTREE_ATTENTION=portable, through the sm_120 one."""
    hkv = 1 if dims[0] == 576 else 2
    ws = ddtree.AttentionWorkspace(
        DEV, max_batch=2, q_nodes=16, hq=8, hkv=hkv, dqk=dims[0], dv=dims[1]
    )
    portable = os.environ.get("DDTREE_ATTENTION") in ("portable", "sm120")
    hopper = torch.cuda.get_device_capability() == (9, 0) and not portable
    assert ws.tile == ("sm90a_" if hopper else "") + tile


def test_gpu_equals_the_cpu_path():
    c = make_case(device=DEV, hq=8, hkv=2, dqk=128, prefix=(513, 77), page_size=16)
    cpu = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
    cpu["tree"] = ddtree.Tree(
        **{n: getattr(c["tree"], n).cpu() for n in c["tree"].__dataclass_fields__}
    )
    got = ddtree.tree_attention(**c).cpu().double()
    want = ddtree.tree_attention(**cpu).double()
    assert float((got - want).norm() / want.norm()) <= 5e-3


def test_captured_replays_equal_eager_calls_and_allocate_nothing():
    c = make_case(device=DEV, hq=16, hkv=1, dqk=576, mla=True, prefix=(3000,), bs=1)
    rows, hq, dv = c["q"].shape[0], c["q"].shape[1], c["v_new"].shape[2]
    ws = ddtree.AttentionWorkspace(
        DEV, max_batch=1, q_nodes=c["tree"].width, hq=hq, hkv=1, dqk=576, dv=dv
    )
    assert ws.splits(1) > 1  # the merge kernel runs too
    out = torch.empty(rows, hq, dv, dtype=c["q"].dtype, device=DEV)
    lse = torch.empty(rows, hq, device=DEV)
    kw = dict(c, out=out, return_lse=True, lse_out=lse, workspace=ws)
    ddtree.tree_attention(**kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ddtree.tree_attention(**kw)
    inputs = []
    for seed in range(3):
        g = torch.Generator(device=DEV).manual_seed(seed)
        inputs.append(
            (
                torch.randn(c["q"].shape, device=DEV, generator=g).to(c["q"].dtype),
                torch.randn(c["k_cache"].shape, device=DEV, generator=g).to(c["q"].dtype),
            )
        )
    results = [(torch.empty_like(out), torch.empty_like(lse)) for _ in inputs]
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    for (q, k), (o, s) in zip(inputs, results, strict=True):
        c["q"].copy_(q)
        c["k_cache"].copy_(k)
        graph.replay()
        o.copy_(out)
        s.copy_(lse)
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before
    for (q, k), (o, s) in zip(inputs, results, strict=True):
        c["q"].copy_(q)
        c["k_cache"].copy_(k)
        eager, eager_lse = ddtree.tree_attention(**c, return_lse=True, workspace=ws)
        assert torch.equal(o, eager) and torch.equal(s, eager_lse)


@pytest.mark.parametrize(
    "shape",
    [
        {"mla": True, "hq": 16, "dqk": 576, "bs": 1, "prefix": (3000,)},  # d576vk, splits
        {"hq": 8, "hkv": 2, "dqk": 128, "bs": 2, "prefix": (2000, 70000)},
        {"hq": 9, "hkv": 3, "dqk": 64, "bs": 3, "prefix": (5000, 17, 900), "page_size": 16},
    ],
    ids=["mla", "gqa128", "gqa64"],
)
def test_peaky_scores_move_the_running_max_late_and_still_match(shape):
    """Queries scaled 12x make scores spread over tens of units (base 2), so a later tile
    passes the running max by more than the lazy rescale's slack of 2^8 many times: the
    rescale of accumulators already holding values runs, not only the first tile's."""
    c = make_case(device=DEV, seed=7, **shape)
    c["q"].mul_(12)
    s = ddtree.tree_attention(**c, return_lse=True)[1]
    assert float(s.max() - s.min()) > 16  # the rows' scales really spread
    check(c, shape)


def test_a_bad_page_fails_one_request_and_the_context_lives():
    c = make_case(device=DEV, bs=3, prefix=(40, 9, 17), page_size=16, hq=4, hkv=2)
    c["kv_indices"][int(c["kv_indptr"][1])] = 10**6  # request 1's first page
    status = torch.full((3,), -1, dtype=torch.int32, device=DEV)
    out = torch.full((c["q"].shape[0], 4, c["v_new"].shape[2]), 7.0, device=DEV).bfloat16()
    ddtree.tree_attention(**c, out=out, status=status)
    torch.cuda.synchronize()
    assert status.tolist() == [0, ddtree.STATUS_SLOT_OUT_OF_RANGE, 0]
    q_nodes = c["tree"].width
    assert (out[q_nodes : 2 * q_nodes] == 7.0).all()
    good = make_case(device=DEV, bs=3, prefix=(40, 9, 17), page_size=16, hq=4, hkv=2)
    want, _ = dense_reference(good)
    for r in (0, 2):
        rows = slice(r * q_nodes, (r + 1) * q_nodes)
        err = (out[rows].cpu().double() - want[rows]).norm() / want[rows].norm()
        assert float(err) <= 5e-3
    assert float(torch.ones(3, device=DEV).sum()) == 3.0


def test_a_whole_round_with_tree_attention_in_one_graph():
    """Stepper.step -> a verify forward whose attention is tree_attention -> Stepper.accept,
    captured in the caller's own graph; replays on new drafts equal a second Stepper run
    eagerly on the same values."""
    bs, depth, vocab, budget, hq, hkv, d, plen = 4, 6, 300, 63, 8, 2, 64, 100
    q_nodes = budget + 1
    g = torch.Generator(device=DEV).manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, device=DEV, generator=g).to(torch.bfloat16)

    x, roots = rnd(bs, depth, vocab) * 3, torch.randint(0, vocab, (bs,), device=DEV, generator=g)
    prefix = torch.full((bs,), plen, device=DEV)
    emb_q, emb_k, emb_v = rnd(vocab, hq, d), rnd(vocab, hkv, d), rnd(vocab, hkv, d)
    pool_k, pool_v = rnd(bs * plen + 7, hkv, d), rnd(bs * plen + 7, hkv, d)
    indptr = torch.arange(0, bs * plen + 1, plen, device=DEV, dtype=torch.int32)
    indices = torch.randperm(bs * plen + 7, device=DEV, generator=g)[: bs * plen].to(torch.int32)
    unembed = torch.randn(hq * d, vocab, device=DEV, generator=g)
    ws = ddtree.AttentionWorkspace(DEV, max_batch=bs, q_nodes=q_nodes, hq=hq, hkv=hkv, dqk=d, dv=d)

    def round_(stepper, out, own_workspace=False):
        """The captured Stepper attends with its engine's workspace, the eager one with the
        functional API's: the same kernel and splits, so the same bits."""
        tree = stepper.step(x, roots, prefix)
        ids = tree.verify_ids.flatten()
        kv = (emb_q[ids], emb_k[ids], emb_v[ids], pool_k, pool_v, indptr, indices, prefix)
        if own_workspace:
            stepper.tree_attention(*kv, sm_scale=d**-0.5, out=out)
        else:
            ddtree.tree_attention(*kv, tree, sm_scale=d**-0.5, out=out, workspace=ws)
        logits = (out.view(bs * q_nodes, -1).float() @ unembed).view(bs, q_nodes, vocab)
        return stepper.accept(logits)

    def new_stepper():
        return ddtree.Stepper(max_batch=bs, budget=budget, depth=depth, vocab=vocab, device=DEV)

    stepper, out = new_stepper(), torch.empty(bs * q_nodes, hq, d, device=DEV).bfloat16()
    round_(stepper, out, own_workspace=True)  # makes the engine's workspace
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        acc = round_(stepper, out, own_workspace=True)
    assert len(stepper._engine.attention_workspaces()) == 1
    ref, ref_out = new_stepper(), torch.empty_like(out)
    for seed in range(4):
        x.copy_(rnd(bs, depth, vocab) * 3)
        roots.copy_(torch.randint(0, vocab, (bs,), device=DEV, generator=g))
        graph.replay()
        eager = round_(ref, ref_out)
        assert torch.equal(out, ref_out), seed
        for name in ("accept_len", "accepted_tokens", "bonus"):
            assert torch.equal(getattr(acc, name), getattr(eager, name)), (seed, name)
    host = stepper.readback(wait=True)
    assert torch.equal(host["accepted_tokens"], acc.accepted_tokens.cpu())


def test_a_stepper_attends_only_with_a_workspace_made_outside_the_capture():
    """Inside a capture the engine may not allocate: an unprepared head shape is refused
    (naming prepare/attention_workspace) and nothing is launched; prepared, the captured call
    replays what the functional API computes."""
    c = make_case(device=DEV, bs=2, budget=15, hq=8, hkv=2, dqk=128, prefix=(300, 5000))
    stepper = ddtree.Stepper(max_batch=2, budget=15, depth=4, vocab=50, device=DEV)
    g = torch.Generator(device=DEV).manual_seed(1)
    tree = stepper.step(torch.randn(2, 4, 50, device=DEV, generator=g), c["tree"].verify_ids[:, 0],
                        c["prefix_lens"])  # fmt: skip
    args = {k: v for k, v in c.items() if k != "tree"}
    out = torch.empty(c["q"].shape[0], 8, 128, dtype=c["q"].dtype, device=DEV)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="no workspace.*prepare_attention"):
        with torch.cuda.graph(graph):
            stepper.tree_attention(**args, out=out)
    stepper.prepare_attention(hq=8, hkv=2, dqk=128, dv=128)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        stepper.tree_attention(**args, out=out)
    graph.replay()
    want = ddtree.tree_attention(**dict(c, tree=tree))
    assert torch.equal(out, want)
