"""ddtree.tree_attention on the CPU: the readable fp32 path against the dense float64
reference, across GQA and MLA shapes, page sizes, ragged and empty prefixes, strided views;
and bad input refused naming the argument."""

from __future__ import annotations

import pytest
import torch

import ddtree
from attention_cases import dense_reference, make_case

CASES = [
    {},
    {"hq": 9, "hkv": 3, "prefix": (7, 130), "page_size": 16},
    {"hq": 4, "hkv": 4, "prefix": (0, 1), "index_dtype": torch.int64},
    {"mla": True, "hq": 8, "dqk": 576, "prefix": (33, 5), "page_size": 1},
    {"mla": True, "hq": 16, "dqk": 576, "prefix": (64, 17), "page_size": 4, "budget": 31},
    {"hq": 8, "hkv": 2, "dqk": 128, "prefix": (300, 9000), "strided_q": True, "bs": 2},
]


def rel_l2(got, want):
    return float((got.double() - want).norm() / want.norm())


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cpu_path_equals_the_dense_reference(case, dtype):
    c = make_case(dtype=dtype, **case)
    out, lse = ddtree.tree_attention(**c, return_lse=True)
    want, want_lse = dense_reference(c)
    tol = 1e-6 if dtype == torch.float32 else 5e-3
    assert rel_l2(out, want) < tol
    assert float((lse.double() - want_lse).abs().max()) < 1e-4


@pytest.mark.parametrize("sm_scale", [0.0, -0.07])
@pytest.mark.parametrize("mla", [False, True])
def test_a_zero_or_negative_scale_equals_the_dense_reference(mla, sm_scale):
    # The API takes any finite scale: 0 weighs every visible key alike, a negative one
    # favours the smallest scores.
    shape = {"mla": True, "hq": 8, "dqk": 576} if mla else {"hq": 8, "hkv": 2, "dqk": 64}
    c = dict(make_case(dtype=torch.float32, prefix=(0, 40), bs=2, **shape), sm_scale=sm_scale)
    out, lse = ddtree.tree_attention(**c, return_lse=True)
    want, want_lse = dense_reference(c)
    assert rel_l2(out, want) < 1e-6
    assert float((lse.double() - want_lse).abs().max()) < 1e-4


def test_out_is_written_in_place_and_inputs_are_untouched():
    c = make_case()
    before = {k: v.clone() for k, v in c.items() if isinstance(v, torch.Tensor)}
    out = torch.zeros(c["q"].shape[0], c["q"].shape[1], c["v_new"].shape[2], dtype=torch.bfloat16)
    got = ddtree.tree_attention(**c, out=out)
    assert got is out and out.abs().sum() > 0
    for k, v in before.items():
        assert torch.equal(c[k], v), k


def test_a_strided_lse_out_is_refused():
    c = make_case()
    rows, hq = c["q"].shape[0], c["q"].shape[1]
    lse = torch.empty(rows, 2 * hq)[:, :hq]
    with pytest.raises(ValueError, match="lse_out"):
        ddtree.tree_attention(**c, return_lse=True, lse_out=lse)


def test_a_bad_page_sets_a_status_or_raises():
    c = make_case(prefix=(5, 9))
    c["kv_indices"][1] = 10**6
    with pytest.raises(ValueError, match="kv_indices"):
        ddtree.tree_attention(**c)
    status = torch.full((2,), -1, dtype=torch.int32)
    out = torch.full((c["q"].shape[0], c["q"].shape[1], c["v_new"].shape[2]), 7.0).bfloat16()
    ddtree.tree_attention(**c, out=out, status=status)
    assert status.tolist() == [ddtree.STATUS_SLOT_OUT_OF_RANGE, 0]
    q_nodes = c["tree"].width
    assert (out[:q_nodes] == 7.0).all() and not (out[q_nodes:] == 7.0).all()
    # The kernels write status[b]: a strided view is refused, naming it, before anything runs.
    strided = torch.full((4,), -1, dtype=torch.int32)[::2]
    out.fill_(7.0)
    with pytest.raises(ValueError, match="status: must be contiguous"):
        ddtree.tree_attention(**c, out=out, status=strided)
    assert (strided == -1).all() and (out == 7.0).all()


@pytest.mark.parametrize(
    "change, name",
    [
        (lambda c: c.update(k_new=c["k_new"][:, :1].expand(-1, 3, -1)), "k_new"),
        (lambda c: c.update(q=c["q"][:-1]), "q"),
        (lambda c: c.update(v_cache=c["v_cache"].half()), "v_cache"),
        (lambda c: c.update(kv_indices=c["kv_indices"].long()), "kv_indices"),
        (lambda c: c.update(kv_indptr=c["kv_indptr"][:-1]), "kv_indptr"),
        (lambda c: c.update(page_size=3), "page_size"),
        (lambda c: c.update(prefix_lens=c["prefix_lens"].int()), "prefix_lens"),
        (lambda c: c.update(tree="tree"), "tree"),
        (lambda c: c.update(sm_scale=float("nan")), "sm_scale"),
        (lambda c: c.update(q=c["q"].transpose(0, 2).contiguous().transpose(0, 2)), "q"),
        (lambda c: c.update(q=c["q"].to("meta")), "q"),
        (lambda c: c.update(k_new=c["k_new"].to("meta")), "k_new"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(change, name):
    c = make_case()
    change(c)
    with pytest.raises((ValueError, TypeError), match=name):
        ddtree.tree_attention(**c)


def test_a_cpu_stepper_attends_over_its_last_tree():
    """Stepper.tree_attention is tree_attention with the Stepper's last tree; it needs a
    step first and checks its arguments against that tree."""
    c = make_case(bs=2, budget=15, prefix=(7, 20))
    stepper = ddtree.Stepper(max_batch=2, budget=15, depth=4, vocab=50, device="cpu")
    args = {k: v for k, v in c.items() if k != "tree"}
    with pytest.raises(RuntimeError, match="call step"):
        stepper.tree_attention(**args)
    g = torch.Generator().manual_seed(3)
    tree = stepper.step(torch.randn(2, 4, 50, generator=g), [1, 2], c["prefix_lens"])
    stepper.prepare_attention(hq=4, hkv=2, dqk=64, dv=64)  # nothing to make on the CPU
    got, lse = stepper.tree_attention(**args, return_lse=True)
    want, want_lse = ddtree.tree_attention(**dict(c, tree=tree), return_lse=True)
    assert torch.equal(got, want) and torch.equal(lse, want_lse)
    with pytest.raises(ValueError, match="q: must have bs"):
        stepper.tree_attention(**dict(args, q=args["q"][:-1]))
    with pytest.raises(ValueError, match="hkv"):
        stepper.prepare_attention(hq=4, hkv=0, dqk=64, dv=64)
