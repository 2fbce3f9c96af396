"""SGLang 0.5.23's own GPU tree builder, UNO, for the UNO columns of ``python -m ddtree bench
--device cuda``: ``build_uno_tree_proposal`` from ``sglang/kernels/ops/speculative/uno_tree.py``
(flashinfer's radix top-k per depth, log-sum-exp partials over 8192-token chunks in Triton,
then one Triton program per request choosing the Q − 1 nodes best-first).

The file is loaded alone: the whole ``sglang`` package needs a serving stack (sgl-kernel,
flashinfer, ...). It comes from, in this order: the path given (the ``.py`` file itself, or
an sglang wheel), ``$DDTREE_SGLANG_WHEEL``, an installed ``sglang``. It imports only torch,
Triton and ``flashinfer.top_k``. Where flashinfer is not installed its top-k comes, in this
order, from a library built from flashinfer's own headers (``tests/flashinfer_topk``: the
radix kernel ``flashinfer.top_k`` runs for UNO's call, given as ``topk_lib`` or
``$DDTREE_FLASHINFER_TOPK``; `flashinfer_top_k`), else from ``torch.topk`` (sorted, the same
values and ids up to the order of ties); the benchmark says which, since with ``torch.topk``
UNO's top-k time is not its own.
"""

from __future__ import annotations

import ctypes
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
# The flashinfer SGLang 0.5.23 pins (its wheel's Requires-Dist: flashinfer_python==0.7.2).
FLASHINFER_VERSION = "0.7.2"


@dataclass(frozen=True)
class Uno:
    """UNO's builder and where it came from: `build` is ``build_uno_tree_proposal``,
    `topk` its top-k (called as UNO calls it), `source` the file's origin, `topk_name`
    which top-k ran."""

    build: Callable
    topk: Callable
    source: str
    topk_name: str
    own_topk: bool = False  # `topk` is flashinfer's (then UNO's whole time is its own)


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


_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


class TopKLibraryError(OSError):
    """The flashinfer top-k library named (``--uno-topk``, ``$DDTREE_FLASHINFER_TOPK``) could
    not be loaded: told apart from a UNO file that fails to load."""


def radix_topk_entry(lib_path: str | os.PathLike):
    """``ddtree_fi_radix_topk`` of a library built by ``tests/flashinfer_topk/build.sh``,
    typed: (dtype code, input, int32 ids, values, rows, k, d, row states, sorted,
    deterministic, stream) -> cudaError_t."""
    try:
        run = ctypes.CDLL(str(lib_path)).ddtree_fi_radix_topk
    except (OSError, AttributeError) as e:
        raise TopKLibraryError(f"{lib_path}: {e}") from e
    run.restype = ctypes.c_int
    p, u = ctypes.c_void_p, ctypes.c_uint
    run.argtypes = [ctypes.c_int, p, p, p, u, u, u, p, ctypes.c_int, ctypes.c_int, p]
    return run


def flashinfer_top_k(lib_path: str | os.PathLike) -> Callable:
    """``flashinfer.top_k`` (0.7.2) as UNO calls it, on the radix dispatch of a library built by
    ``tests/flashinfer_topk/build.sh`` from flashinfer's own headers. For ``sorted=True``,
    ``deterministic=False`` off SM100, flashinfer/topk.py takes its native radix branch:
    ``TopKDispatch`` unsorted into int32 ids and a zeroed 1 MiB row-state buffer kept per
    device, then ``torch.sort`` (descending, not stable) and a gather, the ids widened to
    int64. That branch is all the library has, so other calls raise ``ValueError``."""
    run = radix_topk_entry(lib_path)
    states: dict = {}

    def top_k(input: torch.Tensor, k: int, sorted: bool = False, deterministic: bool = False):  # noqa: A002
        if not sorted or deterministic:
            raise ValueError("flashinfer_top_k: only UNO's call (sorted, not deterministic)")
        if input.dim() != 2 or not input.is_contiguous() or input.dtype not in _DTYPE_CODES:
            raise ValueError("flashinfer_top_k: input must be a contiguous 2-D fp32/fp16/bf16")
        if torch.cuda.get_device_capability(input.device)[0] == 10:
            raise ValueError("flashinfer_top_k: SM100 takes flashinfer's clusters kernel")
        rows, d = input.shape
        dev = input.device
        if dev not in states:
            states[dev] = torch.zeros(1 << 20, dtype=torch.uint8, device=dev)
        values = torch.empty(rows, k, dtype=input.dtype, device=dev)
        ids = torch.empty(rows, k, dtype=torch.int32, device=dev)
        stream = torch.cuda.current_stream(dev).cuda_stream
        err = run(
            _DTYPE_CODES[input.dtype], input.data_ptr(), ids.data_ptr(), values.data_ptr(),
            rows, k, d, states[dev].data_ptr(), 0, 0, stream,
        )  # fmt: skip
        if err != 0:
            raise RuntimeError(f"flashinfer_top_k: TopKDispatch returned CUDA error {err}")
        values, order = torch.sort(values, dim=-1, descending=True, stable=False)
        return values, torch.gather(ids.long(), -1, order)

    return top_k


def load(path: str | None = None, topk_lib: str | None = None) -> Uno | None:
    """UNO from `path`, ``$DDTREE_SGLANG_WHEEL`` or an installed sglang; None without one.
    Without flashinfer, its top-k is `flashinfer_top_k` of `topk_lib` (default
    ``$DDTREE_FLASHINFER_TOPK``) where one is given, else `torch_top_k`."""
    found = find_file(path)
    if found is None:
        return None
    file, where = found
    have_flashinfer = importlib.util.find_spec("flashinfer") is not None
    topk_lib = topk_lib or os.environ.get("DDTREE_FLASHINFER_TOPK")
    stub = None
    if have_flashinfer:
        name, own = "flashinfer.top_k", True
    elif topk_lib:
        built = f"{Path(topk_lib).name}, built by tests/flashinfer_topk/build.sh"
        name, own = f"flashinfer {FLASHINFER_VERSION}'s radix top-k ({built})", True
    else:
        name, own = "torch.topk (flashinfer not installed)", False
    if not have_flashinfer and "flashinfer" not in sys.modules:
        stub = types.ModuleType("flashinfer")
        stub.top_k = flashinfer_top_k(topk_lib) if topk_lib else torch_top_k
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
    return Uno(module.build_uno_tree_proposal, module._flashinfer_top_k, where, name, own)
