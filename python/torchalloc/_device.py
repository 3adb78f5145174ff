"""Turn the device arguments torch accepts into a device index, without importing torch.

torch.cuda.memory_allocated(device) takes None, an int, a torch.device or a
string such as "cuda:1"; ours must take the same, and must keep working where
torch is not installed (the sim backend, the analysis tools).
"""
from __future__ import annotations

import sys
from typing import Any

DeviceLike = Any  # None | int | str | torch.device


def current_device() -> int:
    """torch's current CUDA device when torch has CUDA up, else 0.

    Only asks torch if it is already imported and initialised: calling
    torch.cuda.current_device() would otherwise initialise CUDA as a side
    effect of reading a statistic, which would break a later install().
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return int(torch.cuda.current_device())
        except Exception:  # a torch without CUDA support
            pass
    return 0


def _from_string(text: str) -> int | None:
    kind, sep, index = text.strip().partition(":")
    if kind != "cuda":
        raise ValueError(f"expected a CUDA device, got {text!r}")
    if not sep:
        return None
    if not index.isdigit():
        raise ValueError(f"invalid device string {text!r}")
    return int(index)


def device_index(device: DeviceLike = None) -> int:
    """The index `device` names; None (or a device without index) means the current device."""
    if device is None:
        return current_device()
    if isinstance(device, bool):
        raise TypeError("a device cannot be a bool")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device index must be >= 0, got {device}")
        return device
    if isinstance(device, str):
        index = _from_string(device)
        return current_device() if index is None else index
    kind = getattr(device, "type", None)
    if kind is not None and hasattr(device, "index"):  # torch.device
        if kind != "cuda":
            raise ValueError(f"expected a CUDA device, got {device}")
        return current_device() if device.index is None else int(device.index)
    raise TypeError(f"cannot interpret {device!r} as a CUDA device")
