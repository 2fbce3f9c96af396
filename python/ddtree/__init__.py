"""ddtree: DDTree speculative-decoding rounds — tree build, verify inputs, accept.

``build_tree`` / ``accept_tree`` allocate their outputs; ``Stepper`` reuses static buffers.
CPU tensors run the Rust CPU path; ``ddtree.reference`` is the plain-Python oracle.
"""

from ._api import accept_tree, build_tree
from ._types import Acceptance, Tree
from .stepper import Stepper

STATUS_OK = 0
STATUS_NON_FINITE = 1

__all__ = [
    "Acceptance",
    "STATUS_NON_FINITE",
    "STATUS_OK",
    "Stepper",
    "Tree",
    "accept_tree",
    "build_tree",
]
