"""Make unmodified CUDA code land on another backend for the length of one run.

What is remapped, and how:

- device arguments (``"cuda"``, ``"cuda:0"``, ``torch.device("cuda")``) of every torch function and
  tensor method, including ``.to(...)``, factories' ``device=`` and ``Module.to`` (which calls
  ``Tensor.to``), through a ``TorchFunctionMode``; ``.cuda()`` becomes ``.to(<device>)`` and
  ``.is_cuda`` answers for the run's device;
- ``torch.cuda.*`` helpers that CUDA notebooks call (``is_available``, ``synchronize``,
  ``manual_seed``, memory statistics, ...) are swapped for the backend's equivalents;
- ``torch.autocast("cuda")`` / ``torch.cuda.amp.autocast`` and ``GradScaler`` (whose default device is
  ``cuda``) get the run's device type; autocast keeps CUDA's default dtype, float16, unless the cell
  names one.

Everything is restored on exit. On the ``cuda`` backend itself nothing is changed.
"""

from __future__ import annotations

import contextlib
import re
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from neuron_workbench.backends.base import Backend

_CUDA_STRING = re.compile(r"cuda(?::(\d+))?")


def remap_device(value: Any, target: str) -> Any:
    """Return ``value`` with a CUDA device replaced by the ``target`` device type.

    Strings and ``torch.device`` objects naming ``cuda`` map to ``target`` (keeping an explicit index
    for accelerators, so ``cuda:1`` becomes ``neuron:1`` and the device itself decides whether it
    exists); anything else is returned unchanged.
    """
    kind = type(value)
    if kind is str:
        match = _CUDA_STRING.fullmatch(value)
        if match is None:
            return value
        index = match.group(1)
        return target if index is None or target == "cpu" else f"{target}:{index}"
    if kind is torch.device and value.type == "cuda":
        if target == "cpu" or value.index is None:
            return torch.device(target)
        return torch.device(target, value.index)
    return value


class _CudaToDeviceMode(TorchFunctionMode):
    """Rewrites CUDA device arguments of torch calls to the run's device type."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is _TENSOR_CUDA:
            return _tensor_cuda_to(self.target, *args, **kwargs)
        if func is _TENSOR_PIN_MEMORY:
            # Page-locking host memory only matters for CUDA copies; emulated and CPU runs skip it.
            return args[0]
        if getattr(func, "__self__", None) is _IS_CUDA_DESCRIPTOR:
            return args[0].device.type == self.target
        target = self.target
        for arg in args:
            kind = type(arg)
            if kind is str or kind is torch.device:
                args = tuple(remap_device(a, target) for a in args)
                break
        device = kwargs.get("device")
        if device is not None:
            kwargs["device"] = remap_device(device, target)
        return func(*args, **kwargs)


_TENSOR_CUDA = torch.Tensor.cuda
_TENSOR_PIN_MEMORY = torch.Tensor.pin_memory
_IS_CUDA_DESCRIPTOR = torch.Tensor.is_cuda


def _tensor_cuda_to(
    target: str,
    tensor: torch.Tensor,
    device: Any = None,
    non_blocking: bool = False,
    memory_format: torch.memory_format = torch.preserve_format,
) -> torch.Tensor:
    index = device.index if isinstance(device, torch.device) else device
    where = target if index is None or target == "cpu" else f"{target}:{index}"
    return tensor.to(where, non_blocking=non_blocking, memory_format=memory_format)


class HostEvent:
    """Stand-in for ``torch.cuda.Event``: records host time, since the run is synchronous here."""

    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ):
        self.enable_timing = enable_timing
        self._time: float | None = None

    def record(self, stream: Any = None) -> None:
        """Mark the current host time."""
        self._time = time.perf_counter()

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def query(self) -> bool:
        """Always complete."""
        return True

    def wait(self, stream: Any = None) -> None:
        """Nothing to wait for."""

    def elapsed_time(self, end_event: HostEvent) -> float:
        """Milliseconds between two recorded events (host time)."""
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time - self._time) * 1000.0


def _cuda_module_shims(backend: Backend) -> dict[str, Any]:
    """``torch.cuda`` attribute replacements that forward to ``backend``."""

    def synchronize(device: Any = None) -> None:
        backend.synchronize()

    def memory_allocated(device: Any = None) -> int:
        return backend.memory_stats().current_bytes or 0

    def max_memory_allocated(device: Any = None) -> int:
        return backend.memory_stats().peak_bytes or 0

    def reset_peak_memory_stats(device: Any = None) -> None:
        backend.reset_peak_memory()

    def get_device_name(device: Any = None) -> str:
        return backend.info().device_name

    def manual_seed(seed: int) -> None:
        # Not torch.manual_seed: it calls torch.cuda.manual_seed_all, which is this function.
        backend.manual_seed(int(seed))

    def init() -> None:
        return None

    def set_device(device: Any) -> None:
        return None

    def empty_cache() -> None:
        return None

    return {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "init": init,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": set_device,
        "synchronize": synchronize,
        "manual_seed": manual_seed,
        "manual_seed_all": manual_seed,
        "seed": torch.seed,
        "seed_all": torch.seed,
        "initial_seed": torch.initial_seed,
        "get_rng_state": lambda device="cuda": torch.get_rng_state(),
        "set_rng_state": lambda new_state, device="cuda": torch.set_rng_state(new_state),
        "memory_allocated": memory_allocated,
        "max_memory_allocated": max_memory_allocated,
        "memory_reserved": memory_allocated,
        "max_memory_reserved": max_memory_allocated,
        "reset_peak_memory_stats": reset_peak_memory_stats,
        "reset_max_memory_allocated": reset_peak_memory_stats,
        "empty_cache": empty_cache,
        "get_device_name": get_device_name,
        "is_bf16_supported": lambda *args, **kwargs: True,
        "Event": HostEvent,
    }


class _CudaModuleShim(types.ModuleType):
    """What ``torch.cuda`` resolves to during a run: the shims, then the real module for the rest.

    Only the ``torch.cuda`` attribute of the ``torch`` package is swapped, never
    ``sys.modules["torch.cuda"]``: PyTorch internals (TorchDynamo's tracing rules, for one) look
    functions up there and must keep seeing the real ones.
    """

    def __init__(self, real: types.ModuleType, shims: dict[str, Any]) -> None:
        super().__init__(real.__name__, real.__doc__)
        self.__dict__.update(shims)
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@contextlib.contextmanager
def _patched_attributes(owner: Any, replacements: dict[str, Any]) -> Iterator[None]:
    missing = object()
    saved = {name: getattr(owner, name, missing) for name in replacements}
    try:
        for name, value in replacements.items():
            setattr(owner, name, value)
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def _autocast_init(target: str, original: Callable[..., None]) -> Callable[..., None]:
    def __init__(  # noqa: N807 - it replaces autocast.__init__
        self: Any,
        device_type: str,
        dtype: torch.dtype | None = None,
        enabled: bool = True,
        cache_enabled: bool | None = None,
    ) -> None:
        if device_type == "cuda":
            device_type = target
            if dtype is None:
                dtype = torch.float16  # what the cell gets on CUDA
        original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    return __init__


def _grad_scaler_init(target: str, original: Callable[..., None]) -> Callable[..., None]:
    def __init__(self: Any, device: str = "cuda", *args: Any, **kwargs: Any) -> None:  # noqa: N807
        original(self, remap_device(device, target), *args, **kwargs)

    return __init__


@contextlib.contextmanager
def cuda_remapped_to(backend: Backend) -> Iterator[None]:
    """Run the body with CUDA device uses redirected to ``backend`` (a no-op for ``cuda``)."""
    target = backend.device_type
    if target == "cuda":
        yield
        return
    autocast_cls = torch.amp.autocast_mode.autocast
    scaler_cls = torch.amp.grad_scaler.GradScaler
    with contextlib.ExitStack() as stack:
        shim = _CudaModuleShim(torch.cuda, _cuda_module_shims(backend))
        stack.enter_context(_patched_attributes(torch, {"cuda": shim}))
        stack.enter_context(
            _patched_attributes(
                autocast_cls, {"__init__": _autocast_init(target, autocast_cls.__init__)}
            )
        )
        stack.enter_context(
            _patched_attributes(
                scaler_cls, {"__init__": _grad_scaler_init(target, scaler_cls.__init__)}
            )
        )
        stack.enter_context(_CudaToDeviceMode(target))
        yield
