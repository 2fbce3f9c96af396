"""A digest of stage 1's outputs (every row's log-probs and ids, as bytes) over rows built to
take each of its routes, so two builds can be shown bit-identical on the GPU: run it with
each wheel installed and compare the lines (tests/gpu_run.sh, step build-ab, does).

python3 tests/gpu_stage1_digest.py  # two lines a case: its name and SHA-256 prefixes

"[ranks]" digests the ids and statuses alone: comparisons only, so no change of the
normaliser may move them. "[all]" adds the log-probs and the tree, which a change of Z's
rounding (within the ulp SPEC allows) may move.
"""

import hashlib

import torch

import ddtree
from ddtree.bench_gpu import peaked_logits

VOCAB = 151_936


def cases(dev):
    """(name, logits [bs, L, V], budget): the bench's rows at three batch sizes (one block a
    row, half blocks, clusters; at bs = 64 also B = 63, half blocks reading once), moved
    into the precise grade and far above it; flat and quantised rows (many tokens at the
    floor, deferred runs past the queue); -inf runs; tiny values (inexact far runs); fp16
    and fp32."""
    for bs in (1, 8, 64):
        for shift in (0.0, -20.0, 40.0):
            x = peaked_logits(bs, 15, VOCAB, 7, dev, shift)
            yield f"peaked bs={bs} shift={shift}", x, 255
            if bs == 64:  # B = 63 too: the one read in half blocks
                yield f"peaked bs=64 B=63 shift={shift}", x, 63
    # Maxima on both sides of the fast grade's edge at 4.
    yield "peaked bs=8 shift=-12.0", peaked_logits(8, 15, VOCAB, 7, dev, -12.0), 255
    g = torch.Generator(device=dev).manual_seed(3)
    flat = torch.rand(40, 4, VOCAB, device=dev, generator=g).mul(0.5).add(12.0)
    yield "flat", flat.to(torch.bfloat16), 63
    quantised = torch.randint(0, 4, (40, 4, VOCAB), device=dev, generator=g).float().add(10.0)
    yield "quantised", quantised.to(torch.bfloat16), 255
    yield "quantised B=1023", quantised[:8].to(torch.bfloat16), 1023
    masked = peaked_logits(24, 8, VOCAB, 9, dev, 10.0)
    masked[:, :, 1000:60000] = float("-inf")
    yield "masked", masked, 255
    tiny = peaked_logits(24, 8, VOCAB, 11, dev, 0.0).float()
    tiny[:, :, ::3] *= 1e-3
    yield "tiny", tiny.to(torch.bfloat16), 255
    x = peaked_logits(24, 8, VOCAB, 13, dev, 12.0)
    yield "f16", x.to(torch.float16), 255
    yield "f32", x.float(), 255
    # Fast-grade rows below zero (maxima <= -29.5), zeros of both signs at the floor.
    yield "negative", peaked_logits(24, 8, VOCAB, 15, dev, -60.0), 63
    signed = torch.zeros(24, 8, VOCAB, device=dev)
    signed[:, :, ::2] = -0.0
    signed[:, :, :64] = 20.0
    yield "signed zeros", signed.to(torch.bfloat16), 255
    # Tail tokens (V not a multiple of a run) and an unaligned view (scalar reads).
    wide = peaked_logits(24, 8, VOCAB, 17, dev, 12.0)
    yield "tail", wide[:, :, : VOCAB - 3], 255
    yield "unaligned", wide[:, :, 1:], 255
    # Mostly -inf rows (fewer than K finite maxima: a -inf floor) and a NaN / +inf row.
    sparse = torch.full((24, 8, VOCAB), float("-inf"), device=dev)
    sparse[:, :, ::4096] = torch.randn(24, 8, 38, device=dev, generator=g) + 12.0
    yield "sparse", sparse.to(torch.bfloat16), 255
    bad = peaked_logits(24, 8, VOCAB, 19, dev, 12.0)
    bad[0, 0, 5] = float("nan")
    bad[1, 2, 7] = float("inf")
    yield "nan and inf", bad, 255


def main() -> None:
    dev = torch.device("cuda")
    for name, x, budget in cases(dev):
        bs = x.shape[0]
        roots = torch.zeros(bs, dtype=torch.int64, device=dev)
        prefix = torch.zeros(bs, dtype=torch.int64, device=dev)
        tree = ddtree.build_tree(x, roots, prefix, budget=budget)
        print(f"{name} [ranks]: {digest(tree.topk_ids, tree.status)}")
        every = digest(tree.topk_logprobs, tree.topk_ids, tree.status, tree.verify_ids)
        print(f"{name} [all]: {every}")


def digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.cpu().numpy().tobytes())
    return h.hexdigest()[:16]


if __name__ == "__main__":
    main()
