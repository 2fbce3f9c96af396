"""SGLang 0.5.23's own kernel modules, loaded from its PyPI wheel for the tests (Apache-2.0).

The whole ``sglang`` package needs a serving stack (sgl-kernel, flashinfer, …) that neither
CI nor the lent GPU has, so only the module files the tests run are taken from the wheel,
verbatim: the Triton tree build and greedy verify (``spec_tree.py``), UNO's tree builder
(``uno_tree.py``), the verify-commit and kept-slot kernels (``eagle.py``, ``cache_locs.py``),
the KV pool's row mover (``cache_move.py``) and the Triton extend attention
(``extend_attention.py`` with its two imports). Around them sit stub modules for what they
import only to probe the platform (``sglang.srt.utils``, ``platforms``, ``environ``), and a
``flashinfer.top_k`` stand-in (``torch.topk``; flashinfer is not installed) for UNO.

Without a GPU the Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set
before they are decorated), on CPU tensors.

The wheel: ``$DDTREE_SGLANG_WHEEL`` if set, else ``pip download sglang==0.5.23 --no-deps``
(PyPI). The extracted tree is kept in ``tests/.sglang-0.5.23`` (git-ignored; the GPU run
carries it, the GPU machine has no network).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

VERSION = "0.5.23"
ROOT = Path(__file__).resolve().parent / f".sglang-{VERSION}"
FILES = (
    "sglang/kernels/ops/speculative/spec_tree.py",
    "sglang/kernels/ops/speculative/uno_tree.py",
    "sglang/kernels/ops/speculative/eagle.py",
    "sglang/kernels/ops/speculative/cache_locs.py",
    "sglang/kernels/ops/kvcache/cache_move.py",
    "sglang/kernels/ops/attention/extend_attention.py",
    "sglang/kernels/ops/attention/decode_attention.py",
    "sglang/kernels/ops/attention/score_mod.py",
    "sglang/srt/speculative/uno_worker_v2.py",
    "sglang/srt/arg_groups/speculative_hook.py",
)
PACKAGES = (
    "sglang",
    "sglang/srt",
    "sglang/kernels",
    "sglang/kernels/ops",
    "sglang/kernels/ops/speculative",
    "sglang/kernels/ops/attention",
    "sglang/kernels/ops/kvcache",
)

STUBS = {
    "sglang/srt/utils.py": """
import torch

def is_cuda():
    return torch.cuda.is_available() and torch.version.cuda is not None

def next_power_of_2(n):
    return 1 << (int(n) - 1).bit_length()

def get_device_core_count(device_id=0):
    return torch.cuda.get_device_properties(device_id).multi_processor_count

def __getattr__(name):
    if name.startswith("is_"):
        return lambda *args, **kwargs: False  # hip, npu, musa, xpu, cpu, gfx…: not these
    raise AttributeError(name)
""",
    "sglang/srt/platforms/__init__.py": "current_platform = None\n",
    "sglang/srt/platforms/interface.py": """
def reject_out_of_tree_path(platform, subsystem):
    raise RuntimeError(f"{subsystem}: not available in the test stubs")
""",
    "sglang/srt/environ.py": """
class _Flag:
    def get(self):
        return False

class _Envs:
    def __getattr__(self, name):
        return _Flag()

envs = _Envs()
""",
    # spec_tree imports SGLang's JIT CUDA tree kernels on CUDA (tvm-ffi + nvcc at run time,
    # neither on the lent GPU); the tests call its Triton kernels instead.
    "sglang/kernels/ops/speculative/tree.py": """
def _jit_only(*args, **kwargs):
    raise RuntimeError("SGLang's JIT CUDA tree kernels are not loaded in the tests")

build_tree_kernel_efficient = verify_tree_greedy = _jit_only
""",
    "flashinfer/__init__.py": '''
import os

import torch

# flashinfer's own radix top-k where $DDTREE_FLASHINFER_TOPK names a build of it
# (tests/flashinfer_topk/build.sh), else torch.topk stands in.
_LIB = os.environ.get("DDTREE_FLASHINFER_TOPK")
if _LIB:
    from ddtree.bench_uno import flashinfer_top_k

    top_k = flashinfer_top_k(_LIB)
    TOP_K = "flashinfer 0.7.2's radix top-k (tests/flashinfer_topk)"
else:
    TOP_K = "torch.topk (standing in for flashinfer's)"

    def top_k(x, k, sorted=True, deterministic=False):
        """Stand-in for flashinfer's radix top-k: torch.topk (values, int64 ids)."""
        values, ids = torch.topk(x, k, dim=-1, sorted=True)
        return values, ids
''',
}


def wheel_path(workdir: Path) -> Path:
    given = os.environ.get("DDTREE_SGLANG_WHEEL")
    if given:
        return Path(given)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", f"sglang=={VERSION}", "--no-deps"]
        + ["--quiet", "-d", str(workdir)],
        check=True,
    )
    return next(workdir.glob("sglang-*.whl"))


def extract(root: Path = ROOT) -> Path:
    """The module tree under ``root`` (extracted once)."""
    if (root / FILES[0]).exists():
        write_stubs(root)  # a tree extracted before a stub changed gets the new one
        return root
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel_path(Path(tmp))) as wheel:
            for name in FILES:
                target = root / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(wheel.read(name))
    for package in PACKAGES:
        (root / package / "__init__.py").touch()
    write_stubs(root)
    return root


def write_stubs(root: Path) -> None:
    for name, text in STUBS.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text() != text.lstrip():
            target.write_text(text.lstrip())


def load(module: str):
    """``sglang.kernels.ops.…`` from the extracted wheel; interpreted Triton without a GPU."""
    root = str(extract())
    if root not in sys.path:
        sys.path.insert(0, root)
    if not torch.cuda.is_available():
        interpreted = os.environ.get("TRITON_INTERPRET") == "1"
        if "triton.language" in sys.modules and not interpreted:
            raise RuntimeError(
                "triton.language was imported before TRITON_INTERPRET=1 was set "
                "(tests/conftest.py sets it first when there is no GPU)"
            )
        os.environ["TRITON_INTERPRET"] = "1"
    return importlib.import_module(module)


def source(name: str) -> str:
    """A file of the wheel as released (for the patch test)."""
    return (extract() / name).read_text()


def greedy_outputs(bs: int, q: int, depth: int, device):
    """What ``eagle_sample`` allocates for the greedy walk: ``predict`` int32 ``[bs*Q]``,
    ``accept_index`` int32 ``[bs, L+1]`` and the accepted-draft counts int32 ``[bs]``."""
    return (
        torch.zeros(bs * q, dtype=torch.int32, device=device),
        torch.full((bs, depth + 1), -1, dtype=torch.int32, device=device),
        torch.empty(bs, dtype=torch.int32, device=device),
    )


def greedy_verify(spec_tree, inputs: dict, target: torch.Tensor, outputs) -> tuple:
    """SGLang's greedy tree verify as ``eagle_sample`` runs it on ``inputs`` (the
    ``EagleVerifyInput`` fields): argmax over every target row ``[bs, Q, V]``, then its
    Triton ``verify_tree_greedy``, into ``outputs`` (reset first, as a fresh allocation)."""
    predict, accept_index, drafts = outputs
    bs, q = inputs["retrieve_index"].shape
    predict.zero_()
    accept_index.fill_(-1)
    spec_tree.verify_tree_greedy_triton(
        predict,
        accept_index,
        drafts,
        inputs["draft_token"].view(bs, q),
        inputs["retrieve_index"],
        inputs["retrieve_next_token"],
        inputs["retrieve_next_sibling"],
        torch.argmax(target.reshape(bs * q, -1), dim=-1).view(bs, q),
    )
    return outputs
