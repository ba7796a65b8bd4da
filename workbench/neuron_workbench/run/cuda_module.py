"""What ``torch.cuda`` resolves to while a run remaps CUDA onto another backend.

The shims forward ``torch.cuda``'s helpers that CUDA notebooks call (availability, synchronize,
seeding and random state, also on ``torch.cuda.random``, memory statistics, also on
``torch.cuda.memory``, device properties, events, the ``device`` context, NVTX annotations) to the
run's backend; everything else still comes from the real module.

Memory statistics come from the backend (an emulated device's accounting, a real device's
allocator) or, for the host CPU standing in for cuda, from the run's own accounting of the tensor
storages it allocates (:class:`~neuron_workbench.run.cuda_on_host.HostMemory`). The compute
capability every stand-in reports is the workbench's choice, not a vendor fact: ``(8, 0)`` (an
Ampere GPU, whose TF32 behaviour the cpu reference imitates), or ``NEURON_WORKBENCH_CUDA_CAPABILITY``
(``9.0``). The values are tagged as measurements by :mod:`neuron_workbench.run.measurements`.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import itertools
import numbers
import os
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from neuron_workbench.backends.base import Backend, MemoryStats
from neuron_workbench.cuda_semantics.accelerator_api import CUDA_TO_ACCELERATOR
from neuron_workbench.run.measurements import elapsed_ms
from neuron_workbench.run.random_ids import drawn
from neuron_workbench.synchronous import SynchronousStream

#: Environment variable with the compute capability the stand-ins report (``major.minor``).
CAPABILITY_ENV = "NEURON_WORKBENCH_CUDA_CAPABILITY"
_DEFAULT_CAPABILITY = (8, 0)


def stand_in_capability() -> tuple[int, int]:
    """What ``torch.cuda.get_device_capability()`` answers on a backend standing in for CUDA."""
    text = os.environ.get(CAPABILITY_ENV, "").strip()
    if not text:
        return _DEFAULT_CAPABILITY
    major, _, minor = text.partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        raise ValueError(
            f"{CAPABILITY_ENV}={text!r} is not a compute capability such as 8.0"
        ) from None


class DeviceProperties:
    """What ``torch.cuda.get_device_properties`` returns on a backend standing in for CUDA.

    ``total_memory`` is the device's capacity where the backend knows it (the host's RAM for the
    cpu reference and for an emulated device without a set capacity), else 0; ``major``/``minor`` are
    :func:`stand_in_capability`. ``multi_processor_count`` (what ``nn.DataParallel`` balances
    GPUs by) exists on the cpu reference only, as the host's cores; a target's properties have
    no such field (TorchNeuron's have ``name`` and ``total_memory``).
    """

    def __init__(
        self, name: str, total_memory: int, multi_processor_count: int | None = None
    ) -> None:
        self.name = name
        self.total_memory = int(total_memory)
        self.major, self.minor = stand_in_capability()
        if multi_processor_count is not None:
            self.multi_processor_count = int(multi_processor_count)

    def __repr__(self) -> str:
        return (
            f"DeviceProperties(name={self.name!r}, major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // 2**20}MB)"
        )


class OneDevice:
    """``torch.cuda.device(i)`` and ``device_of(t)`` on a stand-in, which has one device (index 0).

    Entering it selects that device (nothing to do); another index is refused as CUDA refuses an
    index a one-GPU machine lacks.
    """

    def __init__(self, device: Any) -> None:
        self.idx = _device_index(device)

    def __enter__(self) -> OneDevice:
        if self.idx > 0:
            raise RuntimeError(
                f"invalid device ordinal: the run stands in for one CUDA device (0), not {self.idx}"
            )
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False

    def __repr__(self) -> str:
        # what printing torch.cuda.device(0) shows on a GPU (the workbench's class is no news)
        return f"<torch.cuda.device object at {id(self):#x}>"


def _only_device(device: Any) -> None:
    # torch.cuda's answer for an index a one-GPU machine lacks (DataParallel(device_ids=[0, 1]))
    if _device_index(device) > 0:
        raise AssertionError("Invalid device id")


def _device_index(device: Any) -> int:
    if device is None:
        return -1
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        _, _, index = device.partition(":")
        return int(index) if index.isdigit() else 0
    index = getattr(device, "index", None)
    return 0 if index is None else int(index)


class NvtxRanges:
    """``torch.cuda.nvtx`` on a stand-in: annotations that nothing records.

    Ranges nest per thread; ``range_push`` returns the new range's depth and ``range_pop`` the
    ended one's (-1 with none open), ``range_start`` a new id. What a GPU's NVTX returns without
    a profiler attached is not known here: cells that only annotate are what this serves. One
    object for every run (:data:`NVTX`), so a cell that keeps it ships it by name.
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self._ids = itertools.count(1)

    def __reduce__(self) -> str:
        return "NVTX"

    def _depth(self) -> int:
        return getattr(self._local, "depth", 0)

    def range_push(self, msg: str) -> int:
        """Start a nested range; its zero-based depth."""
        depth = self._depth()
        self._local.depth = depth + 1
        return depth

    def range_pop(self) -> int:
        """End the innermost range; its depth (-1 when none was open)."""
        depth = self._depth() - 1
        if depth < 0:
            return -1
        self._local.depth = depth
        return depth

    def range_start(self, msg: str) -> int:
        """Start a range that may span threads; its id."""
        return next(self._ids)

    def range_end(self, range_id: int) -> None:
        """End the range ``range_id``."""
        return None

    def mark(self, msg: str) -> None:
        """An instant event."""
        return None

    @contextlib.contextmanager
    def range(self, msg: str, *args: Any, **kwargs: Any) -> Iterator[None]:
        """A range around a block (``msg`` formatted with the arguments)."""
        self.range_push(msg.format(*args, **kwargs))
        try:
            yield
        finally:
            self.range_pop()


#: ``torch.cuda.nvtx`` in every run.
NVTX = NvtxRanges()


def profiler_start() -> None:
    """``torch.cuda.profiler.start()`` in a run: no CUDA profiler is attached to mark a range for."""


def profiler_stop() -> None:
    """``torch.cuda.profiler.stop()`` in a run: the end of a range that nothing records."""


@contextlib.contextmanager
def profiler_range() -> Iterator[None]:
    """``torch.cuda.profiler.profile()`` in a run: a range that nothing records."""
    yield


def _nvtx_annotations_enter(self: Any) -> Any:
    # torch.autograd.profiler.emit_nvtx's __enter__, less the NVTX profiler torch has only with CUDA
    if not self.enabled:
        return None
    if self.entered:
        raise RuntimeError("NVTX annotation context manager is not reentrant")
    self.entered = True
    return self


def _nvtx_annotations_exit(self: Any, *exc: Any) -> bool | None:
    return False if self.enabled else None


#: ``torch.autograd.profiler.emit_nvtx``'s methods in every run: it annotates each op with an NVTX
#: range for a CUDA profiler attached to the process, which a run has none of (as ``NVTX``).
EMIT_NVTX_METHODS = {"__enter__": _nvtx_annotations_enter, "__exit__": _nvtx_annotations_exit}


#: ``torch.cuda.profiler``'s functions as every run answers them. They mark the capture range of a
#: CUDA profiler attached to the process (Nsight Systems' ``--capture-range=cudaProfilerApi``); a
#: GPU without one runs them as nothing, and so does a run (torch's ask for a CUDA build).
CUDA_PROFILER_FUNCTIONS = {
    "start": profiler_start,
    "stop": profiler_stop,
    "profile": profiler_range,
}


class LegacyCudaType(type):
    """``torch.cuda.FloatTensor`` and its kin during a run: the legacy typed constructors.

    Older CUDA code builds tensors with them (``Tensor = torch.cuda.FloatTensor if cuda else
    torch.FloatTensor``; ``Tensor(n, 1).fill_(1.0)``, ``x.type(Tensor)``). Each makes its dtype's
    tensor on ``"cuda"``, which the run maps to its device (new ones are zero-filled: uninitialised
    memory would differ between the runs); ``isinstance`` holds for a tensor of the dtype that
    ``is_cuda``; ``Tensor.type`` with one (or with its name) converts, through the run's mode.
    Outside a run they fail as the real ones do without CUDA.
    """

    dtype: torch.dtype

    def __call__(cls, *args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        """A new tensor of sizes ``args`` (zero-filled), or of the data given, on ``"cuda"``."""
        if kwargs:
            raise TypeError(f"torch.cuda.{cls.__name__}() got {', '.join(kwargs)}")
        if device is not None and str(device).partition(":")[0] != "cuda":
            raise RuntimeError(f"torch.cuda.{cls.__name__}() is a cuda type, not on {device}")
        where = "cuda" if device is None else device
        if not args:
            return torch.empty(0, dtype=cls.dtype, device=where)
        if len(args) == 1 and isinstance(args[0], torch.Size):
            args = tuple(args[0])
        if all(_is_size(a) for a in args):
            return torch.zeros(*(int(a) for a in args), dtype=cls.dtype, device=where)
        if len(args) == 1 and isinstance(args[0], torch.Tensor):
            return args[0].to(where, cls.dtype)
        if len(args) == 1 and not isinstance(args[0], int | float | complex | bool):
            return torch.tensor(args[0], dtype=cls.dtype, device=where)
        kinds = ", ".join(type(a).__name__ for a in args)
        raise TypeError(f"torch.cuda.{cls.__name__}(): data must be a sequence (got {kinds})")

    def __instancecheck__(cls, instance: Any) -> bool:
        return (
            isinstance(instance, torch.Tensor)
            and instance.dtype == cls.dtype
            and bool(instance.is_cuda)
        )

    def __repr__(cls) -> str:
        return f"<class 'torch.cuda.{cls.__name__}'>"


def _is_size(value: Any) -> bool:
    # an int, or a NumPy integer (imgs.shape[0] of an array), as the legacy constructors take
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _legacy_type(name: str, dtype: torch.dtype) -> LegacyCudaType:
    return LegacyCudaType(name, (), {"dtype": dtype, "is_cuda": True, "__module__": __name__})


#: The legacy typed constructors a run's ``torch.cuda`` has (importable, so they travel to a worker).
FloatTensor = _legacy_type("FloatTensor", torch.float32)
DoubleTensor = _legacy_type("DoubleTensor", torch.float64)
HalfTensor = _legacy_type("HalfTensor", torch.float16)
BFloat16Tensor = _legacy_type("BFloat16Tensor", torch.bfloat16)
LongTensor = _legacy_type("LongTensor", torch.int64)
IntTensor = _legacy_type("IntTensor", torch.int32)
ShortTensor = _legacy_type("ShortTensor", torch.int16)
CharTensor = _legacy_type("CharTensor", torch.int8)
ByteTensor = _legacy_type("ByteTensor", torch.uint8)
BoolTensor = _legacy_type("BoolTensor", torch.bool)
LEGACY_TYPES = {
    kind.__name__: kind
    for kind in (
        FloatTensor,
        DoubleTensor,
        HalfTensor,
        BFloat16Tensor,
        LongTensor,
        IntTensor,
        ShortTensor,
        CharTensor,
        ByteTensor,
        BoolTensor,
    )
}


def legacy_cuda_dtype(value: Any) -> torch.dtype | None:
    """The dtype ``Tensor.type(value)`` asks for when ``value`` names a legacy CUDA type."""
    if isinstance(value, LegacyCudaType):
        return value.dtype
    if isinstance(value, str) and value.startswith("torch.cuda."):
        kind = LEGACY_TYPES.get(value.removeprefix("torch.cuda."))
        return kind.dtype if kind is not None else None
    return None


def host_memory_bytes() -> int:
    """The host's physical memory in bytes (0 where the platform cannot tell)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return 0


class HostEvent:
    """Stand-in for ``torch.cuda.Event``: records host time, since the run is synchronous here."""

    #: ``elapsed_time`` tags its result as a time measurement itself.
    tags_elapsed_time = True

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
        return elapsed_ms((float(end_event._time) - float(self._time)) * 1000.0)


class HostStream(SynchronousStream):
    """Stand-in for ``torch.cuda.Stream`` on the host, whose runs are synchronous (no-ops)."""

    event_type = HostEvent

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        super().__init__(device, priority)
        self.device = torch.device("cpu")  # where the host's "cuda" tensors are


_HOST_STREAM = HostStream()


def _host_stream_context(stream: Any = None) -> contextlib.AbstractContextManager[Any]:
    """``torch.cuda.stream(s)`` on the host: nothing to switch."""
    return contextlib.nullcontext(stream)


def cuda_module_shims(backend: Backend, host: Any = None) -> dict[str, Any]:
    """``torch.cuda`` attribute replacements that forward to ``backend``.

    ``host``: the :class:`~neuron_workbench.run.cuda_on_host.CudaOnHost` of a cpu run standing in
    for cuda, whose memory accounting answers the memory statistics.
    """

    def stats() -> MemoryStats:
        return host.memory_stats() if host is not None else backend.memory_stats()

    def device_module() -> Any:
        if backend.device_type in ("cpu", "cuda"):
            return None
        try:
            return torch.get_device_module(backend.device_type)
        except (RuntimeError, AttributeError):
            return None

    def total_memory() -> int:
        if host is not None or backend.device_type == "cpu":
            return host_memory_bytes()
        props = getattr(device_module(), "get_device_properties", None)
        try:
            return int(getattr(props(), "total_memory", 0) or 0) if callable(props) else 0
        except Exception:  # a device module that cannot tell
            return 0

    def synchronize(device: Any = None) -> None:
        backend.synchronize()

    def memory_allocated(device: Any = None) -> int:
        return stats().current_bytes or 0

    def max_memory_allocated(device: Any = None) -> int:
        return stats().peak_bytes or 0

    def memory_stats(device: Any = None) -> dict[str, int]:
        # CUDA's flat keys, for the figures the run can answer (nothing is cached: reserved equals
        # allocated, as the emulated devices report it).
        current, peak = memory_allocated(), max_memory_allocated()
        stats = {
            f"{pool}_bytes.all.{which}": value
            for pool in ("active", "allocated", "reserved")
            for which, value in (("current", current), ("peak", peak))
        }
        # the caching allocator's counters (a training loop logs num_alloc_retries): the device
        # module's where it counts them (TorchNeuron's, an emulated device's), else none happened
        own = getattr(device_module(), "memory_stats", None) if host is None else None
        try:
            counted = own() if callable(own) else {}
        except Exception:  # a device module that cannot tell
            counted = {}
        for key in ("num_alloc_retries", "num_ooms"):
            stats[key] = int(counted.get(key, 0) or 0)
        return stats

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        real = getattr(device_module(), "mem_get_info", None)
        if callable(real):
            return real()
        total = total_memory()
        if not total:
            raise RuntimeError(
                f"torch.cuda.mem_get_info: the {backend.name} backend does not know its capacity "
                "(an emulated device has one when neuron_workbench.emulator.configure("
                "capacity_bytes=...) sets it)"
            )
        return max(total - memory_allocated(), 0), total

    def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
        # torch's own table reads a CUDA allocator's statistics; this one has what the run knows
        where = (
            "the run's accounting of its host tensor storages"
            if host is not None
            else f"the {backend.name} backend's accounting"
        )
        return (
            f"memory summary of {get_device_name()} ({where}):\n"
            f"  allocated: current {memory_allocated()} B, peak {max_memory_allocated()} B\n"
            "  (nothing is cached: reserved equals allocated)"
        )

    def reset_peak_memory_stats(device: Any = None) -> None:
        if host is not None:
            host.reset_peak_memory()
        else:
            backend.reset_peak_memory()

    def get_device_name(device: Any = None) -> str:
        _only_device(device)
        return backend.info().device_name

    def get_device_properties(device: Any = None) -> DeviceProperties:
        _only_device(device)
        on_host = host is not None or backend.device_type == "cpu"
        cores = (os.cpu_count() or 1) if on_host else None
        return DeviceProperties(get_device_name(), total_memory(), multi_processor_count=cores)

    def get_device_capability(device: Any = None) -> tuple[int, int]:
        _only_device(device)
        return stand_in_capability()

    def manual_seed(seed: int) -> None:
        # Not torch.manual_seed: it calls torch.cuda.manual_seed_all, which is this function.
        backend.manual_seed(int(seed))

    def init() -> None:
        return None

    def set_device(device: Any) -> None:
        with OneDevice(device):  # index 0 (or none): nothing to switch to
            return None

    def empty_cache() -> None:
        return None

    def streams() -> dict[str, Any]:
        # A device module's own streams where it has them (torch.neuron.Stream), else no-ops.
        module = device_module() if host is None else None
        own = {
            name: getattr(module, name)
            for name in ("Stream", "stream", "current_stream", "default_stream", "set_stream")
            if module is not None and callable(getattr(module, name, None))
        }
        return {
            "Stream": own.get("Stream", HostStream),
            "stream": own.get("stream", _host_stream_context),
            "current_stream": own.get("current_stream", lambda device=None: _HOST_STREAM),
            "default_stream": own.get("default_stream", lambda device=None: _HOST_STREAM),
            "set_stream": own.get("set_stream", lambda stream: None),
        }

    def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
        torch.set_rng_state(new_state)

    def set_rng_state_all(new_states: Any) -> None:
        for new_state in new_states:  # one device: the one state a one-GPU machine saved
            set_rng_state(new_state)

    # The seeding and random state functions, on torch.cuda and on torch.cuda.random.
    random_state = {
        "manual_seed": manual_seed,
        "manual_seed_all": manual_seed,
        "seed": seed_alike,
        "seed_all": seed_alike,
        "initial_seed": torch.initial_seed,
        "get_rng_state": lambda device="cuda": torch.get_rng_state(),
        "set_rng_state": set_rng_state,
        "get_rng_state_all": lambda: [torch.get_rng_state()],
        "set_rng_state_all": set_rng_state_all,
    }
    return {
        **streams(),
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "init": init,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": set_device,
        "synchronize": synchronize,
        **random_state,
        # `torch.cuda.random.get_rng_state()` (what transformers' Trainer saves with a checkpoint)
        # reached the real module, which asks for a CUDA build
        "random": CudaModuleShim(torch.cuda.random, random_state),
        # One GPU's generator, the one the seeding functions above seed and draw from (the real
        # tuple is empty without a CUDA build: `default_generators[0].manual_seed(s)` raised).
        "default_generators": (torch.default_generator,),
        "memory_allocated": memory_allocated,
        "max_memory_allocated": max_memory_allocated,
        "memory_reserved": memory_allocated,
        "max_memory_reserved": max_memory_allocated,
        "memory_stats": memory_stats,
        "mem_get_info": mem_get_info,
        "reset_peak_memory_stats": reset_peak_memory_stats,
        "reset_max_memory_allocated": reset_peak_memory_stats,
        "empty_cache": empty_cache,
        "ipc_collect": empty_cache,
        # a cap on a caching allocator the stand-ins do not have; no graph is ever being captured
        "set_per_process_memory_fraction": lambda fraction, device=None: None,
        "is_current_stream_capturing": lambda: False,
        "memory_summary": memory_summary,
        "device": OneDevice,
        "device_of": lambda obj: OneDevice(-1),
        "nvtx": NVTX,
        **LEGACY_TYPES,
        "get_device_name": get_device_name,
        "get_device_properties": get_device_properties,
        "get_device_capability": get_device_capability,
        "is_bf16_supported": lambda *args, **kwargs: True,
        # torch's asks its own is_bf16_supported, without CUDA False: an Ampere or newer GPU's
        "is_tf32_supported": lambda: stand_in_capability() >= (8, 0),
        "Event": HostEvent,
    }


def seed_alike() -> int:
    """``torch.seed()`` in a run: a new seed each call, the same in both runs of the cell.

    torch draws it from the operating system's entropy, so each run seeded its generators apart
    and every draw after differed, where the port changed nothing. Here the ``n``-th call of a run
    takes the ``n``-th seed of the cell's own entropy (:mod:`~neuron_workbench.run.random_ids`),
    new at each execution of the cell, and seeds every generator with it as ``torch.seed()`` does.
    """
    value = int.from_bytes(drawn("torch.seed", 8), "little") & ((1 << 63) - 1)  # as torch's
    torch.manual_seed(value)
    return value


class CudaModuleShim(types.ModuleType):
    """What ``torch.cuda`` resolves to during a run: the shims, then the real module for the rest.

    Only the ``torch.cuda`` attribute of the ``torch`` package is swapped, never
    ``sys.modules["torch.cuda"]``: PyTorch internals (TorchDynamo's tracing rules, for one) look
    functions up there and must keep seeing the real ones.
    """

    def __init__(self, real: types.ModuleType, shims: dict[str, Any]) -> None:
        super().__init__(real.__name__, real.__doc__)
        self.__dict__.update(shims)
        self._real = real
        memory = vars(real).get("memory")
        if isinstance(memory, types.ModuleType) and "memory" not in shims:
            self.memory = CudaSubmoduleShim(memory, self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class CudaSubmoduleShim(types.ModuleType):
    """A submodule of ``torch.cuda`` during a run (``torch.cuda.memory``): the run's answers.

    On a GPU ``torch.cuda.memory.memory_allocated`` is ``torch.cuda.memory_allocated``; the real
    submodule's answered 0 (or asked for a CUDA build) where the run's ``torch.cuda`` counts. A
    name both have is read from ``parent`` at each access, so what the run wraps there (the
    measurement tags) holds here too; the rest comes from the real submodule.
    """

    def __init__(self, real: types.ModuleType, parent: CudaModuleShim) -> None:
        super().__init__(real.__name__, real.__doc__)
        self._real = real
        self._parent = parent

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_") and name in vars(self._parent) and hasattr(self._real, name):
            return getattr(self._parent, name)
        return getattr(self._real, name)


#: What ``torch.accelerator.current_accelerator()`` names on a CUDA machine (made here, outside any
#: run: a run's remap would give its own device).
_CUDA = torch.device("cuda")
#: ``torch.accelerator`` functions, and the ``torch.cuda`` ones that answer them on a CUDA machine
#: (with the ``_idx`` spellings of PyTorch 2.6 and ``mem_get_info``).
_ACCELERATOR_AS_CUDA = {
    **{accelerator: cuda for cuda, accelerator in CUDA_TO_ACCELERATOR.items()},
    "current_device_idx": "current_device",
    "set_device_idx": "set_device",
    "get_memory_info": "mem_get_info",
}


class AcceleratorShim(types.ModuleType):
    """What ``torch.accelerator`` resolves to during a run: CUDA's answers, for the cell's code.

    ``torch.accelerator.is_available()``, ``current_accelerator()`` (``cuda``), device counts,
    synchronisation and memory figures answer as the run's ``torch.cuda`` does, so a cell written
    with the device-generic API (PyTorch 2.6 on) runs as the CUDA cell it is on each backend. torch's
    own code (a DataLoader choosing where to pin memory) and the workbench's (a backend adapter
    synchronising its device) keep the real module's answers, as the process's device is; like
    ``torch.cuda``, only the attribute of the ``torch`` package is swapped.
    """

    def __init__(self, real: types.ModuleType, cuda: types.ModuleType) -> None:
        super().__init__(real.__name__, real.__doc__)
        self._real = real
        answers = {
            name: getattr(cuda, cuda_name)
            for name, cuda_name in _ACCELERATOR_AS_CUDA.items()
            if hasattr(real, name) and cuda_name in vars(cuda)  # the run's own, not CUDA's
        }
        answers["current_accelerator"] = lambda check_available=False: _CUDA
        self.__dict__.update(
            {name: _for_the_cell(getattr(real, name), as_cuda) for name, as_cuda in answers.items()}
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _for_the_cell(real: Callable[..., Any], as_cuda: Callable[..., Any]) -> Callable[..., Any]:
    """``as_cuda`` for the cell's code, ``real`` for torch's own and the workbench's."""

    @functools.wraps(real)
    def answer(*args: Any, **kwargs: Any) -> Any:
        return (as_cuda if _called_by_the_cell() else real)(*args, **kwargs)

    return answer


def _called_by_the_cell() -> bool:
    """Whether the caller of the function calling this is the cell's code (not torch's, ours)."""
    if torch.compiler.is_compiling():  # Dynamo cannot read frames: torch's own answer
        return False
    caller = sys._getframe(2).f_globals.get("__name__") or ""
    return caller.partition(".")[0] not in _KEEP_THE_PROCESS_ANSWERS


def device_modules_as_cuda(
    real: Callable[..., Any], cuda: types.ModuleType, names_cuda: Callable[[Any], bool]
) -> Callable[..., Any]:
    """``torch.get_device_module`` on the host standing in for cuda: ``cuda`` for the cell's cuda.

    On a GPU the module of ``"cuda"`` (and, asked with no device, of the machine's accelerator) is
    ``torch.cuda``. The host's cuda device is a cpu one, whose module, ``torch.cpu``, has no random
    state: ``torch.random.fork_rng()`` raised AttributeError on the reference alone. ``cuda`` is
    the run's ``torch.cuda``; ``names_cuda`` tells a device argument that names the cell's cuda.
    With no device, torch's own calls and the workbench's keep the process's answer, as they do
    for ``torch.accelerator``.
    """

    @functools.wraps(real)
    def get_device_module(device: Any = None) -> Any:
        if names_cuda(device) or (device is None and _called_by_the_cell()):
            return cuda
        return real(device)

    return get_device_module


#: Packages whose calls to ``torch.accelerator`` get the process's own answers during a run.
_KEEP_THE_PROCESS_ANSWERS = frozenset({"torch", "neuron_workbench"})


#: The ``torch.cuda`` modules a cell imports names from, and the run's stand-in attribute for
#: each (``None``: the shim itself).
_IMPORTED_FROM = {"torch.cuda": None, "torch.cuda.memory": "memory", "torch.cuda.random": "random"}


class _RunsNames:
    """What a name bound to one of ``torch.cuda``'s own objects means during one run, and after.

    A function becomes a wrapper of its own (one of the run's functions may answer for several
    names: ``ipc_collect`` and ``empty_cache``) that calls the run's function of that name, so
    what the run wraps there (the measurement tags) holds, and that knows torch's function to
    give back. Anything else (``Event``, ``FloatTensor``) is the run's, and torch's own afterwards.
    """

    def __init__(self, shim: CudaModuleShim) -> None:
        self.shim = shim
        real = vars(shim._real)
        #: the names whose torch.cuda object the run answers for with another
        self.names = [
            name
            for name, own in vars(shim).items()
            if not name.startswith("_") and name in real and real[name] is not own
        ]
        # by id; submodules are left out (torch.cuda.nvtx has its functions answered where they
        # are): a name the notebook bound to one stays that module
        self.replaced: dict[int, tuple[Any, str]] = {
            id(real[name]): (real[name], name)
            for name in self.names
            if not isinstance(real[name], types.ModuleType)
        }
        self.wrappers: dict[int, tuple[Any, Any]] = {}

    def of(self, value: Any) -> Any:
        """The run's meaning of ``value``, or ``value`` itself when it is none of torch.cuda's."""
        found = self.replaced.get(id(value))
        if found is None or found[0] is not value:
            return value
        original, name = found
        if not isinstance(original, types.FunctionType):
            return getattr(self.shim, name)
        shim = self.shim

        @functools.wraps(original)
        def runs(*args: Any, **kwargs: Any) -> Any:
            return getattr(shim, name)(*args, **kwargs)

        self.wrappers[id(runs)] = (runs, original)
        return runs

    def given_back(self) -> dict[int, tuple[Any, Any]]:
        """By ``id``: each object of the run's a name may hold now, and torch's own for it."""
        real = vars(self.shim._real)
        back = dict(self.wrappers)
        for name in self.names:
            # a function's name holds a wrapper; the run's own function may be torch's
            # (torch.seed answers for torch.cuda.seed), which the notebook keeps
            if not isinstance(real[name], types.FunctionType):
                own = getattr(self.shim, name)
                back[id(own)] = (own, real[name])
        return back


class _ImportedFrom(types.ModuleType):
    """What ``from torch.cuda import name`` reads during a run: the run's meaning of each name.

    ``real`` is the module imported from, ``runs`` the run's stand-in for it (the shim, or its
    submodule), which answers for the names that are not torch.cuda's own replaced objects.
    """

    def __init__(self, real: types.ModuleType, runs: Any, names: _RunsNames) -> None:
        super().__init__(real.__name__, real.__doc__)
        self._real = real
        self._runs = runs
        self._names = names

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._real, name)
        meant = self._names.of(value)
        return meant if meant is not value else getattr(self._runs, name)


@contextlib.contextmanager
def cuda_names_in(namespace: dict[str, Any]) -> Iterator[None]:
    """For the body: names bound to ``torch.cuda``'s functions answer as the run's.

    Only the ``torch`` package's ``torch.cuda`` attribute is the run's (:class:`CudaModuleShim`),
    so ``from torch.cuda import synchronize``, at the notebook's top or in the cell, bound the real
    function, which asks for a CUDA build (``manual_seed_all`` queued its seed for a CUDA that
    never starts). The namespace's names for them answer as the run's for the body, and a ``from
    torch.cuda… import`` in the cell's code reads the run's meanings; afterwards each name still
    bound to one of them gets torch's own object back (the notebook's, as on a GPU). Nothing
    changes where ``torch.cuda`` is itself (a CUDA backend).
    """
    shim = torch.cuda
    if not isinstance(shim, CudaModuleShim):
        yield
        return
    names = _RunsNames(shim)
    for key, value in list(namespace.items()):
        meant = names.of(value)
        if meant is not value:
            namespace[key] = meant
    try:
        with _imports_from_the_run(names):
            yield
    finally:
        back = names.given_back()
        for key, value in list(namespace.items()):
            found = back.get(id(value))
            if found is not None and found[0] is value:
                namespace[key] = found[1]


@contextlib.contextmanager
def _imports_from_the_run(names: _RunsNames) -> Iterator[None]:
    """For the body: ``from torch.cuda import name`` outside torch and the workbench is the run's.

    The statement reads ``sys.modules["torch.cuda"]``, which stays the real module (torch's own
    code looks functions up there); the cell's statement is given the run's meanings instead.
    """
    real_import = builtins.__import__
    modules = {
        name: _ImportedFrom(
            sys.modules[name], names.shim if part is None else getattr(names.shim, part), names
        )
        for name, part in _IMPORTED_FROM.items()
    }

    def __import__(  # noqa: N807 (the builtin's name)
        name: str,
        globals: dict[str, Any] | None = None,  # noqa: A002 (the builtin's signature)
        locals: Any = None,  # noqa: A002
        fromlist: Any = (),
        level: int = 0,
    ) -> Any:
        module = real_import(name, globals, locals, fromlist, level)
        if fromlist and not level and name in modules:
            importer = (globals or {}).get("__name__") or ""
            if importer.partition(".")[0] not in _KEEP_THE_PROCESS_ANSWERS:
                return modules[name]
        return module

    builtins.__import__ = __import__
    try:
        yield
    finally:
        builtins.__import__ = real_import
