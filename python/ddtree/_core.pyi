"""Type stubs of the private extension module ``ddtree._core`` (the Rust CPU path).

Every pointer is the ``data_ptr()`` of a live, already-validated tensor; see
``crates/ddtree-py/src/tensor.rs`` for the contract. A ``Tree``, an ``Acceptance`` or a
``SamplingState`` is handed over whole: ``crates/ddtree-py/src/buffers.rs`` reads each
field's ``data_ptr()``.
"""

from torch import Tensor

from ._sampling import SamplingState
from ._types import Acceptance, Tree

MAX_DEPTH: int
MAX_BUDGET: int
STATUS_OK: int
STATUS_NON_FINITE: int
STATUS_ROOT_OUT_OF_VOCAB: int
STATUS_NEGATIVE_PREFIX: int
STATUS_BAD_TREE_LINK: int
STATUS_NODE_OUT_OF_RANGE: int
STATUS_SLOT_OUT_OF_RANGE: int

TensorArg = dict[str, object]  # ptr: int, dtype: str, shape / strides: tuple[int, ...]

def build_tree(
    draft_logits: TensorArg,
    root_tokens: int,
    prefix_lens: int,
    budget: int,
    topk: int | None,
    out: Tree,
) -> int: ...
def select_emit(
    eligible: int,
    root_tokens: int,
    prefix_lens: int,
    shape: list[int],
    budget: int,
    topk: int | None,
    out: Tree,
) -> None: ...
def accept_tokens(posterior_tokens: int, tree: Tree, acc: Acceptance) -> None: ...
def accept_greedy(target_logits: TensorArg, tree: Tree, acc: Acceptance) -> None: ...
def accept_sampled(
    target_logits: TensorArg,
    tree: Tree,
    acc: Acceptance,
    temperature: int,
    top_k: int,
    top_p: int,
    seed: int,
) -> None: ...
def tree_fields(bs: int, depth: int, k: int, budget: int) -> list[tuple[str, str, list[int]]]: ...
def acceptance_fields(bs: int, depth: int) -> list[tuple[str, str, list[int]]]: ...
def sglang_custom_mask(
    ancestor_bits: int, bs: int, q: int, seq_lens: int, write_prefix: bool, out: int, out_len: int
) -> int: ...

CUDA_MAX_BUDGET: int
CUDA_MAX_K: int
CUDA_MAX_DEPTH: int

def cuda_build_tree(
    device: int,
    stream: int,
    draft_logits: TensorArg,
    root_tokens: int,
    prefix_lens: int,
    budget: int,
    k: int,
    out: Tree,
    scratch: dict[str, Tensor],
    stages: int = 7,
) -> None: ...
def cuda_full_mask(
    device: int,
    stream: int,
    ancestor_bits: int,
    seq_lens: int,
    bs: int,
    q: int,
    write_prefix: bool,
    out: int,
    out_len: int,
) -> None: ...
def cuda_images() -> list[tuple[str, bool, int]]: ...
def cuda_prepare(device: int) -> None: ...
def cuda_accept(
    device: int,
    stream: int,
    target_logits: TensorArg,
    tree: Tree,
    acc: Acceptance,
    sampling: SamplingState | None = None,
) -> None: ...
def cuda_kept_slots(
    device: int,
    stream: int,
    acc: Acceptance,
    q: int,
    window: int,
    slots: int | None,
    kept: int,
    release: int,
) -> None: ...
def cuda_compact_kv(
    device: int,
    stream: int,
    acc: Acceptance,
    q: int,
    window: int,
    buffers: int,
    count: int,
    row_bytes: int,
    slots: int,
) -> None: ...
def cuda_gather_hidden(
    device: int,
    stream: int,
    acc: Acceptance,
    q: int,
    hidden: int,
    row_bytes: int,
    out: int,
) -> None: ...
def cuda_mapped_pointer(device: int, host: int) -> int: ...
def readback_layout(bs: int, path_len: int, max_batch: int) -> dict[str, int]: ...
def readback_newest(
    host: int, nslots: int, slot_words: int, after: int, out: int
) -> int | None: ...
def cuda_tree_attention(device: int, stream: int, a: dict[str, object], f16: bool) -> None: ...
def attention_tile(dqk: int) -> tuple[int, int] | None: ...

# (temperature, top_k, top_p): each a checked number or a [bs] float/int tensor.
SamplingParams = tuple[float | Tensor, int | Tensor, float | Tensor]

class CudaEngine:
    """The Rust round engine behind a CUDA Stepper (crates/ddtree-py/src/engine.rs)."""

    def __init__(
        self,
        device: int,
        limits: tuple[int, int, int, int, int | None],
        tree: Tree,
        acc: Acceptance,
        scratch: dict[str, Tensor],
        sampling: SamplingState,
        ring: tuple[int, int, int, int],
        kept_release: tuple[Tensor, Tensor],
    ) -> None: ...
    def step(
        self, draft_logits: Tensor, root_tokens: Tensor, prefix_lens: Tensor
    ) -> tuple[int, int, int, int]: ...
    def accept(
        self,
        target_logits: Tensor,
        sampled: bool,
        readback: bool,
        params: SamplingParams | None = None,
        seed: int | None = None,
    ) -> tuple[int, int, int, int]: ...
    def check_target(self, target_logits: Tensor, params: SamplingParams | None = None) -> None: ...
    eager_graphs: bool  # write-only: eager steps as one graph launch (default) or plain
    @property
    def graphs(self) -> int: ...
    def resume(self, round: tuple[int, int, int, int]) -> None: ...
    def publish(self) -> None: ...
    def kept_slots(self, out_cache_loc: Tensor, num_slots: int | None, readback: bool) -> None: ...

class CpuEngine:
    """The CPU twin of CudaEngine behind a CPU Stepper (crates/ddtree-py/src/cpu_engine.rs)."""

    def __init__(self, limits: tuple[int, int, int, int, int | None], tree: Tree) -> None: ...
    def step(
        self, draft_logits: Tensor, root_tokens: Tensor, prefix_lens: Tensor
    ) -> tuple[int, int, int, int]: ...
    def check_target(self, target_logits: Tensor) -> None: ...
