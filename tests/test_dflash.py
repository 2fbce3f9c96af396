"""The DFlash drafter on a tiny random target (CPU): its round forward through the tree
attention over its context pool equals the dense reference, round after round as the
context grows by accepted rows; training's batched forward equals the reference per anchor;
and it plugs into the decoders, which stay lossless."""

from __future__ import annotations

import pytest
import torch

from ddtree.demo import decode, dflash
from ddtree.demo.engine import Engine, Pool
from ddtree.demo.model import Config, Layer, Weights


def tiny_target(seed: int = 0) -> Weights:
    cfg = Config(n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn=96,
                 rope_theta=10000.0, rms_eps=1e-5, vocab=97, bos_id=0, eos_id=1)  # fmt: skip
    g = torch.Generator().manual_seed(seed)

    def w(*shape, std=0.15):
        return torch.randn(*shape, generator=g) * std

    def norm():
        return 1 + w(cfg.hidden, std=0.1)

    layers = [
        Layer(
            norm(),
            w(64, 64),
            w(32, 64),
            w(32, 64),
            w(64, 64),
            norm(),
            w(96, 64),
            w(96, 64),
            w(64, 96),
        )  # fmt: skip
        for _ in range(cfg.n_layers)
    ]
    return Weights(cfg, w(cfg.vocab, 64, std=1.0), layers, norm())


def drafter_setup(bs=2, block=4, layers=2, page_size=4, seed=1):
    target = tiny_target()
    cfg = dflash.DraftConfig(target.config, layers=layers, block=block, taps=(0, 2))
    w = dflash.DraftWeights.init(cfg, seed=seed)
    # Larger than the init so the test sees every term (the init's std is 0.02).
    w = dflash.DraftWeights.from_tensors({k: v * 5 if v.dim() == 2 else v + 0.3 * torch.randn(
        v.shape, generator=torch.Generator().manual_seed(7)) for k, v in w.tensors().items()},
        layers)  # fmt: skip
    pool = Pool(target, bs, 64, page_size, "cpu", torch.float32)
    engine = Engine(target, pool, draft_layers=2)
    return target, cfg, w, engine


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_round_forward_equals_the_reference_as_the_context_grows(page_size):
    target, cfg, w, engine = drafter_setup(page_size=page_size)
    drafter = dflash.DFlashDrafter(engine, w, cfg, bs=2)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(2, 97, (n,), generator=g).tolist() for n in (7, 11)]
    contexts = []
    for b, ids in enumerate(prompts):
        _, hidden = engine.prefill(b, ids, keep=cfg.taps)
        assert hidden.shape == (len(ids), 2 * 64)
        drafter.start(b, hidden)
        contexts.append(hidden)
    prefix = torch.tensor([7, 11])
    for accept in ([3, 1], [5, 2], [1, 4]):  # three rounds, ragged acceptances
        roots = torch.randint(2, 97, (2,), generator=g)
        got = drafter(roots, prefix)
        assert got.shape == (2, cfg.block, 97)
        for b in range(2):
            want = dflash.reference_block(w, cfg, target.embed, contexts[b], int(roots[b]))
            torch.testing.assert_close(got[b], want, atol=2e-4, rtol=2e-4)
        # The round's accepted rows (root first); rows past accept_len are junk the next
        # rounds must not read.
        rows = torch.randn(2, cfg.block + 1, 2 * 64, generator=g)
        n = torch.tensor(accept)
        drafter.absorb(rows, n, prefix)
        for b in range(2):
            contexts[b] = torch.cat([contexts[b], rows[b, : accept[b]]])
        prefix = prefix + n


def test_the_training_forward_equals_the_reference_per_anchor():
    target, cfg, w, _ = drafter_setup(block=3, layers=1)
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(2, 97, (2, 12), generator=g)
    taps = torch.randn(2, 12, 2 * 64, generator=g)
    anchors = torch.tensor([[1, 5, 9], [3, 4, 11]])
    got = dflash.block_logits(w, cfg, target.embed, taps, tokens, anchors)
    assert got.shape == (2, 3, 3, 97)
    for n in range(2):
        for j, a in enumerate(anchors[n].tolist()):
            want = dflash.reference_block(w, cfg, target.embed, taps[n, :a], int(tokens[n, a]))
            torch.testing.assert_close(got[n, j], want, atol=2e-4, rtol=2e-4)


def test_weights_round_trip_by_name():
    _, cfg, w, _ = drafter_setup()
    again = dflash.DraftWeights.from_tensors(w.tensors(), cfg.layers)
    assert all(torch.equal(a, b) for a, b in zip(w.parameters(), again.parameters(), strict=True))
    assert len(w.tensors()) == 4 + 9 * cfg.layers


def test_a_bad_config_names_its_field():
    target = tiny_target()
    with pytest.raises(ValueError, match="block"):
        dflash.DraftConfig(target.config, block=21)
    with pytest.raises(ValueError, match="taps"):
        dflash.DraftConfig(target.config, taps=(4,))


def test_a_shallower_drafter_gives_the_blocks_first_positions_and_the_same_decode():
    """Depth d < L: the first d positions of the full block's logits; a DDTree of B ≤ d
    nodes decodes the same tokens in the same rounds with either."""
    target, cfg, w, engine = drafter_setup(bs=2, block=4)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(2, 97, (n,), generator=g).tolist() for n in (6, 9)]
    full = dflash.DFlashDrafter(engine, w, cfg, bs=2)
    two = dflash.DFlashDrafter(engine, w, cfg, bs=2, depth=2)
    for b, ids in enumerate(prompts):
        hidden = engine.prefill(b, ids, keep=cfg.taps)[1]
        full.start(b, hidden)
        two.start(b, hidden)
    roots, prefix = torch.tensor([5, 8]), torch.tensor([6, 9])
    torch.testing.assert_close(two(roots, prefix), full(roots, prefix)[:, :2])
    eos = target.config.eos_id
    runs = [decode.Speculative(engine, 2, 12, eos, dflash.DFlashDrafter(engine, w, cfg, 2, d),
                               2).decode(prompts) for d in (2, 4)]  # fmt: skip
    assert runs[0].tokens == runs[1].tokens and runs[0].rounds == runs[1].rounds
    with pytest.raises(ValueError, match="depth"):
        dflash.DFlashDrafter(engine, w, cfg, bs=2, depth=5)


@pytest.mark.parametrize("budget", [1, 15])
def test_ddtree_and_the_cpu_build_with_the_drafter_decode_what_greedy_decodes(budget):
    target, cfg, w, engine = drafter_setup(bs=2, block=4)
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(2, 97, (n,), generator=g).tolist() for n in (6, 9)]
    eos = target.config.eos_id
    greedy = decode.Greedy(engine, 2, 12, eos).decode(prompts)
    for cls in (decode.Speculative, decode.CpuBuild):
        drafter = dflash.DFlashDrafter(engine, w, cfg, bs=2)
        r = cls(engine, 2, 12, eos, drafter, budget).decode(prompts)
        assert r.tokens == greedy.tokens, cls.__name__


# ---------------------------------------------------------------------------------------------
# Training (python -m ddtree.demo.train_drafter), on the tiny target
# ---------------------------------------------------------------------------------------------


def tiny_data(target, cfg, n=6, samples=2):
    from ddtree.demo import datagen
    from ddtree.demo import train_drafter as td

    g = torch.Generator().manual_seed(11)
    ids = [torch.randint(2, 97, (int(k),), generator=g).tolist() for k in range(5, 5 + n)]
    return td.generate(target, ids, cfg, max_new=10, bs=4, seed=0,
                       samples=samples, policy=datagen.Policy(0.5, 1.0))  # fmt: skip


def test_generated_data_is_the_targets_own_continuations_hidden_states_and_labels():
    target, cfg, _, _ = drafter_setup(layers=1)
    data = tiny_data(target, cfg)
    assert len(data) == 12 and data.taps.shape[2] == 2 * 64
    engine = Engine(target, Pool(target, 1, 40, 4, "cpu", torch.float32), draft_layers=1)
    branched = 0
    for n in range(12):
        seq = data.tokens[n, : int(data.lengths[n])].tolist()
        start = int(data.starts[n])
        assert len(seq) > start  # at least one response token
        # Every label is the target's argmax after the prefix before it.
        for t in range(1, len(seq)):
            best = int(engine.prefill(0, seq[:t]).argmax())
            assert int(data.labels[n, t]) == best
            if t >= start and n < 6:  # the first copy decodes greedily
                assert seq[t] == best
            branched += t >= start and seq[t] != best
        assert int(data.labels[n, 0]) == -100 and bool((data.labels[n, len(seq) :] == -100).all())
        _, taps = engine.prefill(0, seq, keep=cfg.taps)
        torch.testing.assert_close(data.taps[n, : len(seq)], taps)
    assert branched > 0  # the second copy left the greedy path somewhere


def test_a_branching_policy_is_checked_and_greedy_without_branches():
    from ddtree.demo import datagen

    with pytest.raises(ValueError, match="branch"):
        datagen.Policy(1.5)
    with pytest.raises(ValueError, match="temperature"):
        datagen.Policy(0.5, 0.0)
    logits = torch.randn(64, 97, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    assert torch.equal(datagen.pick(logits, datagen.Policy(), g), logits.argmax(-1))
    # At branch 1, temperature 1 the draws follow softmax: each row's mean over draws.
    drawn = torch.stack([datagen.pick(logits[:1].expand(4000, -1), datagen.Policy(1.0), g)
                         for _ in range(5)]).flatten()  # fmt: skip
    freq = torch.bincount(drawn, minlength=97).float() / drawn.numel()
    assert (freq - logits[0].softmax(-1)).abs().max() < 0.02


def test_two_training_steps_lower_the_loss_and_a_checkpoint_resumes_exactly(tmp_path):
    from ddtree.demo import train_drafter as td

    target, cfg, _, _ = drafter_setup(layers=1)
    data = tiny_data(target, cfg)
    at = td.anchors(data, 4, cfg.block, torch.Generator().manual_seed(0))
    assert bool(((at >= 1) & (at + 1 < data.lengths.unsqueeze(1))).all())

    def run(steps, resume_from=None, save_to=None):
        w = dflash.DraftWeights.init(cfg, seed=0)
        tr = td.Trainer(w, cfg, target.embed, steps=4, peak=3e-3, seed=0)
        if resume_from:
            tr.load(resume_from)
        while tr.step < steps:
            tr.train_step(data, batch=4, per_seq=4, gamma=2.0)
        if save_to:
            tr.save(save_to, {"seed": 0})
        return w

    w0 = dflash.DraftWeights.init(cfg, seed=0)
    before = float(td.loss_of(w0, cfg, target.embed, data, at, 2.0))
    w2 = run(2, save_to=tmp_path / "ck")
    after = float(td.loss_of(w2, cfg, target.embed, data, at, 2.0).detach())
    assert after < before
    # Four steps straight equal two, a checkpoint, and two more.
    straight = run(4)
    resumed = run(4, resume_from=tmp_path / "ck")
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert (tmp_path / "ck" / "state.json").exists() and not (tmp_path / "ck.tmp").exists()
    assert all(f.stat().st_size <= td.SHARD_BYTES + 2**16 for f in (tmp_path / "ck").glob("*.pt"))


def test_the_decode_like_held_out_estimate_walks_rounds_as_a_greedy_chain_decode():
    from ddtree.demo import train_drafter as td

    target, cfg, w, _ = drafter_setup(layers=1)
    data = tiny_data(target, cfg, n=5, samples=1)  # greedy responses, as the held-out set
    tokens = rounds = 0
    for n in range(len(data)):
        end, p = int(data.lengths[n]), int(data.starts[n])
        while p < end - 1:  # a round from root p: the dense reference's block
            logits = dflash.reference_block(w, cfg, target.embed, data.taps[n, :p],
                                            int(data.tokens[n, p]))  # fmt: skip
            a = 1
            while (
                a <= cfg.block
                and p + a < end
                and int(logits[a - 1].argmax()) == int(data.labels[n, p + a])
            ):
                a += 1
            tokens, rounds, p = tokens + a, rounds + 1, p + a
    want = tokens / rounds
    assert td.decode_acceptance(w, cfg, target.embed, data) == pytest.approx(want)
    assert want > 1  # the scaled-up drafter accepts something here, so the walk is exercised


def test_a_chain_commits_up_to_its_first_wrong_depth_and_inside_the_sequence():
    from ddtree.demo import train_drafter as td

    labels = torch.tensor([[-100, 5, 6, 7, 8, 9, -100, -100]])
    # Rooted at 1, depth i drafts labels[2 + i]: right, right, wrong, right -> 1 + 2.
    drafted = torch.tensor([[6, 7, 0, 9]])
    logits = torch.nn.functional.one_hot(drafted, 12).float()
    accepts = td.chain_accepts(logits, labels, torch.tensor([1]), torch.tensor([6]))
    assert accepts.tolist() == [3]
    # Rooted at 3 with every draft right, the sequence's end (length 6) stops it: 1 + 2.
    logits = torch.nn.functional.one_hot(torch.tensor([[8, 9, 9, 9]]), 12).float()
    accepts = td.chain_accepts(logits, labels, torch.tensor([3]), torch.tensor([6]))
    assert accepts.tolist() == [3]


@pytest.mark.parametrize("budget", [1, 6, 40])
def test_the_held_out_tree_decode_commits_what_greedy_ddtree_would(budget):
    import ddtree
    from ddtree.demo import train_drafter as td

    target, cfg, w, _ = drafter_setup(layers=1)
    data = tiny_data(target, cfg, n=5, samples=1)
    tokens = rounds = 0
    for n in range(len(data)):  # one request at a time, the tree walked node by node
        end, p = int(data.lengths[n]), int(data.starts[n])
        while p < end - 1:
            logits = dflash.reference_block(w, cfg, target.embed, data.taps[n, :p],
                                            int(data.tokens[n, p]))  # fmt: skip
            tree = ddtree.build_tree(logits[None], data.tokens[n, p : p + 1],
                                     torch.tensor([p]), budget=budget)  # fmt: skip
            ids, parents = tree.verify_ids[0].tolist(), tree.parents[0].tolist()
            node, depth = 0, 0
            while True:
                kids = [j for j in range(1, int(tree.num_nodes[0]) + 1) if parents[j] == node]
                nxt = [j for j in kids if p + depth + 1 < end
                       and ids[j] == int(data.labels[n, p + depth + 1])]  # fmt: skip
                if not nxt:
                    break
                node, depth = nxt[0], depth + 1
            tokens, rounds, p = tokens + depth + 1, rounds + 1, p + depth + 1
    want = tokens / rounds
    got = td.tree_decode_acceptance(w, cfg, target.embed, data, budget)
    assert got == pytest.approx(want)
    if budget == 40:  # a tree this size accepts more than a single node
        assert want > td.tree_decode_acceptance(w, cfg, target.embed, data, 1)


def test_the_distillation_loss_is_the_cross_entropy_against_the_targets_distribution():
    from ddtree.demo import datagen
    from ddtree.demo import train_drafter as td

    target, cfg, w, _ = drafter_setup(layers=1)
    g = torch.Generator().manual_seed(11)
    ids = [torch.randint(2, 97, (int(k),), generator=g).tolist() for k in (5, 7, 6)]
    data = td.generate(target, ids, cfg, max_new=8, bs=2, seed=0,
                       policy=datagen.Policy(0.5), final=True)  # fmt: skip
    engine = Engine(target, Pool(target, 1, 40, 4, "cpu", torch.float32), draft_layers=1)
    at = td.anchors(data, 3, cfg.block, torch.Generator().manual_seed(1))
    logits = dflash.block_logits(w, cfg, target.embed, data.taps, data.tokens, at)
    got = td.soft_ce(logits, data, at, target.embed)
    labelled = [(n, a, i) for n in range(len(data)) for a in range(3) for i in range(cfg.block)
                if int(at[n, a]) + 1 + i < int(data.lengths[n])]  # fmt: skip
    assert len(labelled) >= 6
    for n, a, i in labelled:
        pos = int(at[n, a]) + i  # the target's distribution for the token after pos
        seq = data.tokens[n, : pos + 1].tolist()
        want = engine.prefill(0, seq).log_softmax(-1)
        expect = -(want.exp() * logits[n, a, i].log_softmax(-1)).sum()
        torch.testing.assert_close(got[n, a, i], expect, atol=1e-4, rtol=1e-4)
    # soft = 0 is the argmax loss; soft = 1 the distribution's alone.
    hard = td.loss_of(w, cfg, target.embed, data, at, 2.0)
    assert torch.equal(td.loss_of(w, cfg, target.embed, data, at, 2.0, soft=0.0), hard)
    assert not torch.equal(td.loss_of(w, cfg, target.embed, data, at, 2.0, soft=1.0), hard)


def test_saved_weights_load_with_their_config(tmp_path):
    from ddtree.demo import train_drafter as td

    target, cfg, w, _ = drafter_setup(layers=2, block=4)
    td.save_weights(tmp_path / "d.safetensors", w, cfg, {"seed": 3})
    got, got_cfg, meta = td.load_weights(
        tmp_path / "d.safetensors", target.config, dtype=torch.float32
    )
    assert (got_cfg.layers, got_cfg.block, got_cfg.taps, meta["seed"]) == (2, 4, (0, 2), 3)
    for a, b in zip(w.parameters(), got.parameters(), strict=True):
        torch.testing.assert_close(a.to(torch.bfloat16).float(), b)


def test_prompts_are_distinct_and_a_tenth_is_held_out():
    from ddtree.demo import train_drafter as td

    texts = td.prompts()
    assert len(set(texts)) == len(texts) >= 200
    train, held = td.split(texts)
    assert len(held) == -(-len(texts) // 10) and not set(train) & set(held)


def test_the_training_job_runs_resumes_and_writes_its_record(tmp_path):
    import types

    from ddtree.demo import train_drafter as td

    target, _, _, _ = drafter_setup()
    tok = types.SimpleNamespace(chat=lambda text: [2 + (ord(c) % 90) for c in text[:8]])
    args = types.SimpleNamespace(
        device="cpu", layers=1, block=4, taps=(0, 2), prompts=12, max_new_tokens=6, steps=3,
        minutes=5.0, batch=4, anchors=3, gamma=2.0, lr=1e-3, every=1, seed=0, out=str(tmp_path),
        save_minutes=0.0, checkpoint_moments="bfloat16", samples=2, gen_batch=4, branch=0.5,
        temperature=1.0, soft=0.5, tree_budgets=(3, 15), responses=None, responses_only=False,
        held_out_tokens=4, matmul_precision="high", total_minutes=None,
    )  # fmt: skip
    lines = []
    before = torch.get_float32_matmul_precision()
    record = td.train(target, tok, args, log=lines.append)
    assert record["matmul_precision"] == "high"
    assert torch.get_float32_matmul_precision() == before  # torch's setting is restored
    assert record["step"] == 3 and record["sequences"] == 20 and record["held_out_acceptance"] >= 1
    assert record["held_out_tokens"] == 4
    assert any(line.startswith("step 3/3: loss") for line in lines)
    # The chain's per-depth shares fall with depth and sum to the acceptance minus one.
    by_depth = record["held_out_by_depth"]
    assert len(by_depth) == 4 and by_depth == sorted(by_depth, reverse=True)
    assert abs(1 + sum(by_depth) - record["held_out_acceptance"]) < 1e-3
    assert 1 <= record["held_out_decode"] <= 1 + 4
    assert list(record["held_out_tree"]) == ["3", "15"]
    assert all(1 <= v <= 1 + 4 for v in record["held_out_tree"].values())
    args.steps = 5
    again = td.train(target, tok, args, log=lines.append)
    assert "resumed at step 3" in lines and again["step"] == 5
    # The resumed run starts from the first run's best, not from scratch.
    assert again["best_held_out"] >= record["best_held_out"]
    _, cfg, meta = td.load_weights(tmp_path / "drafter.safetensors", target.config)
    assert cfg.block == 4 and meta["step"] == again["best_step"] <= 5
    assert meta["held_out_acceptance"] == again["held_out_acceptance"] == again["best_held_out"]
    # A job past its total time stops before another step, its checkpoint and record kept.
    args.steps, args.total_minutes = 9, 0.0
    late = td.train(target, tok, args, log=lines.append)
    assert late["step"] == 5 and (tmp_path / "checkpoint" / "state.json").exists()


def test_a_responses_file_gives_other_drafters_the_same_data_without_decoding(tmp_path):
    import types

    from ddtree.demo import train_drafter as td

    target, _, _, _ = drafter_setup()
    tok = types.SimpleNamespace(chat=lambda text: [2 + (ord(c) % 90) for c in text[:8]])
    path = tmp_path / "responses.pt"
    args = types.SimpleNamespace(
        device="cpu", layers=1, block=4, taps=(0, 2), prompts=12, max_new_tokens=6, steps=0,
        minutes=5.0, batch=4, anchors=3, gamma=2.0, lr=1e-3, every=1, seed=3,
        out=str(tmp_path / "a"), save_minutes=0.0, checkpoint_moments="bfloat16", samples=2,
        gen_batch=4, branch=0.5, temperature=1.0, soft=0.0, tree_budgets=(3,),
        responses=None, responses_only=True, held_out_tokens=None, matmul_precision="highest",
        total_minutes=None,
    )  # fmt: skip
    with pytest.raises(ValueError, match="responses_only"):
        td.train(target, tok, args)
    args.responses = str(path)
    td.train(target, tok, args, log=lambda m: None)
    assert path.exists() and not (tmp_path / "a").exists()
    # What the file holds is what decoding gives, for a drafter of another shape too.
    train_texts, held_texts = td.split(td.prompts()[:12])
    parts, seconds = td.load_responses(path, td.responses_key(args))
    ids = [tok.chat(t) for t in train_texts]
    fresh = td.respond_all(td.data_engine(target, ids, 6), ids, 6, 4, 3, 2,
                           td.datagen.Policy(0.5, 1.0))  # fmt: skip
    assert parts["train"] == fresh and len(parts["held"][0]) == len(held_texts) and seconds > 0
    args.responses_only, args.layers, args.taps, args.steps = False, 2, (1, 2), 1
    lines = []
    record = td.train(target, tok, args, log=lines.append)
    assert any(line.startswith("responses read from") for line in lines)
    assert record["sequences"] == len(fresh[0]) and record["step"] == 1
    # Other generation flags than the file's: refused, naming the argument.
    args.samples = 3
    with pytest.raises(ValueError, match="responses: .* was generated with"):
        td.train(target, tok, args)


def test_held_out_responses_cut_to_n_tokens_are_what_a_shorter_decode_gives():
    from ddtree.demo import train_drafter as td

    target, cfg, _, _ = drafter_setup(layers=1)
    g = torch.Generator().manual_seed(5)
    ids = [torch.randint(2, 97, (int(k),), generator=g).tolist() for k in range(5, 9)]
    long = td.generate(target, ids, cfg, max_new=10, bs=4, seed=0)
    short = td.generate(target, ids, cfg, max_new=4, bs=4, seed=0)
    cut = td.cut(long, 4)
    assert torch.equal(cut.lengths, short.lengths) and td.cut(long, None) is long
    for n in range(len(ids)):
        k = int(short.lengths[n])
        assert torch.equal(cut.tokens[n, :k], short.tokens[n, :k])
        assert torch.equal(cut.labels[n, :k], short.labels[n, :k])
    cfg_w = dflash.DraftWeights.init(cfg, 0)
    embed = target.embed.float()
    assert td.decode_acceptance(cfg_w, cfg, embed, cut) == td.decode_acceptance(
        cfg_w, cfg, embed, short)  # fmt: skip


def test_safetensors_round_trip_and_layout(tmp_path):
    import json
    import struct

    from ddtree.demo import safetensors_io as st

    g = torch.Generator().manual_seed(2)
    tensors = {
        "b": torch.randn(3, 5, generator=g).to(torch.bfloat16),
        "a": torch.randn(7, generator=g),
        "i": torch.arange(6, dtype=torch.int64).view(2, 3),
        "h": torch.randn(2, 2, generator=g).half().t(),  # not contiguous
        "e": torch.zeros(0, 4),
    }
    st.save(tmp_path / "x.safetensors", tensors, {"k": "v"})
    got, meta = st.load(tmp_path / "x.safetensors")
    assert meta == {"k": "v"} and st.metadata(tmp_path / "x.safetensors") == {"k": "v"}
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
    raw = (tmp_path / "x.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    assert n % 8 == 0 and header["b"] == {"dtype": "BF16", "shape": [3, 5],
                                          "data_offsets": [28, 58]}  # fmt: skip
    # Offsets tile the body in name order, and the body ends the file.
    spans = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert 8 + n + spans[-1][1] == len(raw)
    with pytest.raises(TypeError, match="tensors\\['u'\\]"):
        st.save(tmp_path / "y.safetensors", {"u": torch.zeros(2, dtype=torch.uint8)}, {})
