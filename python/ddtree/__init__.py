"""ddtree: DDTree speculative-decoding rounds — tree build, verify inputs, accept, commit.

``build_tree`` / ``accept_tree`` allocate their outputs; ``Stepper`` reuses static buffers.
CPU tensors run the Rust CPU path; ``ddtree.reference`` is the plain-Python oracle.
"""

from ._api import accept_tree, build_tree
from ._commit import compact_kv, gather_hidden, kept_slots
from ._types import Acceptance, Tree
from .stepper import Stepper

# Tree.status codes. On CUDA the last two replace the ValueErrors the CPU path raises, since
# checking them on the host would need a sync; such a request gets the root-only tree.
STATUS_OK = 0
STATUS_NON_FINITE = 1  # NaN or +inf in the request's draft logits
STATUS_ROOT_OUT_OF_VOCAB = 2
STATUS_NEGATIVE_PREFIX = 3

__all__ = [
    "Acceptance",
    "STATUS_NEGATIVE_PREFIX",
    "STATUS_NON_FINITE",
    "STATUS_OK",
    "STATUS_ROOT_OUT_OF_VOCAB",
    "Stepper",
    "Tree",
    "accept_tree",
    "build_tree",
    "compact_kv",
    "gather_hidden",
    "kept_slots",
]
