"""The demo engine on CUDA: captured rounds equal eager ones token for token (fp32), a whole
decode's rounds run under torch's sync debug mode "error", device memory stays flat over
1,000 replayed rounds, and bf16 decoders part from greedy only at near-ties."""

from __future__ import annotations

import importlib.util
import types

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        any(importlib.util.find_spec(m) is None for m in ("gguf", "tokenizers", "jinja2")),
        reason="needs the demo's gguf, tokenizers and jinja2",
    ),
]

PROMPTS = ("What is the capital of France?", "Write a haiku about the sea.",
           "List three prime numbers and explain briefly why each one is prime.")  # fmt: skip


def setup(dtype, budget=15, max_new=24):
    from ddtree.demo import cli, model

    tok = model.load_tokenizer()
    w = model.load_weights(dtype=dtype).to(device="cuda")
    prompts = [tok.chat(p) for p in PROMPTS]
    args = types.SimpleNamespace(
        max_new_tokens=max_new, depth=4, budget=(budget,), page_size=16, draft_layers=24,
        temperature=0.0, drafter="early-exit", draft_weights=None, stop_at_eos=True,
    )  # fmt: skip
    engine = cli.new_engine(w, prompts, args, torch.device("cuda"))
    return engine, prompts, args


def decoders(engine, prompts, args, budget=15):
    from ddtree.demo import cli

    for name, b in (("greedy", None), ("chain", args.depth), ("ddtree", budget),
                    ("cpu-build", budget)):  # fmt: skip
        yield name, lambda name=name, b=b: cli.make_decoder(engine, name, b, len(prompts), args)


def test_captured_rounds_equal_eager_rounds():
    """bf16: the CUDA tree attention takes bf16/fp16 only, so the fp32 greedy equality is
    the CPU suite's (test_demo.py); here the graphs replay exactly what the eager rounds
    compute, token for token and round for round."""
    engine, prompts, args = setup(torch.bfloat16)
    for name, make in decoders(engine, prompts, args):
        eager = make()
        eager.eager = True
        want = eager.decode(prompts)
        got = make().decode(prompts)
        assert got.tokens == want.tokens, name
        assert got.rounds == want.rounds, name
        assert all(len(t) >= 1 for t in got.tokens)


def test_a_decodes_rounds_do_not_sync():
    engine, prompts, args = setup(torch.bfloat16)
    for name, make in decoders(engine, prompts, args):
        if name == "cpu-build":  # its host build reads the device by design
            continue
        dec = make()
        dec.decode(prompts)  # warm-up: capture, first launches
        dec.prefill(prompts)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            rounds = dec._rounds(dec.round_fns())
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert rounds >= 1, name


def test_device_memory_is_flat_over_1000_rounds():
    engine, prompts, args = setup(torch.bfloat16, budget=63)
    dec = dict(decoders(engine, prompts, args, budget=63))["ddtree"]()
    dec.decode(prompts)
    torch.cuda.synchronize()
    before = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved(),
              torch.cuda.mem_get_info()[0])  # fmt: skip
    for _ in range(1000):
        for fn in dec.round_fns():
            fn()
    torch.cuda.synchronize()
    after = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved(),
             torch.cuda.mem_get_info()[0])  # fmt: skip
    assert after == before


def test_bf16_decoders_part_from_greedy_only_at_near_ties():
    """Where a bf16 decoder's tokens first differ from greedy's, greedy's top-1 minus top-2
    logit is within two bf16 steps of a logit of magnitude below 32 (2 * 2**-3)."""
    from ddtree.demo.measure import first_divergence

    engine, prompts, args = setup(torch.bfloat16, max_new=64)
    results = {name: make().decode(prompts) for name, make in decoders(engine, prompts, args)}
    greedy = results["greedy"]
    for name, r in results.items():
        for g, o, m in zip(greedy.tokens, r.tokens, greedy.margins, strict=True):
            d = first_divergence(g, o, m)
            if d is not None and d["greedy_margin"] is not None:
                assert d["greedy_margin"] <= 0.25, (name, d)


def test_a_hidden_state_drafter_gets_the_accepted_rows_inside_the_graph():
    """A drafter naming target layers gets the accepted path's hidden rows after every
    accept (Stepper.gather_hidden in the round's graph), as the eager round gives them."""
    from ddtree.demo import decode

    class Reader(decode.EarlyExitDrafter):
        hidden_layers = (29,)

        def absorb(self, hidden, accept_len, prefix):  # static buffers: replays rewrite them
            if not hasattr(self, "last"):
                self.last = torch.zeros_like(hidden)
                self.n = torch.zeros_like(accept_len)
            self.last.copy_(hidden)
            self.n.copy_(accept_len)

    engine, prompts, args = setup(torch.bfloat16)
    got = []
    for eager in (True, False):
        drafter = Reader(engine, len(prompts), args.depth)
        dec = decode.Speculative(engine, len(prompts), 24, engine.cfg.eos_id, drafter, 15)
        dec.eager = eager
        r = dec.decode(prompts)
        got.append((r.tokens, drafter.last.clone(), drafter.n.clone()))
    assert got[0][0] == got[1][0]
    assert torch.equal(got[0][1], got[1][1]) and torch.equal(got[0][2], got[1][2])
    hidden, n = got[1][1], got[1][2]
    assert all(hidden[b, int(n[b]) :].abs().sum() == 0 for b in range(len(prompts)))
    assert hidden[:, 0].abs().sum() > 0


def test_a_dflash_drafter_inside_the_captured_round_equals_its_eager_rounds():
    """An untrained (random) DFlash drafter: the captured rounds decode what the eager ones
    do, round for round."""
    from ddtree.demo import decode, dflash

    engine, prompts, args = setup(torch.bfloat16)
    cfg = dflash.DraftConfig(engine.cfg, layers=1, block=4)
    w = dflash.DraftWeights.init(cfg, seed=0).to("cuda", torch.bfloat16)
    got = []
    for eager in (True, False):
        drafter = dflash.DFlashDrafter(engine, w, cfg, len(prompts))
        dec = decode.Speculative(engine, len(prompts), 24, engine.cfg.eos_id, drafter, 15)
        dec.eager = eager
        r = dec.decode(prompts)
        got.append((r.tokens, r.rounds))
    assert got[0] == got[1]


def test_the_dflash_block_attends_both_ways_on_the_gpu():
    """The block's all-visible tree (later nodes seen by earlier ones too, unlike a draft
    tree) through the CUDA tree attention: bf16 logits near the fp32 dense reference."""
    from ddtree.demo import dflash

    engine, prompts, _ = setup(torch.bfloat16)
    cfg = dflash.DraftConfig(engine.cfg, layers=2, block=8)
    w32 = dflash.DraftWeights.init(cfg, seed=0)
    w32 = dflash.DraftWeights.from_tensors(
        {k: v * 10 if v.dim() == 2 else v for k, v in w32.tensors().items()}, cfg.layers
    )  # larger than the init's, so that attention is far from uniform
    drafter = dflash.DFlashDrafter(engine, w32.to("cuda", torch.bfloat16), cfg, 1)
    ids = prompts[0]
    _, hidden = engine.prefill(0, ids, keep=cfg.taps)
    drafter.start(0, hidden)
    root = torch.tensor([ids[-1]], device="cuda")
    got = drafter(root, torch.tensor([len(ids)], device="cuda"))[0].float().cpu()
    embed = engine.w.embed.float().cpu()
    w_ref = w32.to(dtype=torch.bfloat16).to(dtype=torch.float32)  # the GPU's weights, in fp32
    want = dflash.reference_block(w_ref, cfg, embed, hidden.float().cpu(), ids[-1])
    # A causal (one-way) block would differ at every position but the last by far more.
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.75
