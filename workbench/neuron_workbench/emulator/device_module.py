"""``torch.neuron`` / ``torch.tpu`` for the emulated device.

Mirrors TorchNeuron's module (``shared/notes/torchneuron.md`` §4; nested ``memory_stats`` of §9) and,
for ``tpu``, adds TorchTPU's precision modes and CPU-fallback toggle (``torchtpu.md`` §3, §5). The
toggle is also where TorchTPU keeps it, ``torch_tpu._internal.execution_mode.enable_cpu_fallback``:
with the emulated tpu installed and no real ``torch_tpu`` on the path, ``import torch_tpu`` gives a
small stand-in that holds only that switch (so code written for TorchTPU runs unchanged).
Streams and events are no-ops (the emulated device is synchronous); RNG is the CPU default generator,
so seeds give the same numbers as on CPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import importlib.abc
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from neuron_workbench.emulator import _core
from neuron_workbench.synchronous import SynchronousStream


def _idx(device: Any) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        i = device
    else:
        d = torch.device(device)
        if d.type not in (_core.DEVICE_TYPE, "cpu"):
            raise ValueError(f"expected a {_core.DEVICE_TYPE} device, got {d}")
        i = d.index or 0
    if i not in (0, -1):
        raise RuntimeError(
            f"emulated {_core.DEVICE_TYPE} has a single device ({_core.DEVICE_TYPE}:0); index {i} "
            "cannot be emulated"
        )
    return 0


# ---- memory ------------------------------------------------------------------------------------


def memory_allocated(device: Any = None) -> int:
    """Bytes held by live tensors on the emulated device."""
    _idx(device)
    return _core.MEM.current


def max_memory_allocated(device: Any = None) -> int:
    """Peak of :func:`memory_allocated` since start or the last reset."""
    _idx(device)
    return _core.MEM.peak


def memory_reserved(device: Any = None) -> int:
    """Reserved bytes: the emulator has no caching allocator, so equal to allocated."""
    return memory_allocated(device)


def max_memory_reserved(device: Any = None) -> int:
    """Peak reserved bytes (equal to the allocated peak)."""
    return max_memory_allocated(device)


def reset_peak_memory_stats(device: Any = None) -> None:
    """Set the peak to the current allocation."""
    _idx(device)
    _core.MEM.reset_peak()


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Zero the allocated/freed totals and counters."""
    _idx(device)
    _core.MEM.reset_accumulated()


def memory_stats(device: Any = None) -> dict[str, Any]:
    """Nested stats in TorchNeuron's format (``reserved_bytes`` mirrors allocated here)."""
    _idx(device)
    m = _core.MEM
    alloc = {
        "current": m.current,
        "peak": m.peak,
        "allocated": m.allocated_total,
        "freed": m.freed_total,
    }
    return {
        "allocated_bytes": dict(alloc),
        "reserved_bytes": dict(alloc),
        "active_bytes": dict(alloc),
        "num_alloc_retries": 0,
        "num_ooms": m.num_ooms,
        "num_tensor_frees": m.num_frees,
        "allocation_requests": m.num_allocs,
    }


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A short text summary of :func:`memory_stats`."""
    s = memory_stats(device)
    a = s["allocated_bytes"]
    return (
        f"emulated {_core.DEVICE_TYPE} memory (host RAM, live device tensors): current "
        f"{a['current']} B, peak {a['peak']} B, allocated {a['allocated']} B, freed "
        f"{a['freed']} B, allocations {s['allocation_requests']}, OOMs {s['num_ooms']}"
    )


def empty_cache() -> None:
    """No cache to empty."""


def flat_memory_stats(device: Any = None) -> dict[str, Any]:
    """CUDA-style flat keys, for ``torch.accelerator.memory_stats``."""
    out: dict[str, Any] = {}
    for key, val in memory_stats(device).items():
        if isinstance(val, dict):
            for k, v in val.items():
                out[f"{key}.all.{k}"] = v
        else:
            out[key] = val
    return out


# ---- device, streams, RNG ------------------------------------------------------------------------


def _host_memory_bytes() -> int:
    """The host's physical memory in bytes (0 where the platform cannot tell)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return 0


@dataclass(frozen=True)
class DeviceProperties:
    """What ``get_device_properties`` returns: ``name`` and ``total_memory``."""

    name: str
    total_memory: int


class Stream(SynchronousStream):
    """A no-op stream (the emulated device runs synchronously)."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        super().__init__(device, priority)

    @property
    def device(self) -> Any:
        """The emulated device (read when asked: the default stream is made before it is named)."""
        return _core.DEVICE


class Event:
    """A no-op event; with ``enable_timing`` it measures host time between records."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, **kwargs: Any) -> None:
        self.enable_timing = enable_timing
        self._t: float | None = None

    def record(self, stream: Any = None) -> None:
        """Timestamp now (host clock)."""
        self._t = _core._perf()

    def synchronize(self) -> None:
        """No-op."""

    def wait(self, stream: Any = None) -> None:
        """No-op."""

    def query(self) -> bool:
        """Always complete."""
        return True

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds of host time between two recorded events."""
        if self._t is None or end._t is None:
            raise RuntimeError("both events must be recorded before calling elapsed_time")
        return (end._t - self._t) * 1000.0


Stream.event_type = Event
_default_stream = Stream()


class _Precision(enum.Enum):
    DEFAULT = 1
    HIGH = 3
    HIGHEST = 6


_FROM_TORCH = {"medium": _Precision.DEFAULT, "high": _Precision.HIGH, "highest": _Precision.HIGHEST}
_TO_TORCH = {v: k for k, v in _FROM_TORCH.items()}


class _precision:
    """Set the tpu fp32 matmul precision; also usable as a context manager that restores it."""

    def __init__(self, mode: Any) -> None:
        if isinstance(mode, str):
            mode = _Precision[mode.upper()]
        self._prev = get_precision()
        set_precision(mode)

    def __enter__(self) -> _precision:
        return self

    def __exit__(self, *exc: Any) -> None:
        set_precision(self._prev)


def get_precision() -> Any:
    """The emulated tpu's fp32 matmul precision mode."""
    return _Precision({0: 6, 1: 1, 3: 3, 6: 6}[_core.MATMUL_PASSES])


def set_precision(mode: Any) -> None:
    """Set DEFAULT (1-pass bf16), HIGH (3-pass) or HIGHEST (6-pass)."""
    if isinstance(mode, str):
        mode = _Precision[mode.upper()]
    _core.MATMUL_PASSES = mode.value
    _core.reset_plans()


class _ExecutionMode:
    """Mirror of ``torch_tpu._internal.execution_mode``: ``enable_cpu_fallback`` toggles fallback."""

    @property
    def enable_cpu_fallback(self) -> bool:
        """Whether ops TorchTPU lacks run on CPU (False by default, as on the real backend)."""
        return _core.CPU_FALLBACK

    @enable_cpu_fallback.setter
    def enable_cpu_fallback(self, value: bool) -> None:
        _core.CPU_FALLBACK = bool(value)
        _core.reset_plans()


class _ExecutionModeModule(_ExecutionMode, types.ModuleType):
    """The emulated ``torch_tpu._internal.execution_mode``: TorchTPU's switch at its real place."""

    #: Marks the module as the emulator's stand-in, not the real TorchTPU.
    __neuron_workbench_emulated__ = True


def _enable_cpu_fallback(value: bool) -> None:
    """Backing setter of ``enable_cpu_fallback`` (named as in TorchTPU 0.2.0)."""
    _core.CPU_FALLBACK = bool(value)
    _core.reset_plans()


def _is_cpu_fallback_enabled() -> bool:
    """Backing getter of ``enable_cpu_fallback`` (named as in TorchTPU 0.2.0)."""
    return _core.CPU_FALLBACK


_TORCH_TPU = ("torch_tpu", "torch_tpu._internal", "torch_tpu._internal.execution_mode")


class _EmulatedTorchTpuFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the stand-in ``torch_tpu`` when no real one is importable (last on ``sys.meta_path``)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _TORCH_TPU or _core.DEVICE_TYPE != "tpu":
            return None
        return importlib.util.spec_from_loader(
            fullname, self, is_package=fullname != _TORCH_TPU[-1]
        )

    def create_module(self, spec: Any) -> types.ModuleType | None:
        if spec.name == _TORCH_TPU[-1]:
            return _ExecutionModeModule(spec.name)
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__doc__ = (
            "Emulated TorchTPU stand-in (neuron_workbench): only the CPU-fallback switch "
            "torch_tpu._internal.execution_mode.enable_cpu_fallback; this is not torch_tpu."
        )
        module.__neuron_workbench_emulated__ = True  # type: ignore[attr-defined]
        if module.__name__ == _TORCH_TPU[-1]:
            module._enable_cpu_fallback = _enable_cpu_fallback  # type: ignore[attr-defined]
            module._is_cpu_fallback_enabled = _is_cpu_fallback_enabled  # type: ignore[attr-defined]
        else:
            # `import torch_tpu` then `torch_tpu._internal.execution_mode...` works, as with the wheel.
            child = _TORCH_TPU[_TORCH_TPU.index(module.__name__) + 1]
            setattr(module, child.rsplit(".", 1)[1], importlib.import_module(child))


def _offer_torch_tpu_switch() -> None:
    if not any(isinstance(f, _EmulatedTorchTpuFinder) for f in sys.meta_path):
        sys.meta_path.append(_EmulatedTorchTpuFinder())


def build(device_type: str, status: Any) -> types.ModuleType:
    """Create the ``torch.<device>`` module object; ``status()`` answers ``emulator_status()``."""
    m = types.ModuleType(f"torch.{device_type}")
    m.__doc__ = (
        f"Emulated {device_type} device (neuron_workbench): tensors live in host RAM and every op "
        "runs on the CPU; timings are host CPU time."
    )

    def is_available() -> bool:
        return True

    def is_initialized() -> bool:
        return True

    def is_emulated() -> bool:
        """True: this is neuron_workbench's emulated device, not real hardware."""
        return True

    def init() -> None:
        return None

    def device_count() -> int:
        return 1

    def current_device() -> int:
        return 0

    def set_device(device: Any) -> None:
        _idx(device)

    def get_device_name(device: Any = None) -> str:
        return f"{device_type}:{_idx(device)}"

    def get_device_properties(device: Any = None) -> DeviceProperties:
        _idx(device)
        # Without a set capacity the device holds what the host's memory holds (its tensors live
        # there); a real device reports its memory, so `allocated / total_memory` works there too
        capacity = _core.MEM.capacity or _host_memory_bytes()
        return DeviceProperties(f"{device_type}:0 (emulated)", capacity)

    @contextlib.contextmanager
    def device(dev: Any) -> Iterator[None]:
        _idx(dev)
        yield

    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.float32, torch.float16, torch.bfloat16]

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return True

    def synchronize(device: Any = None) -> None:
        _idx(device)

    def manual_seed(seed: int) -> None:
        # The emulated device draws from the CPU default generator (no per-device generator).
        torch.default_generator.manual_seed(int(seed))

    def seed() -> None:
        torch.default_generator.seed()

    def initial_seed() -> int:
        return torch.default_generator.initial_seed()

    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.default_generator.get_state()

    def set_rng_state(new_state: torch.Tensor, device: Any = None) -> None:
        torch.default_generator.set_state(new_state)

    def get_rng_state_all() -> list[torch.Tensor]:
        return [get_rng_state()]

    def set_rng_state_all(states: list[torch.Tensor]) -> None:
        set_rng_state(states[0])

    def _is_in_bad_fork() -> bool:
        return _IN_BAD_FORK[0]

    def current_stream(device: Any = None) -> Stream:
        return _default_stream

    def default_stream(device: Any = None) -> Stream:
        return _default_stream

    def set_stream(stream: Any) -> None:
        return None

    def stream(s: Any = None) -> Any:
        return contextlib.nullcontext(s)

    def get_dynamo_metrics() -> dict[str, Any]:
        return {}

    def reset_dynamo_metrics() -> None:
        return None

    def emulator_status() -> Any:
        """The :class:`~neuron_workbench.emulator.EmulatorStatus` of this process."""
        return status() if status is not None else None

    fns = dict(locals())
    for name, fn in fns.items():
        if callable(fn) and not name.startswith("__"):
            setattr(m, name, fn)
    m.manual_seed_all = manual_seed
    m.seed_all = seed
    m.Stream = Stream
    m.Event = Event
    m.DeviceProperties = DeviceProperties
    for fn in (
        memory_allocated, max_memory_allocated, memory_reserved, max_memory_reserved,
        reset_peak_memory_stats, reset_accumulated_memory_stats, memory_stats, memory_summary,
        empty_cache,
    ):  # fmt: skip
        setattr(m, fn.__name__, fn)
    mem = types.ModuleType(f"torch.{device_type}.memory")
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved",
                 "max_memory_reserved", "reset_peak_memory_stats", "memory_stats",
                 "memory_summary", "empty_cache", "reset_accumulated_memory_stats"):  # fmt: skip
        setattr(mem, name, getattr(m, name))
    m.memory = mem
    if device_type == "tpu":
        m.Precision = _Precision
        m.precision = _precision
        m.get_precision = get_precision
        m.set_precision = set_precision
        m.execution_mode = _ExecutionMode()
        _offer_torch_tpu_switch()
    _refuse_device_in_forked_children(m, FORK_REFUSALS[device_type])
    return m


#: TorchNeuron's refusal of the device in a forked child (torchneuron.md §2, fork safety), which
#: CUDA makes too ("Cannot re-initialize CUDA in forked subprocess").
NEURON_FORK_REFUSAL = (
    "Cannot re-initialize Neuron runtime in forked subprocess. To use Neuron with "
    "multiprocessing, use the 'spawn' start method"
)
#: The emulated tpu's: what TorchTPU does in a forked child is not documented (torchtpu.md), but the
#: emulator cannot send its device tensors between processes, so it says so rather than hang.
TPU_FORK_REFUSAL = (
    "the emulated tpu cannot be used in a forked subprocess: its tensors cannot be sent between "
    "processes (TorchTPU's behaviour here is not documented); make device tensors in the main "
    "process (move each batch to the device in the loop)"
)
#: What each emulated device raises where a forked child asks for it.
FORK_REFUSALS = {"neuron": NEURON_FORK_REFUSAL, "tpu": TPU_FORK_REFUSAL}
_IN_BAD_FORK = [False]
#: torch's own fork handler for a device's lazy initialisation (libtorch_python, TORCH_PYTHON_API):
#: in a forked child it makes torch ask the device module's ``_lazy_init`` again, as for CUDA.
_FORK_HANDLER_SYMBOL = "_ZN5torch5utils37register_fork_handler_for_device_initEN3c1010DeviceTypeE"


def _refuse_device_in_forked_children(module: types.ModuleType, refusal: str) -> None:
    """Make a child forked from this process refuse the device with ``refusal``.

    TorchNeuron's runtime refuses so (torchneuron.md §2); the emulated tpu, which cannot send its
    tensors out of a child either, refuses with its own text (:data:`TPU_FORK_REFUSAL`).

    Torch asks a device module's ``_lazy_init`` before a tensor is made on or moved to the device
    (factories, ``.to()``, ``.cuda()`` in a run) until one call succeeded, and asks again in a
    forked child once the device's fork handler is registered; the module's ``_lazy_init`` refuses
    there. Without it, a forked DataLoader worker whose ``__getitem__`` made device tensors made
    them, and could not send them back (``_share_fd_: only available on CPU`` in its queue's
    thread): the loader waited for the batch forever. Where torch lacks the handler's symbol (a
    torch built otherwise), the child goes on as before.
    """

    def _lazy_init() -> None:
        """``torch.<device>._lazy_init``: nothing to do, but in a forked child the device is refused."""
        if _IN_BAD_FORK[0]:
            raise RuntimeError(refusal)

    module._lazy_init = _lazy_init  # type: ignore[attr-defined]
    if not hasattr(os, "register_at_fork"):
        return
    try:
        handler = getattr(ctypes.CDLL(torch._C.__file__), _FORK_HANDLER_SYMBOL)
    except (AttributeError, OSError):
        return
    handler.argtypes = [ctypes.c_int8]
    handler.restype = None
    handler(int(torch._C._autograd.DeviceType.PrivateUse1))
    os.register_at_fork(after_in_child=_forked_child)


def _forked_child() -> None:
    _IN_BAD_FORK[0] = True
