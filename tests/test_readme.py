"""The README's "Use" example runs as it stands: its first ``python`` block on the CPU (in
CI), and on a GPU with ``device, dtype = "cuda", torch.bfloat16``, followed by its second
block, which captures the round in a CUDA graph."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
CPU_LINE = 'device, dtype = "cpu", torch.float32'
CUDA_LINE = 'device, dtype = "cuda", torch.bfloat16'


def use_blocks() -> list[str]:
    """The ``python`` code blocks of the README's "## Use" section, in order."""
    text = README.read_text(encoding="utf-8")
    section = re.search(r"^## Use\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, 'README.md has no "## Use" section'
    return re.findall(r"^```python\n(.*?)^```", section.group(1), re.S | re.M)


def run(code: str, namespace: dict) -> dict:
    exec(compile(code, str(README), "exec"), namespace)
    return namespace


def test_the_use_section_has_the_example_and_its_cuda_capture():
    blocks = use_blocks()
    assert len(blocks) == 2, len(blocks)
    assert CPU_LINE in blocks[0]
    assert "torch.cuda.graph" in blocks[1]


def test_the_example_runs_on_the_cpu(capsys):
    ns = run(use_blocks()[0], {"__name__": "readme"})
    assert ns["device"] == "cpu"
    # The stand-in target prefers each node's best child, so the walk goes past the root.
    assert (ns["acc"].accept_len > 1).all()
    assert ns["host"]["status"].tolist() == [0, 0]
    assert ns["attn"].shape == (ns["bs"] * ns["Q"], ns["hq"], ns["d"])
    assert "accepted:" in capsys.readouterr().out


def test_the_readme_refers_to_no_issue():
    text = README.read_text(encoding="utf-8")
    assert not re.search(r"\bissues? #?\d", text, re.I), "README.md refers to an issue"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_example_and_its_capture_run_on_cuda(capsys):
    first, capture = use_blocks()
    ns = run(first.replace(CPU_LINE, CUDA_LINE), {"__name__": "readme"})
    assert ns["tree"].verify_ids.is_cuda and ns["attn"].dtype == torch.bfloat16
    assert (ns["acc"].accept_len > 1).all()
    run(capture, ns)
    assert "last round:" in capsys.readouterr().out
    assert (ns["acc"].status == 0).all()
