"""ddtree: DDTree speculative-decoding rounds — tree build, verify inputs, accept, commit.

``build_tree`` / ``accept_tree`` allocate their outputs; ``Stepper`` reuses static buffers.
CPU tensors run the Rust CPU path; ``ddtree.reference`` is the plain-Python oracle.
"""

from ._api import accept_tree, build_tree
from ._attention import AttentionWorkspace, tree_attention
from ._commit import compact_kv, gather_hidden, kept_slots

# Per-request status codes (Tree.status, Acceptance.status), defined once in the Rust core
# (crates/ddtree-core/src/status.rs, which says what each stage does with such a request).
# Values a host check would need a sync for become codes on CUDA: build — NaN/+inf draft
# logits (also on the CPU), a root token outside the vocabulary, a negative prefix length
# (the CPU path raises ValueError for the last two); accept — corrupt tree links; commit — an
# accepted node or a KV slot out of range (the CPU commit gives the same codes).
from ._core import (
    STATUS_BAD_TREE_LINK,
    STATUS_NEGATIVE_PREFIX,
    STATUS_NODE_OUT_OF_RANGE,
    STATUS_NON_FINITE,
    STATUS_OK,
    STATUS_ROOT_OUT_OF_VOCAB,
    STATUS_SLOT_OUT_OF_RANGE,
)
from ._types import Acceptance, Tree
from .stepper import Stepper

__all__ = [
    "Acceptance",
    "AttentionWorkspace",
    "STATUS_BAD_TREE_LINK",
    "STATUS_NEGATIVE_PREFIX",
    "STATUS_NODE_OUT_OF_RANGE",
    "STATUS_NON_FINITE",
    "STATUS_OK",
    "STATUS_ROOT_OUT_OF_VOCAB",
    "STATUS_SLOT_OUT_OF_RANGE",
    "Stepper",
    "Tree",
    "accept_tree",
    "build_tree",
    "compact_kv",
    "gather_hidden",
    "kept_slots",
    "tree_attention",
]
