"""Type stubs of the private extension module ``ddtree._core`` (the Rust CPU path).

Every tensor argument is a live, already-validated tensor whose address, shape and strides
Rust reads itself (the package never handles a raw pointer); see
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

def build_tree(
    draft_logits: Tensor,
    root_tokens: Tensor,
    prefix_lens: Tensor,
    budget: int,
    topk: int | None,
    out: Tree,
) -> int: ...
def shard_partials(
    shard_logits: Tensor,
    start: int,
    k: int,
    values: Tensor,
    ids: Tensor,
    maxima: Tensor,
    bad: Tensor,
) -> None: ...
def shard_sums(shard_logits: Tensor, maxima: Tensor, sums: Tensor) -> None: ...
def merge_partials(
    tp: int,
    rows: int,
    k: int,
    values: Tensor,
    ids: Tensor,
    bad: Tensor,
    sums: Tensor,
    maxima: Tensor,
    lp: Tensor,
    ti: Tensor,
    eligible: Tensor,
) -> None: ...
def shard_posteriors(
    target_shard: Tensor,
    start: int,
    temperature: Tensor,
    seed: int,
    values: Tensor,
    ids: Tensor,
) -> None: ...
def select_emit(
    eligible: Tensor,
    root_tokens: Tensor,
    prefix_lens: Tensor,
    shape: list[int],
    budget: int,
    topk: int | None,
    out: Tree,
) -> None: ...
def accept_tokens(posterior_tokens: Tensor, tree: Tree, acc: Acceptance) -> None: ...
def accept_greedy(target_logits: Tensor, tree: Tree, acc: Acceptance) -> None: ...
def accept_sampled(
    target_logits: Tensor,
    tree: Tree,
    acc: Acceptance,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    seed: int,
) -> None: ...
def tree_fields(bs: int, depth: int, k: int, budget: int) -> list[tuple[str, str, list[int]]]: ...
def acceptance_fields(bs: int, depth: int) -> list[tuple[str, str, list[int]]]: ...
def sglang_custom_mask(
    ancestor_bits: Tensor,
    bs: int,
    q: int,
    seq_lens: Tensor,
    write_prefix: bool,
    out: Tensor,
    out_len: int,
) -> int: ...

CUDA_MAX_BUDGET: int
CUDA_MAX_K: int
CUDA_MAX_DEPTH: int
CUDA_MAX_PART_ENTRIES: int

def cuda_build_tree(
    device: int,
    stream: int,
    draft_logits: Tensor,
    root_tokens: Tensor,
    prefix_lens: Tensor,
    budget: int,
    k: int,
    out: Tree,
    scratch: dict[str, Tensor],
    stages: int = 7,
) -> None: ...
def cuda_full_mask(
    device: int,
    stream: int,
    ancestor_bits: Tensor,
    seq_lens: Tensor,
    bs: int,
    q: int,
    write_prefix: bool,
    out: Tensor,
    out_len: int,
) -> None: ...
def cuda_stage1_parts(
    device: int,
    stream: int,
    which: str,
    logits: Tensor,
    chunk: int,
    part_base: int,
    id0: int,
    arrays: dict[str, Tensor],
) -> None: ...
def cuda_stage1_merge(
    device: int,
    stream: int,
    arrays: dict[str, Tensor],
    lp: Tensor,
    ti: Tensor,
    eligible: Tensor,
    row_bad: Tensor,
) -> None: ...
def cuda_part_chunk(vocab: int, k: int, rows: int, blocks: int) -> int: ...
def cuda_images() -> list[tuple[str, bool, int]]: ...
def cuda_kernel_resources(
    module: str, arch: int
) -> list[tuple[str, int, int, int, int]] | None: ...
def cuda_attention_tiles() -> list[tuple[str, int, int]]: ...
def cuda_prepare(device: int) -> None: ...
def cuda_accept(
    device: int,
    stream: int,
    target_logits: Tensor,
    tree: Tree,
    acc: Acceptance,
    sampling: SamplingState | None = None,
) -> None: ...
def cuda_shard_keys(
    device: int,
    stream: int,
    shard: Tensor,
    vocab_start: int,
    vocab: int,
    greedy: Tensor,
    sampled: Tensor,
    sampling: SamplingState | None = None,
) -> None: ...
def cuda_walk_keys(
    device: int,
    stream: int,
    tp: int,
    greedy: Tensor,
    sampled: Tensor,
    tree: Tree,
    acc: Acceptance,
    temperature: Tensor | None = None,
) -> None: ...
def cuda_kept_slots(
    device: int,
    stream: int,
    acc: Acceptance,
    q: int,
    window: Tensor,
    slots: int | None,
    kept: Tensor,
    release: Tensor,
) -> None: ...
def cuda_compact_kv(
    device: int,
    stream: int,
    acc: Acceptance,
    q: int,
    window: Tensor,
    buffers: Tensor,
    count: int,
    row_bytes: int,
    slots: int,
) -> None: ...
def cuda_gather_hidden(
    device: int,
    stream: int,
    acc: Acceptance,
    q: int,
    hidden: Tensor,
    row_bytes: int,
    out: Tensor,
) -> None: ...
def cuda_maps_host(device: int, host: Tensor) -> bool: ...
def cuda_cache_table(caches: list[Tensor], device: object) -> Tensor: ...
def readback_layout(bs: int, path_len: int, max_batch: int) -> dict[str, int]: ...
def readback_newest(
    host: Tensor, nslots: int, slot_words: int, after: int, out: Tensor
) -> int | None: ...
def cuda_tree_attention(
    device: int, stream: int, a: dict[str, object], plan: AttentionPlan
) -> None: ...  # a: _attention.launch_arg's dict plus the workspace's part and status

class AttentionPlan:
    """An attention workspace's launch plan (crates/ddtree-cuda's SplitPlan)."""

    def __init__(
        self, device: int, max_batch: int, q_nodes: int, hq: int, hkv: int, dqk: int, dv: int
    ) -> None: ...
    def splits(self, bs: int) -> int: ...
    @property
    def part_floats(self) -> int: ...
    @property
    def tile(self) -> str: ...

# (temperature, top_k, top_p): each None, a number or a [bs] float/int tensor (checked by
# the engine).
SamplingParams = tuple[float | Tensor | None, int | Tensor | None, float | Tensor | None]

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
        ring: tuple[Tensor, Tensor, int, int],  # pinned host slots, device cursor, words, slots
        kept_release: tuple[Tensor, Tensor],
    ) -> None: ...
    def step(
        self, draft_logits: Tensor, root_tokens: Tensor, prefix_lens: Tensor
    ) -> tuple[int, int, int, int]: ...
    def accept(
        self,
        target_logits: Tensor,
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
    def register_caches(self, table: Tensor, count: int, row_bytes: int, slots: int) -> None: ...
    def compact_kv(self, out_cache_loc: Tensor, readback: bool) -> None: ...
    def gather_hidden(self, hidden: Tensor, out: Tensor, readback: bool) -> None: ...
    def prepare_attention(
        self, heads: tuple[int, int], dims: tuple[int, int]
    ) -> int: ...  # (hq, hkv), (dqk, dv); returns the partials' fp32 size
    def tree_attention(self, arg: dict[str, object]) -> None: ...  # _attention.launch_arg
    def attention_workspaces(
        self,
    ) -> list[tuple[list[int], Tensor, Tensor]]: ...  # (hq, hkv, dqk, dv), part, status

class CpuEngine:
    """The CPU twin of CudaEngine behind a CPU Stepper (crates/ddtree-py/src/cpu_engine.rs)."""

    def __init__(
        self, limits: tuple[int, int, int, int, int | None], tree: Tree, acc: Acceptance
    ) -> None: ...
    def step(
        self, draft_logits: Tensor, root_tokens: Tensor, prefix_lens: Tensor
    ) -> tuple[int, int, int, int]: ...
    def check_target(self, target_logits: Tensor) -> None: ...
    def accept(
        self,
        target_logits: Tensor,
        params: tuple[Tensor, Tensor, Tensor] | None = None,  # [bs] f64, i64, f64
        seed: int = 0,
    ) -> tuple[int, int, int, int]: ...
