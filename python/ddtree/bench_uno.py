"""SGLang 0.5.23's own GPU tree builder, UNO, for the UNO columns of ``python -m ddtree bench
--device cuda``: ``build_uno_tree_proposal`` from ``sglang/kernels/ops/speculative/uno_tree.py``
(flashinfer's radix top-k per depth, log-sum-exp partials over 8192-token chunks in Triton,
then one Triton program per request choosing the Q − 1 nodes best-first).

The file is loaded alone: the whole ``sglang`` package needs a serving stack (sgl-kernel,
flashinfer, ...). It comes from, in this order: the path given (the ``.py`` file itself, or
an sglang wheel), ``$DDTREE_SGLANG_WHEEL``, an installed ``sglang``. It imports only torch,
Triton and ``flashinfer.top_k``; where flashinfer is not installed, ``torch.topk`` stands in
for its top-k (sorted, the same values and ids up to the order of ties), and the benchmark
says so, since then UNO's top-k time is not its own.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
import tempfile
import types
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ._sglang_uno import capacity, parent_width

MEMBER = "sglang/kernels/ops/speculative/uno_tree.py"
# UNO's own limits (uno_tree.py): at most 128 verify nodes and 2048 candidate edges a request.
MAX_NODES, MAX_EDGES = 128, 2048


@dataclass(frozen=True)
class Uno:
    """UNO's builder and where it came from: `build` is ``build_uno_tree_proposal``,
    `topk` its top-k (called as UNO calls it), `source` the file's origin, `topk_name`
    which top-k ran."""

    build: Callable
    topk: Callable
    source: str
    topk_name: str


def uno_k(q: int, depth: int, vocab: int | None = None) -> int | None:
    """The candidates per depth UNO is run with for Q verify nodes: 8, or 16 where EAGLE's
    parent list (K·(L − 1) + 1 wide) needs it; None where no K passes UNO's own checks (Q
    at least the draft width L + 1, Q ≤ 128, Q·K ≤ 2048, K ≤ V, a K-ary tree of depth L
    holds Q nodes, Q − 1 within the parent list)."""
    for k in (8, 16):
        if (
            depth + 1 <= q <= MAX_NODES
            and q * k <= MAX_EDGES
            and (vocab is None or k <= vocab)
            and capacity(depth, k, q) >= q
            and q - 1 <= parent_width(depth, k)
        ):
            return k
    return None


def torch_top_k(x: torch.Tensor, k: int, sorted: bool = True, deterministic: bool = False):  # noqa: A002
    """flashinfer.top_k's signature on torch.topk: (values, int64 ids), sorted."""
    values, ids = torch.topk(x, k, dim=-1, sorted=True)
    return values, ids


def find_file(path: str | None) -> tuple[Path, str] | None:
    """(uno_tree.py on disk, a description of where it came from), or None when there is
    neither a given path, ``$DDTREE_SGLANG_WHEEL`` nor an installed sglang."""
    given = path or os.environ.get("DDTREE_SGLANG_WHEEL")
    if given:
        p = Path(given)
        if not p.is_file():
            raise FileNotFoundError(f"uno: no file {p}")
        if p.suffix == ".py":
            return p, str(p)
        with zipfile.ZipFile(p) as wheel:
            if MEMBER not in wheel.namelist():
                raise ValueError(f"uno: {p} has no {MEMBER}")
            text = wheel.read(MEMBER)
        out = Path(tempfile.mkdtemp(prefix="ddtree-uno-")) / "uno_tree.py"
        out.write_bytes(text)  # Triton reads a kernel's source from its file
        return out, f"{p.name}:{MEMBER}"
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    version = importlib.metadata.version("sglang")
    for root in spec.submodule_search_locations:
        p = Path(root).parent / MEMBER
        if p.is_file():
            return p, f"installed sglang {version}: {p}"
    return None


def load(path: str | None = None) -> Uno | None:
    """UNO from `path`, ``$DDTREE_SGLANG_WHEEL`` or an installed sglang; None without one."""
    found = find_file(path)
    if found is None:
        return None
    file, where = found
    have_flashinfer = importlib.util.find_spec("flashinfer") is not None
    stub = None
    if not have_flashinfer and "flashinfer" not in sys.modules:
        stub = types.ModuleType("flashinfer")
        stub.top_k = torch_top_k
        sys.modules["flashinfer"] = stub
    try:
        spec = importlib.util.spec_from_file_location("ddtree_bench_uno_tree", file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclass looks itself up there
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[spec.name]
            raise
    finally:
        if stub is not None:
            del sys.modules["flashinfer"]
    topk = module._flashinfer_top_k
    name = "flashinfer.top_k" if have_flashinfer else "torch.topk (flashinfer not installed)"
    return Uno(module.build_uno_tree_proposal, topk, where, name)
