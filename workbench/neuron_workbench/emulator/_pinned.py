"""Pinned host memory, emulated: a copy that reports ``is_pinned()``, as on CUDA.

Once the emulated device is the current accelerator, PyTorch sends every pinning request to its
hooks, and a Python backend cannot provide a pinned-memory allocator (``shared/notes/emulator.md``
§7 item 2). Pinning only changes transfer speed, so the emulator pins in name: ``pin_memory()``
returns a fresh CPU copy (the tensor itself when it is already pinned), factories called with
``pin_memory=True`` allocate ordinary CPU memory, and ``is_pinned()`` answers True for memory
obtained either way while it is alive (pointer-based, like CUDA's ``isPinnedPtr``).
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

_lock = threading.Lock()
_pinned: dict[int, StorageWeakRef] = {}  # data pointer -> the pinned storage
_PRUNE_AT = 1024

# Python-level factories that take pin_memory= (torch 2.13 signatures).
FACTORIES = (
    "arange", "bartlett_window", "blackman_window", "empty", "empty_like", "empty_permuted",
    "empty_strided", "eye", "full", "full_like", "hamming_window", "hann_window",
    "kaiser_window", "linspace", "logspace", "ones", "ones_like", "rand", "rand_like", "randint",
    "randint_like", "randn", "randn_like", "randperm", "range", "scalar_tensor", "tensor",
    "tril_indices", "triu_indices", "zeros", "zeros_like",
)  # fmt: skip
TENSOR_FACTORIES = (
    "new_empty", "new_empty_strided", "new_full", "new_ones", "new_tensor", "new_zeros",
)  # fmt: skip


def _not_pinnable(t: torch.Tensor) -> RuntimeError:
    # CUDA's wording for device tensors.
    return RuntimeError(f"cannot pin '{t.type()}' only dense CPU tensors can be pinned")


def mark_pinned(t: torch.Tensor) -> torch.Tensor:
    """Record ``t``'s CPU storage as pinned; returns ``t``."""
    st = t.untyped_storage()
    ptr = st.data_ptr()
    if ptr:
        with _lock:
            if len(_pinned) >= _PRUNE_AT:
                for k in [k for k, ref in _pinned.items() if ref.expired()]:
                    del _pinned[k]
            _pinned[ptr] = StorageWeakRef(st)
    return t


def is_pinned(self: torch.Tensor, device: Any = None) -> bool:
    """``Tensor.is_pinned``: True for live memory from ``pin_memory()`` or a pinned factory."""
    if self.device.type != "cpu" or self.layout != torch.strided:
        return False
    ptr = self.untyped_storage().data_ptr()
    if not ptr:
        return False
    with _lock:
        ref = _pinned.get(ptr)
        if ref is None:
            return False
        if ref.expired():
            del _pinned[ptr]
            return False
    return True


def pin_memory(self: torch.Tensor, device: Any = None) -> torch.Tensor:
    """``Tensor.pin_memory``: a pinned copy, or the tensor itself when it is already pinned."""
    if self.device.type != "cpu" or self.layout != torch.strided:
        raise _not_pinnable(self)
    if is_pinned(self):
        return self
    return mark_pinned(self.clone(memory_format=torch.preserve_format))


def _pinning_factory(fn: Any) -> Any:
    @functools.wraps(fn)
    def factory(*args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("pin_memory"):
            return fn(*args, **kwargs)
        kwargs["pin_memory"] = False
        out = fn(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            if out.device.type != "cpu" or out.layout != torch.strided:
                raise RuntimeError("Only dense CPU tensors can be pinned")  # CUDA's wording
            mark_pinned(out)
        return out

    factory._neuron_workbench_pinning = True  # type: ignore[attr-defined]
    return factory


def install() -> None:
    """Patch ``Tensor.pin_memory`` / ``is_pinned`` and the factories (once per process)."""
    torch.Tensor.pin_memory = pin_memory  # type: ignore[method-assign]
    torch.Tensor.is_pinned = is_pinned  # type: ignore[method-assign]
    from torch.jit import _builtins
    from torch.utils._device import _device_constructors

    # torch.set_default_device recognises factories by identity in this cached set: fill it with
    # the original functions, which the wrappers call (and the mode then sees), before patching.
    _device_constructors()

    table = _builtins._builtin_table  # None until TorchScript first needs it
    for owner, names in ((torch, FACTORIES), (torch.Tensor, TENSOR_FACTORIES)):
        for name in names:
            fn = getattr(owner, name, None)
            if fn is None or getattr(fn, "_neuron_workbench_pinning", False):
                continue
            wrapped = _pinning_factory(fn)
            setattr(owner, name, wrapped)
            if owner is torch and table is not None:
                # TorchScript resolves torch.<name> through this table; keep it resolvable.
                _builtins._register_builtin(wrapped, f"aten::{name}")
