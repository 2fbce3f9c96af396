"""Device state of the GPU sampling accept: per-request parameters and the generator.

The kernel reads everything from device memory, so a captured graph replays with whatever
values were last written here, and the generator's offset advances on the device after
every accept: each replay draws fresh numbers, and a seed reproduces a run.
"""

from __future__ import annotations

import math
import numbers

import torch

SEED_MASK = (1 << 63) - 1
# The value rules, shared with the CPU path's checks of whole tensors (_api.sampling_params).
TEMPERATURE_RULE = "temperature: must be finite and ≥ 0"
TOP_P_RULE = "top_p: must be in (0, 1]"
# Each per-request parameter: name, the kind of a scalar, and the value that turns it off.
PARAMS = (
    ("temperature", numbers.Real, 0.0),
    ("top_k", numbers.Integral, 0),
    ("top_p", numbers.Real, 1.0),
)


def _check_scalar(name: str, value, kind) -> None:
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name}: expected None, a number or a tensor, got {type(value).__name__}")
    if name == "temperature" and not (math.isfinite(value) and value >= 0):
        raise ValueError(TEMPERATURE_RULE)
    if name == "top_p" and not (0 < value <= 1):
        raise ValueError(TOP_P_RULE)
    if name == "top_k" and value < 0:
        raise ValueError("top_k: must be ≥ 0 (0 = off)")


def is_greedy_number(temperature) -> bool:
    """True for None or a number equal to 0 (numpy's and Fraction's too: no seed is drawn
    for a greedy accept); anything else is left to the engine's checks."""
    return temperature is None or (
        isinstance(temperature, numbers.Real)
        and not isinstance(temperature, bool)
        and temperature == 0
    )


def is_greedy(temperature) -> bool:
    """True when no request samples: temperature None or a scalar 0 (a tensor may hold
    any mix, so it always takes the sampling kernel, which is greedy where it is 0)."""
    if temperature is None:
        return True
    if isinstance(temperature, torch.Tensor):
        return False
    _check_scalar("temperature", temperature, numbers.Real)
    return temperature == 0


class SamplingState:
    """float32 temperature, int32 top_k and float32 top_p ``[n]``, and int64 ``[2]``
    (seed, offset), on one device. ``load`` writes them with device-side fills and copies
    only: no sync, no allocation."""

    def __init__(self, n: int, device: torch.device, seed: int = 0):
        self.n = n
        self.device = device
        self.temperature = torch.zeros(n, dtype=torch.float32, device=device)
        self.top_k = torch.zeros(n, dtype=torch.int32, device=device)
        self.top_p = torch.ones(n, dtype=torch.float32, device=device)
        # Device-side fills, not a host tensor copied over: a functional accept_tree makes
        # its state inside the caller's graph capture, where a host-to-device copy fails.
        self.rng = torch.zeros(2, dtype=torch.int64, device=device)
        self.reseed(seed)

    def reseed(self, seed: int) -> None:
        """The generator state (seed, offset 0), by device-side fills."""
        self.rng[0].fill_(int(seed) & SEED_MASK)
        self.rng[1].fill_(0)

    def load(self, bs: int, temperature, top_k, top_p) -> None:
        """Per-request values: scalars (checked here) or ``[bs]`` tensors on this device
        (their values are the kernel's: temperature ≤ 0 or NaN is greedy, top_k ≤ 0 or ≥ V
        and top_p ≥ 1 are off; checking them here would sync). All three are checked before
        any is written, then written by device-side copies and fills."""
        values = (temperature, top_k, top_p)
        for (name, kind, _), value in zip(PARAMS, values, strict=True):
            if isinstance(value, torch.Tensor):
                if tuple(value.shape) != (bs,):
                    raise ValueError(
                        f"{name}: must be a scalar or a [{bs}] tensor, got {list(value.shape)}"
                    )
                if value.device != self.device:
                    raise ValueError(f"{name}: tensor on {value.device}, expected {self.device}")
            elif value is not None:
                _check_scalar(name, value, kind)
        buffers = (self.temperature, self.top_k, self.top_p)
        for buf, (_, _, off), value in zip(buffers, PARAMS, values, strict=True):
            part = buf[:bs]
            if isinstance(value, torch.Tensor):
                part.copy_(value)
            else:
                part.fill_(off if value is None else value)
