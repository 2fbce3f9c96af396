"""The CUDA Stepper's Rust engine (``_core.CudaEngine``): the arguments it checks raise the
same exception, with the same message, as the CPU Stepper's Python checks, before any
launch and with nothing written; strided index vectors; a replayed graph's round is the
one the commit calls then use. Marked `gpu`: skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from conftest import raised

import ddtree

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

BS, BUDGET, DEPTH, V = 4, 15, 3, 500


def steppers():
    return {
        dev: ddtree.Stepper(max_batch=BS, budget=BUDGET, depth=DEPTH, vocab=V, device=dev)
        for dev in ("cpu", "cuda")
    }


def inputs(dev, bs=BS, depth=DEPTH, vocab=V, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(bs, depth, vocab, generator=g).to(dtype)
    roots = torch.randint(0, vocab, (bs,), generator=g)
    prefix = torch.randint(0, 50, (bs,), generator=g)
    return x.to(dev), roots.to(dev), prefix.to(dev)


def bad_steps(dev):
    x, roots, prefix = inputs(dev)
    return {
        "int logits": (x.long(), roots, prefix),
        "2-D logits": (x[:, 0], roots, prefix),
        "too deep": (inputs(dev, depth=DEPTH + 1)[0], roots, prefix),
        "batch too big": (inputs(dev, bs=BS + 1)[0], torch.cat([roots, roots[:1]]), prefix),
        "vocab too big": (inputs(dev, vocab=V + 1)[0], roots, prefix),
        "empty vocab": (x[:, :, :0], roots, prefix),
        "logits not a tensor": (x.tolist(), roots, prefix),
        "int32 roots": (x, roots.int(), prefix),
        "short roots": (x, roots[:2], prefix),
        "2-D prefix": (x, roots, prefix.view(2, 2)),
        "prefix not a tensor": (x, roots, "12"),
    }


def outcome(fn):
    return raised(fn, (TypeError, ValueError, RuntimeError))


def snapshot(stepper) -> list[torch.Tensor]:
    return [b.clone() for b in stepper._tree_bufs.blocks.values()] + [
        b.clone() for b in stepper._acc_bufs.blocks.values()
    ]


def same(a, b) -> bool:
    return all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("case", list(bad_steps("cpu")))
def test_a_bad_step_raises_what_the_cpu_stepper_raises_and_writes_nothing(case):
    s = steppers()
    for dev, stepper in s.items():
        stepper.step(*inputs(dev, seed=1))
    before = snapshot(s["cuda"])
    got = {dev: outcome(lambda dev=dev: s[dev].step(*bad_steps(dev)[case])) for dev in s}
    assert got["cuda"] is not None, "the CUDA Stepper accepted it"
    assert got["cuda"] == got["cpu"]
    torch.cuda.synchronize()
    assert same(before, snapshot(s["cuda"]))


def bad_targets(dev, tree):
    t = torch.randn(BS, tree.width, V - 7).to(dev)  # the good shape: the draft's V
    return {
        "other vocabulary": torch.randn(BS, tree.width, V).to(dev),
        "fewer nodes": t[:, :-1],
        "fewer requests": t[:-1],
        "fp64": t.double(),
        "not a tensor": 3.0,
    }


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("case", ["other vocabulary", "fewer nodes", "fewer requests", "fp64",
                                  "not a tensor"])  # fmt: skip
def test_a_bad_target_raises_what_the_cpu_stepper_raises_and_writes_nothing(case, sampled):
    s = steppers()
    trees = {dev: s[dev].step(*inputs(dev, vocab=V - 7, seed=2)) for dev in s}
    for dev in s:
        s[dev].accept(torch.randn(BS, trees[dev].width, V - 7).to(dev))
    temperature = 0.9 if sampled else None
    sampling_before = s["cuda"]._sampling.temperature.clone()
    before = snapshot(s["cuda"])
    got = {
        dev: outcome(lambda dev=dev: s[dev].accept(bad_targets(dev, trees[dev])[case], temperature))
        for dev in s
    }
    assert got["cuda"] is not None
    assert got["cuda"] == got["cpu"]
    torch.cuda.synchronize()
    assert same(before, snapshot(s["cuda"]))
    assert torch.equal(sampling_before, s["cuda"]._sampling.temperature)


def test_inputs_on_another_device_are_named():
    stepper = steppers()["cuda"]
    x, roots, prefix = inputs("cuda")
    for args, name in (
        ((x.cpu(), roots, prefix), "draft_logits"),
        ((x, roots.cpu(), prefix), "root_tokens"),
        ((x, roots, prefix.cpu()), "prefix_lens"),
    ):
        with pytest.raises(ValueError, match=f"^{name}: is on cpu, the other inputs are on cuda"):
            stepper.step(*args)


def test_strided_and_list_index_vectors_build_the_same_tree():
    stepper = steppers()["cuda"]
    x, roots, prefix = inputs("cuda", seed=3)
    want = {k: v.clone() for k, v in vars(stepper.step(x, roots, prefix)).items()}
    wide = torch.stack([roots, roots * 0 - 1], dim=1)[:, 0]  # stride 2
    assert wide.stride(0) == 2
    for r, p in ((wide, prefix), (roots.tolist(), prefix.tolist())):
        tree = stepper.step(x, r, p)
        for name, value in want.items():
            assert torch.equal(getattr(tree, name), value), name


def test_commit_calls_after_a_replay_use_the_replayed_round():
    stepper = ddtree.Stepper(max_batch=4, budget=BUDGET, depth=DEPTH, vocab=V, device="cuda")
    graphs = {}
    for bs in (2, 4):
        x, roots, prefix = inputs("cuda", bs=bs, seed=bs)
        target = torch.randn(bs, BUDGET + 1, V, device="cuda")
        graphs[bs] = (x, roots, prefix, target)
        stepper.capture(x, roots, prefix, lambda tree, t=target: t)
    window = torch.arange(2 * (BUDGET + 1), device="cuda").view(2, BUDGET + 1)
    stepper.replay(2)
    kept, release = (t.clone() for t in stepper.kept_slots(window))
    assert kept.shape == (2, DEPTH + 1)
    # The same round, eager: identical kept slots.
    x, roots, prefix, target = graphs[2]
    stepper.step(x, roots, prefix)
    stepper.accept(target)
    want_kept, want_release = stepper.kept_slots(window)
    assert torch.equal(kept, want_kept) and torch.equal(release, want_release)


def bad_windows(dev, q):
    w = torch.arange(BS * q).view(BS, q).to(dev)
    return {
        "int32": w.int(),
        "other Q": w[:, :-1].contiguous(),
        "fewer requests": w[:-1],
        "strided": torch.arange(BS * q * 2).view(BS, 2 * q).to(dev)[:, ::2],
        "1-D": w.view(-1),
        "not a tensor": w.tolist(),
    }


@pytest.mark.parametrize("call", ["kept_slots", "compact_kv"])
@pytest.mark.parametrize("case", list(bad_windows("cpu", BUDGET + 1)))
def test_a_bad_window_raises_what_the_cpu_stepper_raises(case, call):
    s = steppers()
    for dev, stepper in s.items():
        tree = stepper.step(*inputs(dev, seed=4))
        stepper.accept(torch.randn(BS, tree.width, V).to(dev))
        stepper.register_caches([torch.zeros(BS * tree.width, 8, device=dev)])
    got = {
        dev: outcome(lambda dev=dev: getattr(s[dev], call)(bad_windows(dev, BUDGET + 1)[case]))
        for dev in s
    }
    assert got["cuda"] is not None
    assert got["cuda"] == got["cpu"]


def bad_gathers(dev, q, path):
    hidden = torch.randn(BS * q, 6, device=dev)
    out = torch.empty(BS, path, 6, device=dev)
    return {
        "hidden not a tensor": (hidden.tolist(), out),
        "1-D hidden": (hidden.view(-1), out),
        "rows not a multiple of bs": (hidden[:-1], out),
        "strided hidden": (torch.randn(BS * q, 12, device=dev)[:, ::2], out),
        "out of another dtype": (hidden, out.double()),
        "out of another shape": (hidden, out[:, :-1]),
        "strided out": (hidden, torch.empty(BS, path, 12, device=dev)[..., ::2]),
    }


@pytest.mark.parametrize("case", list(bad_gathers("cpu", BUDGET + 1, DEPTH + 1)))
def test_a_bad_gather_raises_what_the_functional_gather_raises_and_writes_nothing(case):
    # The engine's checks against the Python ones of ddtree.gather_hidden on the same
    # device (their messages name the device, so a CPU Stepper's differ in that word).
    stepper = steppers()["cuda"]
    tree = stepper.step(*inputs("cuda", seed=5))
    acc = stepper.accept(torch.randn(BS, tree.width, V, device="cuda"))
    hidden, out = bad_gathers("cuda", BUDGET + 1, DEPTH + 1)[case]
    before = out.clone()
    got = outcome(lambda: stepper.gather_hidden(hidden, out))
    torch.cuda.synchronize()
    assert torch.equal(out, before)
    assert got is not None
    assert got == outcome(lambda: ddtree.gather_hidden(acc, hidden, out=out))


def test_the_engine_gathers_and_compacts_what_the_functional_api_does():
    stepper = steppers()["cuda"]
    tree = stepper.step(*inputs("cuda", seed=6))
    target = torch.randn(BS, tree.width, V, device="cuda")
    for b in range(BS):  # accept the root's first child at least
        target[b, 0, tree.verify_ids[b, 1]] = 50.0
    acc = stepper.accept(target)
    q, path = tree.width, acc.path_len
    hidden = torch.randn(BS * q, 3, 4, device="cuda").to(torch.bfloat16)
    out = torch.full((BS, path, 3, 4), 7.0, device="cuda").to(torch.bfloat16)
    got = stepper.gather_hidden(hidden, out).clone()
    assert torch.equal(got, ddtree.gather_hidden(acc, hidden))
    slots = BS * q + 9
    window = torch.randperm(slots, device="cuda")[: BS * q].view(BS, q)
    caches = [torch.randn(slots, 16, device="cuda") for _ in range(2)]
    mine = [c.clone() for c in caches]
    stepper.register_caches(mine)
    stepper.compact_kv(window, readback=True)
    ddtree.compact_kv(acc, window, caches)
    assert all(torch.equal(a, b) for a, b in zip(mine, caches, strict=True))
    host = stepper.readback(wait=True)
    assert torch.equal(host["accept_len"], acc.accept_len.cpu())
    assert (acc.accept_len >= 2).all()


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 0.8},
        {"temperature": 1.3, "top_k": 40},
        {"temperature": 1.0, "top_k": 3, "top_p": 0.5},
        {"temperature": 0.7, "top_p": 0.9},
    ],
    ids=str,
)
def test_scalar_sampling_loaded_by_the_accept_draws_what_accept_tree_draws(params):
    # Stepper.accept loads scalar parameters and the seed in its own graph; the functional
    # accept_tree fills a fresh sampling state with torch: the same draws, seed for seed.
    stepper = steppers()["cuda"]
    x, roots, prefix = inputs("cuda", seed=5)
    tree = stepper.step(x, roots, prefix)
    target = torch.randn(BS, tree.width, V, device="cuda") * 3
    for seed in range(6):
        want = ddtree.accept_tree(tree, target, generator=seed, **params)
        got = stepper.accept(target, generator=seed, **params)
        for name in ("accepted_nodes", "accept_len", "bonus"):
            assert torch.equal(getattr(got, name), getattr(want, name)), (seed, name)
    # The seed restarted the generator at (seed, 0) and the accept advanced it; without a
    # generator the state carries on.
    assert stepper._sampling.rng.tolist() == [5, 1]
    stepper.accept(target, **params)
    assert stepper._sampling.rng.tolist() == [5, 2]


TENSOR_PARAMS = {  # each dtype the engine reads, strided views, mixed with scalars
    "float32 / int64 / float32": (torch.float32, torch.int64, torch.float32),
    "float64 / int32 / float16": (torch.float64, torch.int32, torch.float16),
    "bfloat16 / float32 / float64": (torch.bfloat16, torch.float32, torch.float64),
}


@pytest.mark.parametrize("dtypes", TENSOR_PARAMS.values(), ids=TENSOR_PARAMS.keys())
def test_tensor_sampling_read_by_the_accept_draws_what_accept_tree_draws(dtypes):
    # Stepper.accept reads [bs] parameter tensors of any float/int dtype in its own graph
    # (no torch copies); accept_tree copies them into a fresh state: the same draws. The
    # values are those each dtype holds exactly, so the conversions cannot differ.
    stepper = steppers()["cuda"]
    x, roots, prefix = inputs("cuda", seed=6)
    tree = stepper.step(x, roots, prefix)
    target = torch.randn(BS, tree.width, V, device="cuda") * 3
    t_dtype, k_dtype, p_dtype = dtypes
    t = torch.tensor([0.75, 0.0, 1.5, 1.0] * 2, device="cuda").to(t_dtype)[::2]  # strided
    k = torch.tensor([3, 0, 40, 10**6], device="cuda").to(k_dtype)  # 10**6 >= V: off
    p = torch.tensor([0.5, 1.0, 0.875, 0.25], device="cuda").to(p_dtype)
    for seed in range(4):
        want = ddtree.accept_tree(tree, target, temperature=t, top_k=k, top_p=p, generator=seed)
        got = stepper.accept(target, t, k, p, generator=seed)
        for name in ("accepted_nodes", "accept_len", "bonus"):
            assert torch.equal(getattr(got, name), getattr(want, name)), (seed, name)
        mixed = stepper.accept(target, t, 40, p, generator=seed).bonus.clone()
        k40 = torch.full_like(k, 40)
        want = ddtree.accept_tree(tree, target, temperature=t, top_k=k40, top_p=p, generator=seed)
        assert torch.equal(mixed, want.bonus), seed
    assert stepper._sampling.top_k.tolist()[:BS] == [40] * BS


@pytest.mark.parametrize("case", ["short", "on the cpu", "bool"])
def test_a_bad_sampling_tensor_is_named_before_anything_changes(case):
    # The engine checks parameter tensors (shape, device, dtype) after the target and
    # before a seed is drawn from a torch.Generator or anything is written.
    s = steppers()
    trees = {dev: s[dev].step(*inputs(dev, seed=8)) for dev in s}
    target = torch.randn(BS, trees["cuda"].width, V)
    good = torch.full((BS,), 0.9)
    bad = {"short": good[:2], "on the cpu": good, "bool": good > 0}[case]
    cuda = s["cuda"]
    before = [cuda._sampling.rng.clone(), cuda._sampling.top_p.clone()]
    gen = torch.Generator().manual_seed(1)
    state = gen.get_state()
    args = (target.cuda(), good.cuda(), None, bad if case == "on the cpu" else bad.cuda())
    got = outcome(lambda: cuda.accept(*args, generator=gen))
    assert got is not None and "top_p" in got[1], got
    assert torch.equal(gen.get_state(), state)
    torch.cuda.synchronize()
    assert same(before, [cuda._sampling.rng, cuda._sampling.top_p])
    if case == "short":  # the CPU Stepper's message, word for word
        assert got == outcome(lambda: s["cpu"].accept(target, good, None, bad))


def test_a_top_k_tensor_beyond_int32_is_off():
    # A copy into int32 would wrap 2**32 + 3 to 3; the engine clamps it, so it is off.
    stepper = steppers()["cuda"]
    x, roots, prefix = inputs("cuda", seed=7)
    tree = stepper.step(x, roots, prefix)
    target = torch.randn(BS, tree.width, V, device="cuda") * 3
    t = torch.full((BS,), 2.0, device="cuda")
    huge = torch.full((BS,), 2**32 + 3, dtype=torch.int64, device="cuda")
    got = stepper.accept(target, t, huge, generator=3)
    want = ddtree.accept_tree(tree, target, temperature=t, generator=3)
    assert torch.equal(got.bonus, want.bonus)
    assert stepper._sampling.top_k.tolist()[:BS] == [2**31 - 1] * BS


def test_eager_steps_replay_one_graph_per_geometry_equal_to_plain_launches():
    # The engine's eager step is one graph launch (built once per launch geometry, its
    # nodes updated when the logits tensor changes); plain launches give the same trees.
    graph, plain = steppers()["cuda"], steppers()["cuda"]
    plain._engine.eager_graphs = False
    for seed, bs in ((6, 4), (7, 4), (8, 2), (9, 4), (10, 2)):
        x, roots, prefix = inputs("cuda", bs=bs, dtype=torch.bfloat16, seed=seed)
        a, b = graph.step(x, roots, prefix), plain.step(x, roots, prefix)
        for name in vars(a):
            assert torch.equal(getattr(a, name), getattr(b, name)), (seed, name)
    assert graph._engine.graphs == 2 and plain._engine.graphs == 0


def test_the_engine_keeps_at_most_64_step_graphs_and_rebuilds_an_evicted_one():
    stepper = ddtree.Stepper(max_batch=70, budget=7, depth=2, vocab=50, device="cuda")
    plain = ddtree.Stepper(max_batch=70, budget=7, depth=2, vocab=50, device="cuda")
    plain._engine.eager_graphs = False
    for bs in [*range(1, 71), 1, 2]:  # 70 geometries; bs 1 and 2 were evicted first
        x, roots, prefix = inputs("cuda", bs=bs, depth=2, vocab=50, seed=bs)
        a, b = stepper.step(x, roots, prefix), plain.step(x, roots, prefix)
        for name in vars(a):
            assert torch.equal(getattr(a, name), getattr(b, name)), (bs, name)
    assert stepper._engine.graphs == 64


def test_a_step_inside_the_callers_capture_is_plain_launches():
    stepper = steppers()["cuda"]
    x, roots, prefix = inputs("cuda", dtype=torch.bfloat16, seed=11)
    want = {k: v.clone() for k, v in vars(stepper.step(x, roots, prefix)).items()}
    held = stepper._engine.graphs
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        tree = stepper.step(x, roots, prefix)
    assert stepper._engine.graphs == held  # nothing built or launched as a graph there
    for t in vars(tree).values():
        t.zero_()
    g.replay()
    for name, value in want.items():
        assert torch.equal(getattr(tree, name), value), name


def test_eager_accepts_replay_graphs_equal_to_plain_launches():
    # An eager accept is one graph of the walk (+ the generator's advance when sampling)
    # (+ the readback when publishing), one per geometry; the same acceptances, readbacks
    # and generator state as plain launches.
    graph, plain = steppers()["cuda"], steppers()["cuda"]
    plain._engine.eager_graphs = False
    for seed, bs in ((12, 4), (13, 4), (14, 2)):
        x, roots, prefix = inputs("cuda", bs=bs, dtype=torch.bfloat16, seed=seed)
        target = torch.randn(bs, BUDGET + 1, V, device="cuda").to(torch.bfloat16) * 4
        for kwargs in ({}, {"readback": False}, {"temperature": 0.9, "generator": seed},
                       {"temperature": 0.9, "top_k": 5, "readback": False}):  # fmt: skip
            got = []
            for stepper in (graph, plain):
                stepper.step(x, roots, prefix)
                acc = stepper.accept(target, **kwargs)
                got.append({k: v.clone() for k, v in vars(acc).items()})
                got[-1]["rng"] = stepper._sampling.rng.clone()
            for name in got[0]:
                assert torch.equal(got[0][name], got[1][name]), (seed, kwargs, name)
    torch.cuda.synchronize()
    a, b = graph.readback(wait=True), plain.readback(wait=True)
    assert a["round"] == b["round"] and torch.equal(a["accepted_tokens"], b["accepted_tokens"])
    assert plain._engine.graphs == 0 and graph._engine.graphs > 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": "hot"},
        {"temperature": True},
        {"temperature": -1.0},
        {"temperature": float("nan")},
        {"temperature": 0.9, "top_k": 2.5},
        {"temperature": 0.9, "top_k": -3},
        {"temperature": 0.9, "top_p": 0.0},
        {"temperature": 0.9, "top_p": 1.5},
        {"temperature": None, "top_p": 1.5},  # checked even when greedy, as on the CPU
    ],
    ids=repr,
)
def test_bad_scalar_sampling_raises_what_the_cpu_stepper_raises(kwargs):
    # The engine checks numbers in Rust; the CPU Stepper in Python: the same words, and
    # neither draws a seed from the generator or writes the sampling state.
    s = steppers()
    trees = {dev: s[dev].step(*inputs(dev, seed=9)) for dev in s}
    target = torch.randn(BS, trees["cuda"].width, V)
    cuda = s["cuda"]
    before = [cuda._sampling.rng.clone(), cuda._sampling.temperature.clone()]
    gen = torch.Generator().manual_seed(1)
    state = gen.get_state()
    got = outcome(lambda: cuda.accept(target.cuda(), **kwargs, generator=gen))
    assert got is not None and got == outcome(lambda: s["cpu"].accept(target, **kwargs)), got
    assert torch.equal(gen.get_state(), state)
    torch.cuda.synchronize()
    assert same(before, [cuda._sampling.rng, cuda._sampling.temperature])


def test_a_huge_scalar_top_k_is_off_on_both_paths():
    s = steppers()
    trees = {dev: s[dev].step(*inputs(dev, seed=10)) for dev in s}
    target = torch.randn(BS, trees["cuda"].width, V) * 3
    for dev in s:
        t = target.to(dev)
        got = s[dev].accept(t, 2.0, 2**70, generator=5).accepted_tokens.clone()
        want = s[dev].accept(t, 2.0, None, generator=5).accepted_tokens
        assert torch.equal(got, want), dev
