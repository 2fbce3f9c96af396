"""ddtree against SGLang 0.5.23's GPU tree path, stage by stage, in one run (H200).

    python tests/gpu_sglang_bench.py [--quick] [--json FILE]

Every time is the median GPU time of a CUDA-graph replay of the stage (``graph_time_us``:
the host queues the replays behind a spin kernel, so launch latency is not counted). Draft
logits ``[bs, L=15, V=151936]`` bf16, K = 8 candidates per depth (16 at Q = 128), prefix 1024 tokens
(attention: 4096). SGLang's side is its own code from the 0.5.23 wheel
(``tests/sglang_release.py``): UNO's builder with flashinfer's own radix top-k where
``$DDTREE_FLASHINFER_TOPK`` names a build of it (``tests/flashinfer_topk/build.sh``), else
``torch.topk`` standing in (flashinfer is not installed on the GPU machine; the header says
which; UNO's top-k alone is timed too), its
Triton ``build_tree_kernel_efficient`` (the CUDA JIT kernel needs tvm-ffi and nvcc at run
time), argmax + its Triton greedy verify, its Triton extend attention with the FULL custom
mask, its kept-slot kernel (``fill_accept_out_cache_loc``), and its KV move after the
walk (the slot kernels and the pool's all-layer row copy, ``copy_all_layer_kv_cache``, tiled
as ``MHATokenToKVPool`` tiles it: that class's module needs the serving stack).
"""

from __future__ import annotations

import argparse
import json

import sglang_release
import torch

import ddtree
import ddtree.sglang as ds
from ddtree import _attention
from ddtree._commit import CacheTable
from ddtree._sglang_uno import parent_width
from ddtree.bench_attention import inputs as attention_inputs
from ddtree.bench_gpu import eager_time_us, graph_time_us

DEPTH, VOCAB, PREFIX, ATT_PREFIX = 15, 151936, 1024, 4096
REPLAYS = 30


def load():
    spec_tree = sglang_release.load("sglang.kernels.ops.speculative.spec_tree")
    uno = sglang_release.load("sglang.kernels.ops.speculative.uno_tree")
    eagle = sglang_release.load("sglang.kernels.ops.speculative.eagle")
    attention = sglang_release.load("sglang.kernels.ops.attention.extend_attention")
    return spec_tree, uno, eagle, attention


def load_kv():
    cache_locs = sglang_release.load("sglang.kernels.ops.speculative.cache_locs")
    cache_move = sglang_release.load("sglang.kernels.ops.kvcache.cache_move")
    return cache_locs, cache_move


def round_inputs(bs: int, q: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(bs, DEPTH, VOCAB, device="cuda", generator=g) * 3).to(torch.bfloat16)
    roots = torch.randint(0, VOCAB, (bs,), device="cuda", generator=g)
    seq_lens = torch.full((bs,), PREFIX, dtype=torch.int64, device="cuda")
    target = (torch.randn(bs, q, VOCAB, device="cuda", generator=g) * 3).to(torch.bfloat16)
    return x, roots, seq_lens, target


def same_trees(uno_p, ours) -> int:
    """Requests whose UNO tree is ddtree's: the same tokens with the same edges, in order."""
    same = (uno_p.draft_tokens == ours.draft_tokens) & (
        uno_p.top_scores_index == ours.top_scores_index
    )
    return int(same.all(dim=1).sum())


def candidates(q: int) -> int:
    """K: 8, or 16 where EAGLE's parent_list (K·(L−1)+1 wide) needs it (Q = 128)."""
    return 8 if q - 1 <= parent_width(DEPTH, 8) else 16


def build_row(mods, bs: int, q: int) -> dict:
    spec_tree, uno, eagle, _ = mods
    K = candidates(q)  # noqa: N806 (the SPEC's name)
    x, roots, seq_lens, target = round_inputs(bs, q)
    ws: dict = {}
    ours_ws: dict = {}

    def uno_build():
        return uno.build_uno_tree_proposal(
            roots, x, max_nodes=q, candidate_top_k=K, temperature=0.0, workspace=ws
        )

    def uno_topk():  # the top-k UNO's module imported, called as UNO calls it
        return uno._flashinfer_top_k(x.view(bs * DEPTH, VOCAB), K, sorted=True, deterministic=False)

    def ours_build():
        return ds.uno_proposal(roots, x, max_nodes=q, candidate_top_k=K, workspace=ours_ws)

    theirs, ours = uno_build(), ours_build()
    tree = ours.tree
    mask = torch.ones(bs * q * (PREFIX + q), dtype=torch.bool, device="cuda")
    positions = torch.empty(bs * q, dtype=torch.int64, device="cuda")
    links = torch.full((3, bs, q), -1, dtype=torch.int64, device="cuda")

    def sglang_inputs():
        mask.fill_(True)
        links.fill_(-1)
        spec_tree.sgl_build_tree_kernel_triton(
            ours.parent_list, ours.top_scores_index, seq_lens, mask, positions, *links, K, DEPTH, q
        )

    def ours_mask():
        tree.sglang_custom_mask(seq_lens, mask)

    fields = ds.eagle_verify_fields(tree, seq_lens, custom_mask_out=mask)
    outputs = sglang_release.greedy_outputs(bs, q, DEPTH, "cuda")
    predict, accept_index, _ = outputs

    def sglang_accept():
        sglang_release.greedy_verify(spec_tree, fields, target, outputs)

    def ours_accept():
        return ddtree.accept_tree(tree, target)

    def ours_sampled():
        return ddtree.accept_tree(tree, target, temperature=1.0, top_p=0.9, generator=1)

    out_cache_loc = torch.randperm(bs * q, device="cuda")
    acc = ours_accept()
    index64 = acc.accept_index
    size = bs * index64.shape[1]
    moved = torch.zeros(size, dtype=torch.int64, device="cuda")
    index32 = index64.to(torch.int32)

    def sglang_slots():
        eagle.fill_accept_out_cache_loc_func(index32, out_cache_loc, moved, size)

    def ours_slots():
        return ddtree.kept_slots(acc, out_cache_loc.view(bs, q))

    # Do the two paths agree on this input? (Recorded, not asserted: a tie broken
    # differently by torch.argmax would show here, and the timing still means something.)
    sglang_accept()
    ours_result = ds.eagle_verify_result(acc, tree, seq_lens)
    agree = torch.equal(accept_index, ours_result["accept_index"]) and torch.equal(
        predict, ours_result["predict"]
    )
    t = {
        "uno_build": graph_time_us(uno_build, REPLAYS),
        "uno_topk": graph_time_us(uno_topk, REPLAYS),
        "ddtree_build": graph_time_us(ours_build, REPLAYS),
        "sglang_verify_inputs": graph_time_us(sglang_inputs, REPLAYS),
        "ddtree_full_mask": graph_time_us(ours_mask, REPLAYS),
        "sglang_accept_greedy": graph_time_us(sglang_accept, REPLAYS),
        "ddtree_accept_greedy": graph_time_us(ours_accept, REPLAYS),
        "ddtree_accept_sampled": graph_time_us(ours_sampled, REPLAYS),
        "sglang_kept_slots": graph_time_us(sglang_slots, REPLAYS),
        "ddtree_kept_slots": graph_time_us(ours_slots, REPLAYS),
    }
    same = same_trees(theirs, ours)
    return {"bs": bs, "q": q, "k": K, "same_tree": same, "accept_agrees": agree, **t}


LAYERS, KV_HEADS, HEAD_DIM = 32, 8, 128  # a Llama-3-8B-like pool: 64 buffers of 2 KB rows


def deep_target(tree, target: torch.Tensor) -> None:
    """Make each node's first child the target's argmax there, so the walk goes deep."""
    first = tree.first_child
    has = first >= 0
    child_token = tree.verify_ids.gather(1, first.clamp(min=0))
    peak = torch.full_like(child_token, 60, dtype=target.dtype)
    row = target.gather(2, child_token.unsqueeze(-1)).squeeze(-1)
    target.scatter_(2, child_token.unsqueeze(-1), torch.where(has, peak, row).unsqueeze(-1))


def kv_copy_config(row_bytes: int) -> dict:
    """The tiling ``MHATokenToKVPool._init_kv_copy_and_warmup`` picks for these rows (its
    heuristics, restated: that method lives in a module that needs the serving stack)."""
    tile = 512 if row_bytes >= 8192 else 256 if row_bytes >= 4096 else 128
    return {
        "bytes_per_tile": tile,
        "byte_tiles": (row_bytes + tile - 1) // tile,
        "num_warps": 4 if tile <= 256 else 8,
        "num_locs_upper": 128 if tile >= 512 else 256,
    }


def kv_row(eagle, kv_mods, bs: int, q: int) -> dict:
    """KV compaction after the walk: SGLang's ``move_accept_tokens_to_target_kvcache`` (its
    slot kernels, then the pool's all-layer row copy, chunked as ``_move_kv_cache_impl``
    chunks) against ``ddtree.compact_kv``, over the same 64 buffers; results compared."""
    cache_locs, cache_move = kv_mods
    x, roots, seq_lens, target = round_inputs(bs, q)
    tree = ddtree.build_tree(x, roots, seq_lens, budget=q - 1, topk=candidates(q))
    deep_target(tree, target)
    acc = ddtree.accept_tree(tree, target)
    out_cache_loc = 1 + torch.randperm(bs * q, device="cuda")  # slot 0: SGLang's dummy
    ours = [
        torch.randn(bs * q + 1, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        for _ in range(2 * LAYERS)
    ]
    theirs = [c.clone() for c in ours]
    table = CacheTable(ours, ours[0].device)
    row_bytes = KV_HEADS * HEAD_DIM * 2
    ptrs = torch.tensor([c.data_ptr() for c in theirs], dtype=torch.uint64, device="cuda")
    strides = torch.full((len(theirs),), row_bytes, dtype=torch.int64, device="cuda")
    cfg = kv_copy_config(row_bytes)
    size = bs * acc.path_len
    sources = torch.zeros(size, dtype=torch.int64, device="cuda")
    targets = torch.zeros(size, dtype=torch.int64, device="cuda")
    index32, lens = acc.accept_index.to(torch.int32), acc.accept_len.to(torch.int32)
    cap = cfg["num_locs_upper"]

    def sglang_move():
        cache_locs.fill_front_out_cache_loc_func(lens, out_cache_loc, targets)
        eagle.fill_accept_out_cache_loc_func(index32, out_cache_loc, sources, size)
        for start in range(0, size, cap):
            n = min(cap, size - start)
            cache_move.copy_all_layer_kv_cache_func(
                ptrs, strides, targets[start:], sources[start:], n, 1 << (n - 1).bit_length(), cfg
            )

    def ours_move():
        ddtree.compact_kv(acc, out_cache_loc.view(bs, q), table)

    sglang_move()
    ours_move()
    torch.cuda.synchronize()
    agree = all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    return {
        "bs": bs,
        "q": q,
        "mean_accept_len": float(acc.accept_len.float().mean()),
        "rows_moved": size,
        "kv_agrees": agree,
        "sglang_kv_move": graph_time_us(sglang_move, REPLAYS),
        "ddtree_compact_kv": graph_time_us(ours_move, REPLAYS),
    }


def attention_row(mods, family: str, bs: int, q: int) -> dict:
    """SGLang's Triton extend attention (FULL custom mask, as triton_backend calls it in
    target verify) against ddtree.tree_attention, same inputs; outputs compared."""
    extend = mods[3]
    c = attention_inputs(family, bs, q, ATT_PREFIX, "cuda")
    tree = c["tree"]
    hq, dqk = c["q"].shape[1], c["q"].shape[2]
    dv = c["v_cache"].shape[-1]
    hkv = c["k_cache"].shape[1]
    ws = _attention.AttentionWorkspace(
        "cuda", max_batch=bs, q_nodes=q, hq=hq, hkv=hkv, dqk=dqk, dv=dv
    )
    ours_out = torch.empty(bs * q, hq, dv, device="cuda", dtype=torch.bfloat16)
    theirs_out = torch.empty_like(ours_out)
    mask = tree.sglang_custom_mask(c["prefix_lens"])
    qo_indptr = torch.arange(0, (bs + 1) * q, q, dtype=torch.int32, device="cuda")
    mask_indptr = torch.arange(0, bs + 1, device="cuda", dtype=torch.int64) * (q * (ATT_PREFIX + q))
    k_new, v_new = c["k_new"].contiguous(), c["v_new"].contiguous()
    kv_indices = c["kv_indices"].to(torch.int64)

    def sglang():
        extend.extend_attention_fwd(
            c["q"], k_new, v_new, theirs_out, c["k_cache"], c["v_cache"], qo_indptr,
            c["kv_indptr"], kv_indices, mask, False, mask_indptr, q, 1.0, 1.0,
            sm_scale=c["sm_scale"],
        )  # fmt: skip

    def ours():
        _attention.tree_attention(**c, out=ours_out, workspace=ws)

    sglang()
    ours()
    torch.cuda.synchronize()
    diff = (ours_out.float() - theirs_out.float()).abs().max().item()
    return {
        "family": family,
        "bs": bs,
        "q": q,
        "prefix": ATT_PREFIX,
        "max_abs_diff": diff,
        "sglang_extend_attention": time_us(sglang),
        "ddtree_tree_attention": time_us(ours),
    }


def time_us(fn) -> float:
    """A graph replay's time; an eager call's (marked negative) if ``fn`` cannot be captured."""
    try:
        return graph_time_us(fn, REPLAYS)
    except RuntimeError as e:
        print(f"# not capturable, timed eagerly: {e}".splitlines()[0], flush=True)
        torch.cuda.synchronize()
        return -eager_time_us(fn, REPLAYS)


def markdown(head: list, rows: list) -> None:
    """One markdown table: a header, its rule, a line per row (cells already formatted)."""
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    print()


def build_cells(r: dict) -> list:
    theirs = r["uno_build"] + r["sglang_verify_inputs"] + r["sglang_accept_greedy"]
    theirs += r["sglang_kept_slots"]
    ours = r["ddtree_build"] + r["ddtree_accept_greedy"] + r["ddtree_kept_slots"]
    timed = ("sglang_verify_inputs", "ddtree_full_mask", "sglang_accept_greedy",
             "ddtree_accept_greedy", "ddtree_accept_sampled", "sglang_kept_slots",
             "ddtree_kept_slots")  # fmt: skip
    return [
        str(r["bs"]), f"{r['q']}, {r['k']}", f"{r['same_tree']}/{r['bs']}",
        f"{r['uno_build']:.1f} ({r['uno_topk']:.1f})", f"{r['ddtree_build']:.1f}",
        *(f"{r[k]:.1f}" for k in timed), f"{theirs:.1f}", f"{ours:.1f}", f"{theirs / ours:.2f}×",
    ]  # fmt: skip


def print_tables(builds: list, attentions: list, kvs: list) -> None:
    markdown(
        ["bs", "Q, K", "same tree", "UNO build (top-k)", "ddtree build", "SGLang verify inputs",
         "ddtree FULL mask", "SGLang greedy accept", "ddtree greedy", "ddtree sampled",
         "SGLang kept slots", "ddtree kept slots", "SGLang sum", "ddtree sum", "ratio"],
        [build_cells(r) for r in builds],
    )  # fmt: skip
    markdown(
        ["attention", "bs", "Q", "prefix", "SGLang Triton extend (µs)", "ddtree (µs)", "ratio",
         "max abs diff"],
        [[r["family"], str(r["bs"]), str(r["q"]), str(r["prefix"]),
          f"{r['sglang_extend_attention']:.1f}", f"{r['ddtree_tree_attention']:.1f}",
          f"{r['sglang_extend_attention'] / r['ddtree_tree_attention']:.2f}×",
          f"{r['max_abs_diff']:.3g}"] for r in attentions],
    )  # fmt: skip
    markdown(
        ["KV compaction (64 buffers)", "bs", "Q", "mean accept_len", "rows",
         "SGLang move (µs)", "ddtree compact_kv (µs)", "ratio", "same caches"],
        [[f"{LAYERS} layers K+V, {KV_HEADS}×{HEAD_DIM} bf16", str(r["bs"]), str(r["q"]),
          f"{r['mean_accept_len']:.2f}", str(r["rows_moved"]), f"{r['sglang_kv_move']:.1f}",
          f"{r['ddtree_compact_kv']:.1f}",
          f"{r['sglang_kv_move'] / r['ddtree_compact_kv']:.2f}×", str(r["kv_agrees"])]
         for r in kvs],
    )  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="bs 1 and 8, Q 64 only")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args()
    mods = load()
    import flashinfer  # the tests' stub module UNO imported (sglang_release)

    print(f"# UNO's top-k: {flashinfer.TOP_K}", flush=True)
    shapes = [(1, 64), (8, 64)] if args.quick else [
        (bs, q) for bs in (1, 8, 64) for q in (16, 64, 128)
    ]  # fmt: skip
    builds = []
    for bs, q in shapes:
        builds.append(build_row(mods, bs, q))
        print(json.dumps(builds[-1]), flush=True)
    attentions = []
    for family in ("gqa", "mla16"):
        for bs in (1, 8) if args.quick else (1, 8, 64):
            attentions.append(attention_row(mods, family, bs, 64))
            print(json.dumps(attentions[-1]), flush=True)
    kvs = []
    kv_mods = load_kv()
    for bs in (1, 8) if args.quick else (1, 8, 64):
        kvs.append(kv_row(mods[2], kv_mods, bs, 64))
        print(json.dumps(kvs[-1]), flush=True)
    print_tables(builds, attentions, kvs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"builds": builds, "attention": attentions, "kv": kvs}, f, indent=1)


if __name__ == "__main__":
    main()
