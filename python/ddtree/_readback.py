"""The host side of the readback ring: pinned slots the readback kernel stores acceptances
into (``kernels/include/ddtree/readback.cuh``), and the reader that finds the newest whole
one without a sync or an event.

The ring's cursor is in device memory and the kernel advances it, so every execution of a
readback — eager, ``Stepper.replay``, or a replay of a graph the caller captured — writes
the next slot, stamped with its round. The reader (Rust: ``RingReader`` in
``crates/ddtree-cuda/src/readback.rs``) checks a slot's end stamp, copies the slot, then
re-checks its begin stamp (a seqlock): a slot rewritten while it was copied is skipped,
never returned torn."""

from __future__ import annotations

import numpy as np
import torch

from . import _core, _cuda

# Slots in the ring: a slot is rewritten READBACK_SLOTS rounds after it was written, so a
# round stays readable until then. readback() returns the newest whole round; a host that
# polls less often than once per round skips the rounds in between (they are still whole in
# the ring, and in the device Acceptance of their round).
READBACK_SLOTS = 4


class ReadbackRing:
    def __init__(self, max_batch: int, path_len: int, device: torch.device, nslots: int):
        self.device = device
        self.max_batch = max_batch
        self.slot_words = _core.readback_layout(max_batch, path_len, max_batch)["slot_words"]
        self.host = torch.zeros(nslots, self.slot_words, dtype=torch.int64, pin_memory=True)
        if not _cuda.maps_host(device, self.host):
            raise RuntimeError(
                "Stepper: the driver does not map pinned host memory into the device's "
                "address space, which the readback ring needs"
            )
        self.cursor = torch.zeros(1, dtype=torch.int64, device=device)
        # What the engine builds the readback kernel's ReadbackRing from: the pinned slots
        # (mapped there), the cursor, slot words, slots.
        self.device_side = (self.host, self.cursor, self.slot_words, nslots)
        self.nslots = nslots
        self._slot = torch.zeros(self.slot_words, dtype=torch.int64)  # the reader's copy
        self.returned = 0  # stamp (round + 1) of the newest slot returned; 0: none
        self._layouts: dict[tuple, dict] = {}

    def newest(self, fresh_only: bool = True) -> dict | None:
        """The newest whole slot (not returned before, with ``fresh_only``), or None. The
        seqlock read is Rust's (``RingReader``); this turns the copied slot into tensors."""
        after = self.returned if fresh_only else 0
        got = _core.readback_newest(self.host, self.nslots, self.slot_words, after, self._slot)
        if got is None:
            return None
        self.returned = max(self.returned, got)
        data = self._slot.numpy().copy()
        bs, path = int(data[1]), int(data[2])
        at = self._layout(bs, path)
        tensor = torch.from_numpy
        return {
            "accept_len": tensor(data[at["accept_len"] : at["bonus"]]),
            "bonus": tensor(data[at["bonus"] : at["accepted_tokens"]]),
            "accepted_tokens": tensor(data[at["accepted_tokens"] : at["status"]]).view(bs, path),
            "status": tensor(data[at["status"] : at["end"]].astype(np.int32)),
            "round": got - 1,
        }

    def _layout(self, bs: int, path: int) -> dict:
        key = (bs, path)
        if key not in self._layouts:
            self._layouts[key] = _core.readback_layout(bs, path, self.max_batch)
        return self._layouts[key]
