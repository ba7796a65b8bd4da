"""The host CPU standing in for a CUDA GPU: CUDA's semantics for the CUDA parts of a cell.

A cell written for CUDA behaves differently on the CPU in ways that have nothing to do with the port
being checked (``shared/notes/ecosystem.md`` §8). While the ``cpu`` backend stands in for ``cuda``:

- ``.cuda()``, ``.to("cuda")``, ``torch.as_tensor(..., device="cuda")`` return a copy, as a
  host-to-device copy does (on the CPU they would return the tensor itself, so an in-place op on the
  "moved" tensor would change the original); a tensor already "on cuda" is returned as it is;
- ``pin_memory()`` returns a pinned copy and ``is_pinned()`` answers as CUDA would; a
  ``DataLoader(pin_memory=True)`` yields pinned batches (:func:`loaders_pinning_on_host`);
- ``torch.autocast("cuda")`` casts the ops CUDA's autocast lists name (see
  :mod:`neuron_workbench.cuda_semantics.autocast`), not CPU's;
- optimizers and gradient clipping default to the ``foreach`` implementation, as on CUDA tensors;
- with TF32 enabled by the cell (``torch.backends.cuda.matmul.allow_tf32 = True`` or
  ``torch.set_float32_matmul_precision("high")``) float32 matmuls round their inputs to TF32, as an
  Ampere or newer GPU does (``--ref-precision fp32`` turns this off);
- ``torch.cuda``'s memory statistics answer with the run's own accounting (:class:`HostMemory`)
  when the cell reads them.

What stays different is said in :attr:`CudaOnHost.notes`, which reports list.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from neuron_workbench.backends.base import MemoryStats
from neuron_workbench.dispatch_calls import call_op
from neuron_workbench.run.patching import loaded_modules_under, patched_attributes
from neuron_workbench.run.records import RunFacts

#: ``--ref-precision`` choices: compute as a CUDA GPU would (TF32 when the cell enables it), or fp32.
REF_PRECISIONS = ("cuda", "fp32")

#: The matmul kernels a GPU computes in TF32 when enabled, with the positions of the operands
#: TF32 rounds: the two matrices; the tensor an ``addmm`` adds (a Linear's bias) is read in float32,
#: as cuBLAS reads C. Inductor's compiled code calls the ``out=`` forms
#: (``extern_kernels.addmm(..., out=buf)``).
_MATMULS = {
    getattr(getattr(torch.ops.aten, name), overload): operands
    for name, operands in (
        ("mm", (0, 1)),
        ("bmm", (0, 1)),
        ("addmm", (1, 2)),
        ("baddbmm", (1, 2)),
        ("addbmm", (1, 2)),
    )
    for overload in ("default", "out")
}


def tf32_enabled() -> bool:
    """Whether a CUDA GPU would compute float32 matmuls with TF32 inputs right now.

    cuBLAS reads the CUDA matmul precision of torch's newer switches
    (``torch.backends.cuda.matmul.fp32_precision``, or ``torch.backends.fp32_precision`` it
    inherits); ``allow_tf32 = True`` and ``torch.set_float32_matmul_precision("high")`` set it too
    (``get_float32_matmul_precision`` may report an emulated TPU's mode instead). The legacy
    ``allow_tf32`` is not read: torch refuses to once a program used the newer switch alone.
    """
    return torch.backends.cuda.matmul.fp32_precision == "tf32"


def may_enable_tf32(source: str) -> bool:
    """Whether a cell with this source may compute with TF32 (it is on, or the cell names it)."""
    return tf32_enabled() or "tf32" in source or "float32_matmul_precision" in source


def round_to_tf32(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` (float32) with its mantissa rounded to TF32's 10 bits, to nearest, ties away."""
    bits = tensor.contiguous().view(torch.int32)
    rounded = ((bits + 0x1000) & ~0x1FFF).view(torch.float32)
    return torch.where(torch.isfinite(tensor), rounded, tensor)


class _Tf32Matmuls(TorchDispatchMode):
    """Rounds float32 matmul inputs to TF32 while the cell has TF32 enabled (forward and backward)."""

    def __init__(self, on_use: Callable[[], None]) -> None:
        super().__init__()
        self._on_use = on_use

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Dynamo skips every frame while a mode that says False is active: a compiled model ran
        # eagerly on the reference, and fullgraph=True raised there ("found no compiled frames").
        # True: Dynamo compiles without the mode, and the compiled code's matmul kernels, which
        # Inductor calls through the dispatcher, still come here, as cuBLAS computes in TF32.
        return True

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        operands = _MATMULS.get(func)
        if operands is not None and tf32_enabled():
            rounded = tuple(
                round_to_tf32(a)
                if i in operands and isinstance(a, torch.Tensor) and a.dtype == torch.float32
                else a
                for i, a in enumerate(args)
            )
            # TF32 applies to float32 matmuls only: a bfloat16 or float64 one is no evidence of
            # it (the report's TF32 note and hint read this)
            if any(r is not a for r, a in zip(rounded, args)):
                self._on_use()
                args = rounded
        return call_op(func, args, kwargs)


class HostMemory(TorchDispatchMode):
    """The run's accounting of host memory, standing in for CUDA's allocator statistics.

    What it counts: the storages of the tensors the run starts with on "cuda" (placed there by
    earlier cells), and every CPU storage an op returns during the run (new tensors, copies made by
    ``.cuda()``, activations, gradients, optimizer state; also tensors the cell keeps on the CPU on
    purpose, which a GPU would not count), each once, from when it appears until it is freed. Not
    counted: scratch memory inside CPU kernels, and storages made outside the calling thread
    (DataLoader workers). Nothing is cached, so reserved equals allocated. It costs a little per op,
    so a run enters it only when the cell reads memory statistics.
    """

    def __init__(self, resident: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._live: dict[int, weakref.finalize] = {}
        for tensor in resident:
            self._count(tensor)

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """True: Dynamo compiles while the run counts (see :class:`_Tf32Matmuls`).

        A cell reading memory statistics compiled nothing on the reference otherwise. The storages
        compiled code allocates outside the dispatcher are not counted.
        """
        return True

    def _count(self, tensor: torch.Tensor) -> None:
        if tensor.device.type != "cpu" or tensor.layout != torch.strided:
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # no storage (a wrapper subclass)
            return
        key = storage._cdata
        if key in self._live:
            return
        nbytes = storage.nbytes()
        self._live[key] = weakref.finalize(storage, self._free, key, nbytes)
        self.current += nbytes
        if self.current > self.peak:
            self.peak = self.current

    def _free(self, key: int, nbytes: int) -> None:
        if self._live.pop(key, None) is not None:
            self.current -= nbytes

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        out = call_op(func, args, kwargs)
        if isinstance(out, torch.Tensor):
            self._count(out)
        elif isinstance(out, tuple | list):
            for item in out:
                if isinstance(item, torch.Tensor):
                    self._count(item)
        return out

    def stats(self) -> MemoryStats:
        """Current and peak bytes."""
        return MemoryStats(self.current, self.peak)

    def reset_peak(self) -> None:
        """Start a new peak window at the current figure."""
        self.peak = self.current

    def close(self) -> None:
        """Stop watching the storages still alive (their figures stay as they are)."""
        for finalizer in self._live.values():
            finalizer.detach()
        self._live.clear()


# PyTorch wraps a mode's __torch_dispatch__ in a dynamo-disable guard that costs more per op than
# this bookkeeping does; the mode never traces anything, so it runs as written.
_accounting = HostMemory.__dict__["__torch_dispatch__"]
HostMemory.__torch_dispatch__ = getattr(_accounting, "__wrapped__", _accounting)  # type: ignore[method-assign]


def device_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy made the way a host-to-device copy is: allocate, then ``copy_`` (differentiable).

    Unlike ``clone()`` it leaves the copy's version counter at 1, as on a device, so a module moved
    to "cuda" reads as changed in place on every backend alike.
    """
    out = torch.empty_like(tensor)
    return out.copy_(tensor)


def _uninitialized(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a lazy module's parameter or buffer before its first call.

    It has no data to copy (``nn.LazyLinear(2).cuda()``): the first call makes it, on the input's
    device.
    """
    return isinstance(tensor, torch.nn.parameter.UninitializedTensorMixin)


class CudaOnHost:
    """One run's bookkeeping of the host CPU acting as a CUDA device.

    Parameters
    ----------
    resident : iterable of Tensor
        Tensors the run starts with that earlier cells placed on "cuda" (moving them again is a
        no-op on CUDA, so it must return them, not copies).
    precision : str
        ``cuda`` (TF32 matmuls when the cell enables them) or ``fp32``.
    account_memory : bool
        Keep :class:`HostMemory` accounting during the run (the cell reads memory statistics);
        otherwise they answer 0.
    """

    def __init__(
        self,
        resident: Iterable[torch.Tensor] = (),
        precision: str = "cuda",
        account_memory: bool = False,
    ) -> None:
        self._resident: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._pinned: WeakIdKeyDictionary = WeakIdKeyDictionary()
        # torch.device objects cannot be weakly referenced; the run holds them (a few at most).
        self._cuda_devices: dict[int, torch.device] = {}
        self._device_on_cuda: torch.device | None = None
        for tensor in resident:
            self._resident[tensor] = True
        self.precision = precision
        self._stack = contextlib.ExitStack()
        self._cuda_autocast = False
        self.used_tf32 = False
        self.gpu_tf32_convolutions = False
        self.gpu_fused_attention = False
        self.used_foreach_default = False
        self.helpers_used_foreach = False
        self.account_memory = account_memory
        self._memory: HostMemory | None = None

    # -- placement -------------------------------------------------------------------------------
    def on_device(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is known to be on "cuda" (moved or created there in this session)."""
        return tensor in self._resident

    def mark(self, value: Any) -> Any:
        """Remember the tensor ``value`` as being on "cuda"; return it."""
        if isinstance(value, torch.Tensor):
            self._resident[value] = True
        return value

    def moved(self, source: torch.Tensor, result: torch.Tensor) -> Any:
        """What moving ``source`` to "cuda" gives: ``result``, or a copy where CUDA would copy.

        A parameter moved by ``Module.to`` keeps its identity on CUDA (its ``.data`` is swapped), so
        the parameter itself counts as on the device from then on.
        """
        if result is source and not self.on_device(source) and not _uninitialized(source):
            result = device_copy(source)
        if isinstance(source, torch.nn.Parameter):
            self._resident[source] = True
        return self.mark(result)

    def remember_cuda_device(self, device: torch.device) -> torch.device:
        """Note that ``device`` (now a CPU device object) is what the cell built as ``"cuda"``."""
        self._cuda_devices[id(device)] = device
        return device

    def names_cuda(self, value: Any) -> bool:
        """Whether ``value`` is a device object the cell built as ``torch.device("cuda")``."""
        return type(value) is torch.device and self._cuda_devices.get(id(value)) is value

    def device_of(self, tensor: torch.Tensor, device: torch.device) -> torch.device:
        """What ``tensor.device`` answers: one device object naming cuda for a tensor on "cuda".

        ``x.to(next(model.parameters()).device)`` then copies ``x`` as a move to a GPU does.
        """
        if device.type != "cpu" or not self.on_device(tensor):
            return device
        if self._device_on_cuda is None:  # one per run: the run holds every device it remembers
            self._device_on_cuda = self.remember_cuda_device(device)
        return self._device_on_cuda

    # -- pinned memory ---------------------------------------------------------------------------
    def pin(self, tensor: torch.Tensor) -> torch.Tensor:
        """A pinned copy of ``tensor`` (the tensor itself when it is pinned already)."""
        if tensor in self._pinned:
            return tensor
        pinned = tensor.clone()
        self._pinned[pinned] = True
        return pinned

    def pinned_new(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor``, just made with ``pin_memory=True``: pinned from now on."""
        self._pinned[tensor] = True
        return tensor

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        """What ``tensor.is_pinned()`` answers on a CUDA machine."""
        return tensor in self._pinned

    # -- memory ----------------------------------------------------------------------------------
    def memory_stats(self) -> MemoryStats:
        """What ``torch.cuda``'s memory statistics read: the run's accounting, or zeros without it."""
        return self._memory.stats() if self._memory is not None else MemoryStats(0, 0)

    def reset_peak_memory(self) -> None:
        """``torch.cuda.reset_peak_memory_stats()``."""
        if self._memory is not None:
            self._memory.reset_peak()

    # -- numerics --------------------------------------------------------------------------------
    def use_cuda_autocast_lists(self) -> None:
        """From now until the run ends, CPU autocast casts what CUDA autocast casts."""
        if not self._cuda_autocast:
            from neuron_workbench.cuda_semantics.autocast import cuda_autocast_lists

            self._stack.enter_context(cuda_autocast_lists())
            self._cuda_autocast = True

    def under_cuda_autocast(self) -> bool:
        """Whether CPU autocast is on with CUDA's lists (the cell entered ``autocast("cuda")``)."""
        return self._cuda_autocast and torch.is_autocast_enabled("cpu")

    def _note_tf32(self) -> None:
        self.used_tf32 = True

    def note_attention(self) -> None:
        """Note an attention call, which a GPU computes with a fused kernel unless only math is on.

        With ``sdpa_kernel(SDPBackend.MATH)`` (or the others switched off) a GPU takes the math
        path, as this reference then does.
        """
        backends = torch.backends.cuda
        if (
            backends.flash_sdp_enabled()
            or backends.mem_efficient_sdp_enabled()
            or backends.cudnn_sdp_enabled()
        ):
            self.gpu_fused_attention = True

    def note_convolution(self, input: Any) -> None:
        """Note a convolution of ``input``, which a GPU may compute with TF32 inputs.

        It does when cuDNN's TF32 is on (its default), the input is float32 and no autocast casts
        it; this reference computes in float32.
        """
        if (
            isinstance(input, torch.Tensor)
            and input.dtype == torch.float32
            and not self.under_cuda_autocast()
            and torch.backends.cudnn.conv.fp32_precision == "tf32"
        ):
            self.gpu_tf32_convolutions = True

    @contextlib.contextmanager
    def active(self, may_enable_tf32: bool) -> Iterator[CudaOnHost]:
        """Apply the run-long parts (foreach defaults, TF32) around the cell; undo them after.

        ``may_enable_tf32``: the cell mentions TF32 settings, or they are on already. The TF32
        dispatch mode costs a little per op, so it is only entered then.
        """
        with self._stack:
            self._stack.enter_context(_foreach_by_default(self))
            self._stack.enter_context(_capturable_on_the_host())
            self._stack.enter_context(_optimizer_state_loaded_onto_the_device(self))
            if self.precision == "cuda" and may_enable_tf32:
                self._stack.enter_context(_Tf32Matmuls(self._note_tf32))
            if self.account_memory:
                self._memory = HostMemory(list(self._resident.keys()))
                self._stack.callback(self._memory.close)
                self._stack.enter_context(self._memory)
            yield self

    # -- report ----------------------------------------------------------------------------------
    def notes(self, facts: RunFacts) -> list[str]:
        """What this reference did as CUDA would, and what stays different from a real GPU."""
        notes = []
        if self._cuda_autocast:
            notes.append(
                "autocast('cuda') used CUDA's op lists (softmax, norms, losses in float32)"
            )
        if self.used_tf32:
            notes.append("float32 matmuls rounded their inputs to TF32, as the cell enabled")
        elif self.precision == "fp32":
            notes.append("float32 matmuls in full float32 (--ref-precision fp32)")
        users = [
            who
            for who, used in (
                ("optimizers", self.used_foreach_default),
                ("gradient clipping (torch's foreach helpers)", self.helpers_used_foreach),
            )
            if used
        ]
        if users:
            notes.append(
                f"{' and '.join(users)} used the foreach implementation CUDA tensors default to"
            )
        if self._memory is not None:
            notes.append(
                "memory statistics are this run's accounting of the tensor storages it allocated "
                "on the host, not a GPU allocator's"
            )
        if self.gpu_tf32_convolutions:
            notes.append(
                "differs from a GPU: Ampere and newer GPUs compute float32 convolutions with TF32 "
                "inputs by default (torch.backends.cudnn.allow_tf32); this reference uses float32"
            )
        if self.gpu_fused_attention:
            notes.append(
                "differs from a GPU: CUDA picks flash, memory-efficient or cuDNN attention kernels; "
                "this reference used the CPU's scaled_dot_product_attention kernel"
            )
        if facts.rnn_calls:
            notes.append(
                "differs from a GPU: CUDA runs recurrent layers as one cuDNN kernel; this "
                "reference runs the CPU's per-cell path (in the lower precision under autocast)"
            )
        if facts.random_ops:
            notes.append(
                "differs from a GPU: CUDA's generator (Philox) draws other numbers than the CPU's; "
                "this reference draws the CPU's (--rng cpu gives every device the CPU's numbers)"
            )
        return notes


@contextlib.contextmanager
def _capturable_on_the_host() -> Iterator[None]:
    """Optimizers built with ``capturable=True`` step CPU tensors, as they step CUDA tensors.

    Each optimizer module checks its parameters' device against the list
    ``_get_capturable_supported_devices`` gives (CUDA, XPU, HPU, the PrivateUse1 device, XLA), which
    has no ``cpu``: without it ``torch.optim.AdamW(..., capturable=True)`` (TorchTPU's advice for
    compiled steps, CUDA graphs' requirement) raised on the reference alone.
    """
    import torch.optim.optimizer as optimizer_module

    original = optimizer_module._get_capturable_supported_devices

    def supported(supports_xla: bool = True) -> list[str]:
        return [*original(supports_xla), "cpu"]

    # the optimizer modules import it by name: each module's own name is replaced
    modules = [
        module
        for module in loaded_modules_under("torch.optim.")
        if getattr(module, "_get_capturable_supported_devices", None) is original
    ]
    for module in modules:
        module._get_capturable_supported_devices = supported  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module in modules:
            module._get_capturable_supported_devices = original  # type: ignore[attr-defined]


@contextlib.contextmanager
def _foreach_by_default(host: CudaOnHost) -> Iterator[None]:
    """Optimizers and ``clip_grad_norm_`` pick ``foreach`` for CPU tensors, as for CUDA tensors."""
    import torch.optim.optimizer as optimizer_module
    import torch.utils._foreach_utils as foreach_utils

    original = foreach_utils._get_foreach_kernels_supported_devices

    # each caller noted apart: a fused optimizer with clip_grad_norm_ (nanoGPT's step) picks
    # foreach for the clipping alone
    def for_optimizers() -> list[str]:
        host.used_foreach_default = True
        return [*original(), "cpu"]

    def for_helpers() -> list[str]:
        host.helpers_used_foreach = True
        return [*original(), "cpu"]

    saved = optimizer_module._get_foreach_kernels_supported_devices
    optimizer_module._get_foreach_kernels_supported_devices = for_optimizers
    foreach_utils._get_foreach_kernels_supported_devices = for_helpers
    try:
        yield
    finally:
        optimizer_module._get_foreach_kernels_supported_devices = saved
        foreach_utils._get_foreach_kernels_supported_devices = original


@contextlib.contextmanager
def _optimizer_state_loaded_onto_the_device(host: CudaOnHost) -> Iterator[None]:
    """``optimizer.load_state_dict(ckpt["opt"])`` copies host state onto "cuda", as CUDA copies it.

    The optimizer casts each state tensor to its parameter's device; on the host standing in for
    cuda that cast returned the checkpoint's own tensor, so training changed the checkpoint the
    notebook holds, which on a GPU stays as loaded (the target's did: a false FAIL on it). The
    ``step`` counters stay where they are, as PyTorch keeps them (on the host, shared) there too.
    """
    optimizer = torch.optim.Optimizer
    original = vars(optimizer).get("_process_value_according_to_param_policy")
    if not isinstance(original, staticmethod):  # a PyTorch without it: nothing to do
        yield
        return
    cast = original.__func__

    def process(
        param: torch.Tensor,
        value: torch.Tensor,
        param_id: int,
        param_groups: Any,
        key: Any = None,
    ) -> torch.Tensor:
        result = cast(param, value, param_id, param_groups, key)
        if key == "step" or not host.on_device(param):
            return result
        if result is value and not host.on_device(value):
            result = device_copy(value)
        return host.mark(result)

    with patched_attributes(
        optimizer, {"_process_value_according_to_param_policy": staticmethod(process)}
    ):
        yield


@contextlib.contextmanager
def parallel_comm_on_host(host: CudaOnHost) -> Iterator[None]:
    """``nn.DataParallel`` on the host standing in for one GPU: its scatter and gather work.

    A torch without CUDA has no ``torch._C._scatter``/``_gather``, which
    ``torch.nn.parallel.comm`` calls. On one GPU, scattering an input already there gives views of
    it, and a host input is copied to the GPU; gathering concatenates. These do the same on
    ``host``.
    """
    if hasattr(torch._C, "_scatter"):  # a CUDA build of torch has its own
        yield
        return
    from torch.nn.parallel import comm

    def scatter(
        tensor: torch.Tensor,
        devices: Any = None,
        chunk_sizes: Any = None,
        dim: int = 0,
        streams: Any = None,
        *,
        out: Any = None,
    ) -> tuple[torch.Tensor, ...]:
        if out is not None:
            chunks = tensor.split([o.shape[dim] for o in out], dim)
            return tuple(o.copy_(c) for o, c in zip(out, chunks))
        if chunk_sizes is not None:
            chunks = tensor.split(list(chunk_sizes), dim)
        else:
            chunks = tensor.chunk(len(devices), dim)
        if host.on_device(tensor):
            return tuple(chunks)
        return tuple(host.mark(device_copy(chunk)) for chunk in chunks)

    def gather(
        tensors: Any, dim: int = 0, destination: Any = None, *, out: Any = None
    ) -> torch.Tensor:
        return torch.cat(list(tensors), dim, out=out)

    def scatter_backward(ctx: Any, *grad_output: torch.Tensor) -> tuple[Any, ...]:
        # the input's gradient gathered back (torch's Gather refuses host tensors)
        return None, None, None, torch.cat(grad_output, ctx.dim)

    from torch.nn.parallel._functions import Scatter

    with (
        patched_attributes(comm, {"scatter": scatter, "gather": gather}),
        patched_attributes(Scatter, {"backward": staticmethod(scatter_backward)}),
    ):
        yield


#: The start of torch's warning that a loader asked for pinned memory where no accelerator is.
_NO_ACCELERATOR_TO_PIN_FOR = "'pin_memory' argument is set as true but no accelerator is found"


@contextlib.contextmanager
def loaders_pinning_on_host() -> Iterator[None]:
    """``DataLoader(pin_memory=True)`` yields pinned batches on the host, as on a GPU, silently.

    torch pins a loader's batches only where ``torch.accelerator`` finds a device, and torch's own
    code gets the process's answer to that (:class:`~neuron_workbench.run.cuda_module.AcceleratorShim`):
    on the host standing in for cuda each iterator warned "no accelerator is found" and yielded
    batches whose ``is_pinned()`` was False, where the target's (and a GPU's) are pinned. Here the
    iterator pins each batch as it yields it, through the run's ``pin_memory()``; a GPU pins them in
    a thread of the loader's, which changes when, not what.
    """
    from torch.utils.data import _utils, dataloader

    iterator_cls = dataloader._BaseDataLoaderIter
    original_init = vars(iterator_cls)["__init__"]
    original_next = vars(iterator_cls)["__next__"]

    def init(self: Any, loader: Any) -> None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", _NO_ACCELERATOR_TO_PIN_FOR, UserWarning)
            original_init(self, loader)
        # a loader torch itself pins for (a real accelerator) is left to torch
        self._neuron_workbench_pins_on_host = bool(loader.pin_memory) and not self._pin_memory

    def next_batch(self: Any) -> Any:
        batch = original_next(self)
        if getattr(self, "_neuron_workbench_pins_on_host", False):
            batch = _utils.pin_memory.pin_memory(batch)
        return batch

    with patched_attributes(iterator_cls, {"__init__": init, "__next__": next_batch}):
        yield


@contextlib.contextmanager
def profiler_on_host() -> Iterator[None]:
    """``torch.profiler.profile(activities=[CPU, CUDA])`` on the host: its CPU activity only.

    A torch without CUDA warns ``Failed to record CUDA event`` (with a C++ stack) for every op a
    profiler with the CUDA activity records, where a GPU records its kernels silently. The host has
    no kernels to record: the profile keeps the CPU side, as the reference's timings are its own.
    So does the legacy ``torch.autograd.profiler.profile(use_cuda=True)`` (``use_device="cuda"``),
    which the run's ``torch.cuda.is_available()`` no longer turns off.
    """
    from torch.autograd import ProfilerState
    from torch.autograd import profiler as legacy
    from torch.profiler import ProfilerActivity
    from torch.profiler.profiler import _KinetoProfile

    original = vars(_KinetoProfile)["__init__"]

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.activities.discard(ProfilerActivity.CUDA)
        self.activity_filters.pop(ProfilerActivity.CUDA, None)
        if self.use_device == "cuda":
            self.use_device = None

    legacy_original = vars(legacy.profile)["__init__"]

    def legacy_init(self: Any, *args: Any, **kwargs: Any) -> None:
        legacy_original(self, *args, **kwargs)
        if self.use_device == "cuda":
            self.use_device = None
            self.kineto_activities.discard(ProfilerActivity.CUDA)
            if self.profiler_kind == ProfilerState.KINETO_GPU_FALLBACK:
                self.profiler_kind = ProfilerState.KINETO

    with (
        patched_attributes(_KinetoProfile, {"__init__": init}),
        patched_attributes(legacy.profile, {"__init__": legacy_init}),
    ):
        yield
