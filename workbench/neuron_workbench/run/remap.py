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
  names one;
- ``torch.load`` restores storages located on ``cuda`` (``map_location="cuda"``, a checkpoint saved
  on a GPU) on the run's device; on the host standing in for cuda, what ``map_location="cuda"``
  loads is on "cuda" (moving it there again returns it, as on a GPU);
- ``torch.cuda.Stream`` and the stream functions are the device module's (no-ops on the host), and
  ``Tensor.record_stream`` with such a stand-in records nothing;
- ``torch.Generator("cuda")`` makes the run's device's generator, or a CPU one where the device has
  none of its own (the host, the emulated devices).

When the ``cpu`` backend stands in for ``cuda``, the CUDA parts of the cell also get CUDA's semantics
(copies on ``.cuda()``, CUDA's autocast lists, pinned memory, foreach optimizers, TF32 when the cell
enables it): see :mod:`neuron_workbench.run.cuda_on_host`; dropout takes CUDA's fused kernel at the
dispatcher (:mod:`neuron_workbench.cuda_semantics.dropout`).

The backward pass runs with the same remapping as the forward (checkpoint recomputes, hooks and
``autograd.Function.backward`` run inside the autograd engine, possibly on its threads).

Everything is restored on exit. On the ``cuda`` backend itself nothing is changed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any
from weakref import WeakSet

import torch
from torch.overrides import TorchFunctionMode

from neuron_workbench.backends.base import Backend
from neuron_workbench.cuda_semantics import rnn as cuda_rnn
from neuron_workbench.cuda_semantics.attention import host_attention_kernels
from neuron_workbench.cuda_semantics.dropout import fused_dropout_on_cpu
from neuron_workbench.run.compiled_frames import (
    drop_code_compiled_for_the_dead,
    keep_dynamo_out_of_the_workbench,
)
from neuron_workbench.run.cuda_module import (
    CUDA_PROFILER_FUNCTIONS,
    EMIT_NVTX_METHODS,
    NVTX,
    AcceleratorShim,
    CudaModuleShim,
    cuda_module_shims,
    device_modules_as_cuda,
    legacy_cuda_dtype,
)
from neuron_workbench.run.cuda_on_host import (
    CudaOnHost,
    loaders_pinning_on_host,
    parallel_comm_on_host,
    profiler_on_host,
)
from neuron_workbench.run.measurements import (
    SCALAR_CONVERSIONS,
    TAGGED,
    materialise,
    tracked,
    without_tags,
)
from neuron_workbench.run.namespace import tensors_in
from neuron_workbench.run.patching import patched_attributes
from neuron_workbench.run.random_draws import (
    DROPOUTS,
    F_DROPOUT,
    RANDOM_FACTORIES,
    RANDOM_IN_PLACE,
    draw_on_cpu,
    draws_on_device,
    dropout_from_cpu,
    fingerprint,
    original_function,
)
from neuron_workbench.run.records import RunFacts
from neuron_workbench.run.unversioned_writes import UnversionedWrites
from neuron_workbench.run.warning_sites import warnings_at_callers_line

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


def _may_name_cuda(value: Any, host: CudaOnHost | None) -> bool:
    """Whether ``value`` may name the cell's cuda.

    A ``"cuda…"`` string, a cuda device, or a device the ``host`` standing in for cuda made from one.
    """
    kind = type(value)
    return (kind is str and value.startswith("cuda")) or (
        kind is torch.device
        and (value.type == "cuda" or (host is not None and host.names_cuda(value)))
    )


def _index_as_cuda(value: Any) -> Any:
    """An accelerator index (a DDP script's ``rank``) as the cell means it: ``cuda:<index>``.

    Anything else is returned as it is.
    """
    return f"cuda:{value}" if type(value) is int else value


class _CudaToDeviceMode(TorchFunctionMode):
    """Rewrites CUDA device arguments of torch calls to the run's device type.

    It also notes what a numerics report wants to know (random draws, dropout in training,
    non-deterministic accumulation) and, with ``rng_on_cpu``, draws random numbers from the CPU
    generator and moves them, so two different devices see the same numbers.
    """

    def __init__(
        self,
        target: str,
        facts: RunFacts,
        *,
        remap: bool = True,
        rng_on_cpu: bool = False,
        host: CudaOnHost | None = None,
        writes: UnversionedWrites | None = None,
    ):
        super().__init__()
        self.target = target
        self.facts = facts
        self.remap = remap
        self.rng_on_cpu = rng_on_cpu
        self.host = host
        self.writes = writes

    #: Dynamo traces compiled code as if this mode were off the stack, so a compiled cell breaks
    #: its graphs where and as often as a plain one (see ``run.compiled_frames``); the devices it
    #: maps reach compiled graphs through :meth:`graph_call` and :meth:`graph_is_cuda`.
    hidden_from_dynamo = True

    def graph_call(
        self, kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, Any, tuple[Any, ...], dict[str, Any]] | None:
        """The node Dynamo is to put into a graph for a call of compiled code, on the run's device.

        Called once per graph node while Dynamo traces (never when a graph runs).

        Parameters
        ----------
        kind : str
            ``"call_function"`` or ``"call_method"``.
        target : Any
            The function, or the method's name.
        args, kwargs : tuple, dict
            The node's arguments: graph values and constants.

        Returns
        -------
        tuple or None
            ``(kind, target, args, kwargs)`` with ``"cuda"`` devices mapped as the mode maps them
            in eager code (``x.cuda()`` is ``x.to(<device>)``, ``x.to(rank)`` an index of cuda), or
            None when the call names no cuda device.
        """
        if not self.remap:
            return None
        device = self.target
        if kind == "call_method" and target == "cuda" and args:
            return "call_method", "to", *_cuda_call_as_to(device, args, kwargs)
        if kind == "call_method" and target == "to" and len(args) > 1 and type(args[1]) is int:
            args = (args[0], _index_as_cuda(args[1]), *args[2:])
        if type(kwargs.get("device")) is int:
            kwargs = {**kwargs, "device": _index_as_cuda(kwargs["device"])}
        mapped_args = tuple(remap_device(arg, device) for arg in args)
        mapped_kwargs = {name: remap_device(value, device) for name, value in kwargs.items()}
        if all(a is b for a, b in zip(args, mapped_args)) and all(
            mapped_kwargs[name] is value for name, value in kwargs.items()
        ):
            return None
        return kind, target, mapped_args, mapped_kwargs

    def graph_is_cuda(self, device: torch.device) -> bool | None:
        """``Tensor.is_cuda`` of a tensor on ``device`` in compiled code, as in eager code.

        Parameters
        ----------
        device : torch.device
            The tensor's device in the graph Dynamo traces.

        Returns
        -------
        bool or None
            Whether the tensor is on the run's device, or None where the mode maps no device
            (torch's own answer then).
        """
        return device.type == self.target if self.remap else None

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func is _TENSOR_TO and len(args) > 1 and type(args[1]) is int and self.remap:
            args = (args[0], _index_as_cuda(args[1]), *args[2:])  # x.to(rank)
        # Most calls (attribute reads, views, arithmetic) name no device and need no note: they go
        # straight through. Only a str or torch.device argument, or a device keyword, can name one.
        if func not in _SPECIAL:
            if not kwargs:
                for arg in args:
                    kind = type(arg)
                    if kind is str or kind is torch.device:
                        break
                else:
                    return func(*args)
            elif "device" not in kwargs and "pin_memory" not in kwargs:
                for arg in args:
                    kind = type(arg)
                    if kind is str or kind is torch.device:
                        break
                else:
                    return func(*args, **kwargs)
        owner = getattr(func, "__self__", None)
        if owner is _DATA_DESCRIPTOR:
            # p.data: what the cell writes through the alias changes p, unseen by p's version
            result = func(*args)
            if self.writes is not None and not torch.compiler.is_compiling():
                if func.__name__ == "__get__":
                    self.writes.aliased(args[0], result)
                elif sys._getframe(1).f_globals.get("__name__") != _MODULE_APPLY_MODULE:
                    # p.data = new; not Module.to / .half() swapping a parameter's data, a move
                    # that is no output (and is none on a device that swaps tensors instead)
                    self.writes.replaced(args[0])
            return result
        if owner is _DEVICE_DESCRIPTOR:
            # a parameter's device names cuda on the host, as on a GPU: x.to(p.device) copies x
            device = func(*args)
            if self.host is None or torch.compiler.is_compiling():
                return device
            return self.host.device_of(args[0], device)
        kwargs = kwargs or {}
        if func in SCALAR_CONVERSIONS:  # loss.item(): the scalar keeps its tensor's dtype
            return materialise(func, args, kwargs)
        if func is _TENSOR_FORMAT:  # f"{loss:.4f}": the .item() inside runs with the mode off
            return _formatted(*args, **kwargs)
        if self.remap:
            host = self.host
            if host is not None and kwargs.get("pin_memory") is True:
                # torch.empty(..., pin_memory=True) (safetensors' load onto cuda): a tensor the
                # host answers is_pinned() for, as CUDA's pinned allocator would give; pinned
                # memory is host memory, so one asked for on cuda is refused as CUDA refuses it
                device = _index_as_cuda(kwargs.get("device"))
                if device is not None and remap_device(device, "x") is not device:
                    raise RuntimeError("Only dense CPU tensors can be pinned")
                unpinned = {**kwargs, "pin_memory": False}
                return host.pinned_new(self.__torch_function__(func, types, args, unpinned))
            if func is _TENSOR_CUDA:
                result = _tensor_cuda_to(self.target, *args, **kwargs)
                if host is not None:
                    result = host.moved(args[0], result)
                return result
            if func is _TENSOR_TYPE:
                dtype = legacy_cuda_dtype(args[1] if len(args) > 1 else kwargs.get("dtype"))
                if dtype is not None:  # x.type(torch.cuda.FloatTensor): to the run's device
                    blocking = {"non_blocking": kwargs.get("non_blocking", False)}
                    return self.__torch_function__(
                        _TENSOR_TO, types, (args[0], "cuda"), {"dtype": dtype, **blocking}
                    )
            if func is _TENSOR_PIN_MEMORY:
                return _pinned(host, args[0])
            if func is _TENSOR_IS_PINNED and host is not None:
                return host.is_pinned(args[0])
            if getattr(func, "__self__", None) is _IS_CUDA_DESCRIPTOR:
                return args[0].device.type == self.target
            if func in _GET_DEVICE and host is not None and args[0].device.type == "cpu":
                return 0  # on the host standing in for cuda:0 (as is_cuda answers, every tensor)
            target = self.target
            cuda_named = False
            for arg in args:
                # Only an argument that may name cuda is remapped; a device the run already has
                # (Module.to's ``t.to(device, dtype, non_blocking)`` for every tensor) goes as is.
                if _may_name_cuda(arg, host):
                    remapped = tuple(remap_device(a, target) for a in args)
                    cuda_named = any(a is not b for a, b in zip(args, remapped))
                    if host is not None and not cuda_named:
                        cuda_named = any(host.names_cuda(a) for a in args)
                    args = remapped
                    break
            device = kwargs.get("device")
            if type(device) is int:  # device=rank
                device = kwargs["device"] = _index_as_cuda(device)
            if device is not None:
                kwargs["device"] = remap_device(device, target)
                cuda_named = cuda_named or kwargs["device"] is not device
                if host is not None and not cuda_named:
                    cuda_named = host.names_cuda(device)
            if cuda_named and host is not None:
                return self._on_host_device(host, func, args, kwargs)
        # Inside a graph torch.compile traces, the notes (counts, fingerprints) are not taken.
        if func in _NOTEWORTHY and not torch.compiler.is_compiling():
            return self._noteworthy(func, args, kwargs)
        return func(*args, **kwargs)

    def _on_host_device(
        self, host: CudaOnHost, func: Callable[..., Any], args: tuple[Any, ...], kwargs: Any
    ) -> Any:
        """A call that named "cuda", on the host standing in for it: copy where CUDA copies."""
        result = (
            self._noteworthy(func, args, kwargs, named_cuda=True)
            if func in _NOTEWORTHY
            else func(*args, **kwargs)
        )
        if func is torch.device:
            # torch.device("cuda", 0) is the host's one device: no index, as the host's tensors
            # report it (cuda:0 equals a tensor's device on a GPU; cpu:0 never equals cpu)
            return host.remember_cuda_device(torch.device(result.type))
        if func is _TENSOR_TO:
            return host.moved(args[0], result)
        if func is _PARSE_TO and result[0] is not None:
            # model.to("cuda") or .to(device): each tensor's move names the cell's cuda, so the
            # module's tensors are copied onto "cuda" and known there, as model.cuda() does
            return (host.remember_cuda_device(result[0]), *result[1:])
        if func in _AS_TENSOR and args:
            source = args[0]
            on_device = isinstance(source, torch.Tensor) and host.on_device(source)
            if not on_device and isinstance(result, torch.Tensor) and _may_share_memory(source):
                result = result.clone()
        return host.mark(result)

    def _noteworthy(
        self,
        func: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        named_cuda: bool = False,
    ) -> Any:
        facts = self.facts
        if func in _CONVOLUTIONS:
            facts.convolutions += 1
            if self.host is not None:
                self.host.note_convolution(args[0] if args else kwargs.get("input"))
            return func(*args, **kwargs)
        if func is _SDPA:
            facts.attention_calls += 1
            if self.host is not None:
                self.host.note_attention()
            query = args[0] if args else kwargs.get("query")
            if self.host is not None and isinstance(query, torch.Tensor):
                # sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION) leaves a GPU a kernel the CPU lacks
                with host_attention_kernels(query):
                    return func(*args, **kwargs)
            return func(*args, **kwargs)
        if func in _RNNS:
            facts.rnn_calls += 1
            if self.host is not None and self.host.under_cuda_autocast():
                # CUDA runs RNNs under autocast in the lower precision; the CPU's oneDNN RNN kernel
                # is outside CUDA's lists and would stay in float32. Take the path ATen takes on a
                # GPU-like device (per-step matmuls, fused cells), as the emulated targets do.
                device_path = cuda_rnn.device_path(func, args)
                if device_path is not None:
                    return device_path()
                dtype = torch.get_autocast_dtype("cpu")
                args = cuda_rnn.cast_float32(args, dtype)
                with torch.backends.mkldnn.flags(enabled=False):
                    return func(*args, **kwargs)
            return func(*args, **kwargs)
        name = _qualified_name(func)
        if func in _NONDETERMINISTIC:
            if (
                func not in _ACCUMULATE_ONLY
                or kwargs.get("accumulate")
                or (len(args) > 3 and args[3])
            ):
                facts.nondeterministic_ops[name] = facts.nondeterministic_ops.get(name, 0) + 1
            return func(*args, **kwargs)
        if func in DROPOUTS:
            training = kwargs.get("training", args[2] if len(args) > 2 else True)
            p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
            if not (training and p > 0):
                return func(*args, **kwargs)
            # In a CUDA cell dropout runs where its input is, which on the host standing in for
            # cuda is "cuda" unless proven otherwise (computed tensors are not tracked).
            if self.host is not None or self._on_device(args[0]):
                facts.dropout_in_training += 1
                facts.random_ops[name] = facts.random_ops.get(name, 0) + 1
                inplace = bool(kwargs.get("inplace", args[3] if len(args) > 3 else False))
                if self.rng_on_cpu and func is F_DROPOUT:
                    out = dropout_from_cpu(args[0], float(p), inplace)
                else:
                    out = func(*args, **kwargs)
            else:
                out = func(*args, **kwargs)
            # Every draw is fingerprinted, wherever it ran, so both runs' lists line up.
            facts.note_draw(name, fingerprint(out, zeros_only=True))
            return out
        if draws_on_device(func, args, kwargs, self._on_device, named_cuda):
            facts.random_ops[name] = facts.random_ops.get(name, 0) + 1
            out = draw_on_cpu(func, args, kwargs) if self.rng_on_cpu else func(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        facts.note_draw(name, fingerprint(out))
        return out

    def _on_device(self, tensor: Any) -> bool:
        """Whether ``tensor`` is on the run's device (on the host: known to be on "cuda")."""
        if not isinstance(tensor, torch.Tensor):
            return False
        if self.host is not None:
            return self.host.on_device(tensor)
        return tensor.device.type != "cpu"


def _qualified_name(func: Callable[..., Any]) -> str:
    owner = getattr(func, "__objclass__", None) or getattr(func, "__self__", None)
    name = getattr(func, "__name__", repr(func))
    if isinstance(owner, type) and issubclass(owner, torch._C.TensorBase):
        return f"Tensor.{name}"
    module = getattr(func, "__module__", None) or "torch"
    return f"{module}.{name}" if module.startswith("torch.nn") else f"torch.{name}"


def _pinned(host: CudaOnHost | None, tensor: torch.Tensor) -> torch.Tensor:
    if host is not None:
        return host.pin(tensor)
    # A real accelerator pins for real; a device without a pinned allocator gets an unpinned copy
    # (pinning only changes the speed of host-to-device copies).
    try:
        return _TENSOR_PIN_MEMORY(tensor)
    except (RuntimeError, NotImplementedError):
        return tensor.clone()


def _may_share_memory(source: Any) -> bool:
    """Whether ``torch.as_tensor(source)`` on the CPU can return memory ``source`` owns."""
    # (a NumPy array of the run's, np.array(times) or a buffer np.zeros made, is a tagged one)
    return isinstance(source, (torch.Tensor, *TAGGED)) or type(source).__module__ == "numpy"


def _formatted(tensor: torch.Tensor, format_spec: str) -> str:
    """``format(tensor, spec)`` as torch gives it, its scalar (a 0-dim tensor's) made through the hook."""
    if type(tensor) is torch.Tensor and tensor.dim() == 0 and not tensor.is_meta:
        return format(materialise(_TENSOR_ITEM, (tensor.detach(),), {}), format_spec)
    return _TENSOR_FORMAT(tensor, format_spec)


_TENSOR_FORMAT = torch.Tensor.__format__
_TENSOR_ITEM = torch._C.TensorBase.item
_TENSOR_CUDA = torch.Tensor.cuda
_TENSOR_TO = torch.Tensor.to
#: ``Module.to``'s parser of its arguments, which gives the device each tensor moves to.
_PARSE_TO = torch._C._nn._parse_to
_TENSOR_PIN_MEMORY = torch.Tensor.pin_memory
_TENSOR_TYPE = torch.Tensor.type
_TENSOR_IS_PINNED = torch.Tensor.is_pinned
_TENSOR_RECORD_STREAM = torch.Tensor.record_stream


def _record_stream(tensor: torch.Tensor, stream: Any) -> None:
    # A stand-in stream (the host's, an emulated device's no-op one) is no torch.Stream, which
    # torch's argument parser refuses before any mode sees the call: there is nothing to record.
    if isinstance(stream, torch.Stream):
        _TENSOR_RECORD_STREAM(tensor, stream)


_AS_TENSOR = frozenset({original_function(torch.as_tensor), original_function(torch.asarray)})
_SDPA = torch.nn.functional.scaled_dot_product_attention
_CONVOLUTIONS = frozenset(
    {
        torch.conv1d,
        torch.conv2d,
        torch.conv3d,
        torch.conv_transpose1d,
        torch.conv_transpose2d,
        torch.conv_transpose3d,
        torch.nn.functional.conv1d,
        torch.nn.functional.conv2d,
        torch.nn.functional.conv3d,
    }
)
_RNNS = frozenset({torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu})
_IS_CUDA_DESCRIPTOR = torch.Tensor.is_cuda
_DEVICE_DESCRIPTOR = torch.Tensor.device
#: ``Tensor.data``: an alias with a version counter of its own (see ``run.unversioned_writes``)
_DATA_DESCRIPTOR = torch.Tensor.data
#: Where ``Module._apply`` sets each parameter's ``.data`` (``model.to(device)``, ``.half()``).
_MODULE_APPLY_MODULE = torch.nn.Module.__module__
#: ``x.get_device()`` and ``torch.get_device(x)``: -1 for a CPU tensor, the index on a GPU.
_GET_DEVICE = frozenset(
    {torch.Tensor.get_device, *((torch.get_device,) if hasattr(torch, "get_device") else ())}
)

# Accumulating scatters are non-deterministic on GPUs and accelerators when indices repeat.
_ACCUMULATE_ONLY = frozenset({torch.Tensor.index_put_, torch.index_put, torch.Tensor.put_})
_NONDETERMINISTIC = frozenset(
    {
        torch.Tensor.index_add_,
        torch.index_add,
        torch.Tensor.index_add,
        torch.Tensor.scatter_add_,
        torch.scatter_add,
        torch.Tensor.scatter_add,
        torch.Tensor.scatter_reduce_,
        torch.scatter_reduce,
        torch.Tensor.index_reduce_,
        torch.bincount,
        *_ACCUMULATE_ONLY,
    }
)
_NOTEWORTHY = (
    RANDOM_FACTORIES
    | RANDOM_IN_PLACE
    | DROPOUTS
    | _NONDETERMINISTIC
    | _CONVOLUTIONS
    | _RNNS
    | frozenset({_SDPA})
)


#: Calls the mode handles itself whatever their arguments (everything else only when an argument
#: or the device keyword may name a device).
_SPECIAL = frozenset(
    {
        *SCALAR_CONVERSIONS,
        _TENSOR_FORMAT,
        _TENSOR_CUDA,
        _TENSOR_TYPE,
        _TENSOR_PIN_MEMORY,
        _TENSOR_IS_PINNED,
        _IS_CUDA_DESCRIPTOR.__get__,
        _DEVICE_DESCRIPTOR.__get__,
        _DATA_DESCRIPTOR.__get__,
        _DATA_DESCRIPTOR.__set__,
        *_GET_DEVICE,
        *_NOTEWORTHY,
    }
)


def _cuda_call_as_to(
    target: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of ``x.to(...)`` for a graph's ``x.cuda(...)`` on ``target``."""
    names = ("device", "non_blocking", "memory_format")
    given = {**dict(zip(names, args[1:])), **kwargs}
    return (args[0], _cuda_as(target, given.pop("device", None))), given


def _tensor_cuda_to(
    target: str,
    tensor: torch.Tensor,
    device: Any = None,
    non_blocking: bool = False,
    memory_format: torch.memory_format = torch.preserve_format,
) -> torch.Tensor:
    where = _cuda_as(target, device)
    return tensor.to(where, non_blocking=non_blocking, memory_format=memory_format)


def _cuda_as(target: str, device: Any) -> str:
    """Where ``x.cuda(device)`` puts ``x`` on ``target``: its index kept on an accelerator."""
    if isinstance(device, str):
        device = torch.device(device)
    index = device.index if isinstance(device, torch.device) else device
    return target if index is None or target == "cpu" else f"{target}:{index}"


def _autocast_init(
    target: str,
    original: Callable[..., None],
    facts: RunFacts,
    host: CudaOnHost | None,
    made_here: WeakSet[Any],
) -> Callable[..., None]:
    def __init__(  # noqa: N807 - it replaces autocast.__init__
        self: Any,
        device_type: str,
        dtype: torch.dtype | None = None,
        enabled: bool = True,
        cache_enabled: bool | None = None,
    ) -> None:
        as_cuda = device_type == "cuda"
        request = {"dtype": dtype, "enabled": enabled, "cache_enabled": cache_enabled}
        if as_cuda:
            device_type = target
            if dtype is None:
                dtype = torch.float16  # what the cell gets on CUDA
            if host is not None and enabled:
                host.use_cuda_autocast_lists()
        made_here.add(self)  # on this run's device (see _foreign_autocasts_read_as_cuda)
        original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        if as_cuda:
            # asked for cuda, as the next cell's runs enter it on their own devices (see
            # _autocast_enter); the request the remembering __init__ kept names this run's device
            self._workbench_request = ("cuda", (), request)
        if enabled:
            used = str(self.fast_dtype).removeprefix("torch.")
            if used not in facts.autocast_dtypes:
                facts.autocast_dtypes.append(used)
            if host is not None and not as_cuda and device_type == "cpu":
                # on the host the cell's cuda tensors are CPU ones, which CPU autocast casts
                facts.cpu_autocast = True

    return __init__


def _called_in_run(mode: TorchFunctionMode, original: Callable[..., Any]) -> Callable[..., Any]:
    """``original``, called with the run's function mode on (pushed again where it is off).

    Autograd reaches Python from inside the mode's own handler, where the mode is off:
    ``Tensor.backward`` and ``torch.autograd.grad`` reach the engine's entry point that way (the
    engine hands its thread-local state to the threads that run the backward pass), and a saved
    tensor's pack hook runs inside the op that saves it. Wrapped, what autograd calls back into
    Python (checkpoint recomputes, hooks, ``autograd.Function.backward``,
    ``save_on_cpu(pin_memory=True)``'s pinned copies) runs as the forward did.
    """

    def call(*args: Any, **kwargs: Any) -> Any:
        if mode in torch.overrides._get_current_function_mode_stack():
            return original(*args, **kwargs)
        with mode:
            return original(*args, **kwargs)

    return call


def _saved_tensor_hooks_in_run(
    mode: TorchFunctionMode, original: Callable[..., Any]
) -> Callable[..., Any]:
    """``saved_tensors_hooks.__init__`` whose pack and unpack hooks run with the run's mode on.

    Without it, ``torch.autograd.graph.save_on_cpu(pin_memory=True)``'s ``torch.empty(...,
    pin_memory=True)`` reached the host's allocator, which has no pinned memory ("pin_memory=True
    requires a CUDA or other accelerator backend"), where a GPU pins it.
    """

    def __init__(self: Any, pack_hook: Callable[..., Any], unpack_hook: Callable[..., Any]) -> None:
        original(self, _called_in_run(mode, pack_hook), _called_in_run(mode, unpack_hook))

    return __init__


@contextlib.contextmanager
def _cuda_storages_loaded_to(target: str, restored: set[int] | None = None) -> Iterator[None]:
    """``torch.load`` puts what names cuda on ``target``: ``map_location="cuda"``, GPU checkpoints.

    Torch's own cuda deserializer checks the location through ``torch.device("cuda")``, which the
    run maps to its device, so it refused every such load ("Expected a cuda device, but got:
    neuron"). A deserializer ahead of it restores the storage as one saved on ``target`` (the
    device's own deserializer, or the host's for the cpu backend). Only ``torch.serialization``'s
    registry list is touched, and only for the run. ``restored`` collects the data pointers of the
    storages restored so (see :func:`_loading_onto_host_cuda`).
    """

    def deserialize(storage: Any, location: str) -> Any:
        if not location.startswith("cuda"):
            return None
        result = torch.serialization.default_restore_location(
            storage, remap_device(location, target)
        )
        if restored is not None:
            restored.add(result.data_ptr())
        return result

    entry = (_CUDA_LOAD_PRIORITY, _untagged, deserialize)
    registry = torch.serialization._package_registry
    registry.insert(0, entry)  # ahead of cuda's own (priority 20); sorted, it stays first
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            registry.remove(entry)


def _saving_plain_numbers(save: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.save`` writing the numbers the run made from tensors as plain ones.

    ``{"loss": loss.item()}`` holds a tagged float during a run, which pickles by a constructor
    call that ``torch.load(weights_only=True)``, the default, refuses.
    """

    @functools.wraps(save)
    def save_plain(obj: Any, *args: Any, **kwargs: Any) -> Any:
        return save(without_tags(obj), *args, **kwargs)

    return save_plain


def _inference_optimized_as_on_cuda(jit: Any, host: CudaOnHost) -> Callable[..., Any]:
    """``torch.jit.optimize_for_inference`` on the host standing in for cuda, as on a GPU.

    Its passes turn a model whose weights are on the CPU into oneDNN (MKLDNN) ops, which they
    never do to a model on a GPU: a program only a CPU runs, which cannot even be saved and loaded
    again (the next cell could not send it to the target's worker). A model the cell has on
    "cuda" gets the passes a GPU's gets: freezing (which folds batch norms), the fusion of
    convolutions with an add and a ReLU, the transposes of linear weights.
    """
    optimize = jit.optimize_for_inference

    @functools.wraps(optimize)
    def optimize_for_inference(mod: Any, other_methods: list[str] | None = None) -> Any:
        if not isinstance(mod, jit.ScriptModule) or not any(
            host.on_device(tensor) for tensor in tensors_in(mod)
        ):
            return optimize(mod, other_methods)
        warnings.warn(
            "`torch.jit.optimize_for_inference` is deprecated. Please use `torch.compile` instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        methods = list(other_methods or ())
        if hasattr(mod, "training"):
            mod = jit.freeze(mod.eval(), preserved_attrs=methods)
        for name in ("forward", *methods):
            if mod._c._has_method(name):
                graph = mod._c._get_method(name).graph
                torch._C._jit_pass_fuse_frozen_conv_add_relu(graph)
                torch._C._jit_pass_transpose_frozen_linear(graph)
        return mod

    return optimize_for_inference


def _loading_onto_host_cuda(
    load: Callable[..., Any], host: CudaOnHost, restored: set[int]
) -> Callable[..., Any]:
    """``torch.load`` on the host standing in for cuda: what it loads onto cuda is on "cuda".

    That is all it loads with ``map_location="cuda"`` (or a device built as cuda), and the tensors
    of the storages a GPU saved (their data pointers are in ``restored``, which the run's cuda
    deserializer fills). On a GPU such tensors are on the device already, so
    ``optimizer.load_state_dict(ck["opt"])`` keeps the checkpoint's own state tensors and training
    changes ``ck`` (the target's did); the host, not knowing them as on "cuda", copied them and
    left ``ck`` as loaded: a FAIL on it.
    """

    @functools.wraps(load)
    def load_onto_cuda(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        restored.clear()
        if callable(map_location):
            # map_location=lambda storage, loc: storage.cuda(0): what it moves with .cuda() is
            # on "cuda", as the storages the run's cuda deserializer restores
            with _storage_moves_to_cuda_noted(restored):
                result = load(f, map_location, *args, **kwargs)
        else:
            result = load(f, map_location, *args, **kwargs)
        every = _may_name_cuda(map_location, host)
        if every or restored:
            for tensor in tensors_in(result):
                if every or tensor.untyped_storage().data_ptr() in restored:
                    host.mark(tensor)
        restored.clear()
        return result

    return load_onto_cuda


@contextlib.contextmanager
def _storage_moves_to_cuda_noted(restored: set[int]) -> Iterator[None]:
    """In the body, the data pointers of the storages ``storage.cuda()`` gives go into ``restored``.

    On the host standing in for cuda, ``storage.cuda()`` gives the host storage itself.
    """
    patches = []
    for owner in (torch.storage._StorageBase, torch.storage.TypedStorage):
        move = vars(owner)["cuda"]

        def noted(self: Any, *args: Any, _move: Callable[..., Any] = move, **kwargs: Any) -> Any:
            result = _move(self, *args, **kwargs)
            restored.add(result.data_ptr())
            return result

        patches.append(patched_attributes(owner, {"cuda": functools.wraps(move)(noted)}))
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        yield


#: Below every priority torch registers, so the run's cuda deserializer is asked first.
_CUDA_LOAD_PRIORITY = -1


def _untagged(storage: Any) -> None:
    return None  # saving tags storages as torch does (the device's own tag)


class _AnyGenerator(type(torch._C.Generator)):  # type: ignore[misc]
    """The run's ``torch.Generator`` class: every generator is one of it (``isinstance`` holds)."""

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, torch._C.Generator)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, torch._C.Generator)


class Generator(torch._C.Generator, metaclass=_AnyGenerator):
    """``torch.Generator`` during a run: ``torch.Generator("cuda")`` makes one for the run's device.

    A generator is no torch function, so the run's mode never sees its device. On the host standing
    in for cuda it is a CPU generator (CUDA's own stream is listed among what stays different). On
    a device that cannot make generators of its own (the emulated ones draw from the host's) it is
    a CPU generator too, which device draws accept (diffusers draws on the CPU with one), and the
    report says so. One class for every run (the run it serves is looked up when it is called), so
    a cell that keeps it (``from torch import Generator``) keeps something the next cell can ship to
    its worker; outside a run it makes what ``torch.Generator`` makes there.
    """

    def __new__(cls, device: Any = "cpu") -> Any:
        """A generator for ``device`` as the current run stands in for it (see the class)."""
        if not _GENERATOR_RUNS:
            original = torch.Generator if torch.Generator is not Generator else torch._C.Generator
            return original(device)
        target, facts, host, original = _GENERATOR_RUNS[-1]
        if _may_name_cuda(device, host):
            device = remap_device(device, target)
        elif target == "cpu" or torch.device(device).type != target:
            return original(device)  # a device the run does not stand in for, as named
        if target == "cpu":
            return original("cpu")
        try:  # the run's device ("cuda", or a device object a "cuda" became in the run)
            return original(device)
        except (NotImplementedError, RuntimeError) as exc:
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            note = f"torch.Generator for this device is a host (CPU) generator: {why}"
            if note not in facts.notes:
                facts.notes.append(note)
            return original("cpu")


#: The runs ``Generator`` serves, innermost last: target, facts, host, the class it stands for.
_GENERATOR_RUNS: list[tuple[str, RunFacts, CudaOnHost | None, Callable[..., Any]]] = []


@contextlib.contextmanager
def _generators_for(target: str, facts: RunFacts, host: CudaOnHost | None) -> Iterator[None]:
    """``torch.Generator`` is :class:`Generator` for the run, serving it."""
    original = torch.Generator
    if original is Generator:  # a run inside a run (an oracle's): the class it stands for
        original = _GENERATOR_RUNS[-1][3] if _GENERATOR_RUNS else torch._C.Generator
    _GENERATOR_RUNS.append((target, facts, host, original))
    try:
        with patched_attributes(torch, {"Generator": Generator}):
            yield
    finally:
        _GENERATOR_RUNS.pop()


@contextlib.contextmanager
def _data_parallel_refused(target: str) -> Iterator[None]:
    """``nn.DataParallel`` (and ``nn.parallel.data_parallel``) say at once why not on ``target``.

    Their scatter and gather are CUDA kernels (``torch._C._scatter``), which a torch without CUDA
    lacks; with the run's ``torch.cuda`` answering for the device, the class failed on the way
    there instead (a division by the emulated capacity, 0 unless one is set), the function on a
    missing attribute.
    """
    why = (
        f"nn.DataParallel cannot run on {target}: it scatters inputs and gathers outputs with CUDA "
        "kernels (torch._C._scatter), which this torch lacks; call the module itself on one "
        "device, or use DistributedDataParallel"
    )

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        raise RuntimeError(why)

    def data_parallel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(why)

    with (
        patched_attributes(torch.nn.parallel.DataParallel, {"__init__": __init__}),
        patched_attributes(torch.nn.parallel, {"data_parallel": data_parallel}),
    ):
        yield


def _module_to(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Module.to(rank)``: an index of the current accelerator, which the cell's is cuda.

    ``Module.to`` parses its arguments in C++, where no mode sees them; on the host, which has no
    accelerator, an index raised there.
    """

    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args and type(args[0]) is int:
            args = (_index_as_cuda(args[0]), *args[1:])
        if type(kwargs.get("device")) is int:
            kwargs["device"] = _index_as_cuda(kwargs["device"])
        return original(self, *args, **kwargs)

    return to


def remember_autocast_requests() -> None:
    """Make every ``torch.autocast`` object remember what it was asked for (once per process).

    A decorator such as ``@torch.autocast("cuda", dtype=torch.bfloat16)`` on a method is built when
    its class is defined, in a notebook cell or an imported module, outside any run; without CUDA
    it turns itself off there ("CUDA is not available"), so both runs computed in float32 where a
    GPU computes in bfloat16. Remembering the request lets a run enter it as the cell meant (see
    :func:`_autocast_enter`). Nothing else changes.
    """
    cls = torch.amp.autocast_mode.autocast
    init = vars(cls)["__init__"]
    if getattr(init, "_workbench_remembers", False):
        return

    def __init__(self: Any, device_type: str, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        self._workbench_request = (device_type, args, kwargs)
        if device_type != "cuda" or torch.cuda.is_available():
            init(self, device_type, *args, **kwargs)
            return
        # torch's "CUDA is not available ... Disabling autocast", at the line that built it
        _warned_at_the_builders_line(init, self, device_type, *args, **kwargs)

    __init__._workbench_remembers = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[method-assign]


def _autocast_enter(original: Callable[..., Any]) -> Callable[..., Any]:
    """``autocast.__enter__`` in a run: one built for "cuda" elsewhere is entered as a new one.

    The new one is built with the request it remembers (:func:`remember_autocast_requests`,
    :func:`_autocast_init`), so the run's autocast mapping gives it the run's device and CUDA's op
    lists; ``__exit__`` leaves it again. Built outside a run, it turned itself off for want of
    CUDA; built by an earlier cell's run (nanoGPT's ``ctx = torch.amp.autocast(device_type="cuda",
    ...)`` in one cell, ``with ctx:`` in the next), it is the reference's, on the cpu stand-in: the
    target entered a CPU autocast that casts nothing on its device, and computed in float32 where
    a GPU computes in bfloat16.
    """

    def __enter__(self: Any) -> Any:  # noqa: N807
        request = self.__dict__.get("_workbench_request")
        if request is None or request[0] != "cuda":
            return original(self)
        device_type, args, kwargs = request
        inner = torch.amp.autocast_mode.autocast(device_type, *args, **kwargs)
        self.__dict__.setdefault("_workbench_entered", []).append(inner)
        original(inner)  # (it remembers the same request)
        return self

    return __enter__


def _requested_enabled(request: tuple[str, tuple[Any, ...], dict[str, Any]]) -> bool:
    """The ``enabled`` an autocast request asked for (``autocast(device_type, dtype, enabled)``)."""
    _, args, kwargs = request
    if "enabled" in kwargs:
        return bool(kwargs["enabled"])
    return bool(args[1]) if len(args) > 1 else True


def _foreign_autocasts_read_as_cuda(made_here: WeakSet[Any]) -> dict[str, property]:
    """``autocast.device`` and ``._enabled`` in a run, for one built for cuda elsewhere.

    Dynamo never enters such an object (see :func:`_autocast_enter`): tracing a function that
    enters it (``@torch.autocast("cuda", dtype=torch.bfloat16)`` on a notebook class's ``forward``,
    ``with ctx:`` inside a compiled function) it reads its fields and put them in the graph. Built
    outside runs it is off (no CUDA): a compiled model computed in float32 on both runs where a GPU
    computes in bfloat16. Built by an earlier cell's run it is the reference's, on the cpu: the
    target's graph autocast the CPU, which casts nothing on its device (float32 there). Read as
    asked for (cuda, on as requested), the graph enters autocast("cuda", ...) while it is traced,
    which the run maps to its device, as it maps any autocast a compiled cell makes. The objects
    this run built (``made_here``, its own device's) read as they are.
    """

    def foreign(own: dict[str, Any], self: Any) -> Any:
        request = own.get("_workbench_request")
        if request is None or request[0] != "cuda" or self in made_here:
            return None
        return request

    def field(name: str, asked: Callable[[Any], Any]) -> property:
        def get(self: Any) -> Any:
            own = self.__dict__
            if name not in own:
                raise AttributeError(name)
            request = foreign(own, self)
            return own[name] if request is None else asked(request)

        def set(self: Any, value: Any) -> None:
            self.__dict__[name] = value

        return property(get, set)

    return {
        "device": field("device", lambda request: "cuda"),
        "_enabled": field("_enabled", _requested_enabled),
    }


def _autocast_exit(original: Callable[..., Any]) -> Callable[..., Any]:
    def __exit__(self: Any, *exc: Any) -> Any:  # noqa: N807
        entered = self.__dict__.get("_workbench_entered")
        if entered:
            return entered.pop().__exit__(*exc)
        return original(self, *exc)

    return __exit__


#: The real ``torch.cuda.nvtx`` module (during a run ``torch.cuda.nvtx`` is the stand-in), and its
#: functions as the run's stand-in answers them.
_REAL_NVTX = sys.modules["torch.cuda.nvtx"]
_REAL_CUDA_PROFILER = importlib.import_module("torch.cuda.profiler")
_NVTX_FUNCTIONS = {
    name: getattr(NVTX, name)
    for name in ("range_push", "range_pop", "range_start", "range_end", "mark", "range")
}


def _autocast_queries(target: str, host: CudaOnHost | None) -> dict[str, Callable[..., Any]]:
    """``torch``'s autocast queries for a run: CUDA's state is the run's device's.

    ``torch.is_autocast_enabled()`` (no argument: CUDA's), ``is_autocast_enabled("cuda")``,
    ``get_autocast_dtype("cuda")`` and ``get_autocast_gpu_dtype()`` are C functions no mode sees:
    under ``torch.autocast("cuda")``, which the run enters on its own device, they answered for the
    idle CUDA autocast, so ``torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)``
    cast nothing and a model's ``if torch.is_autocast_enabled():`` upcast never ran, where a GPU
    does both. Outside the cell's autocast they answer as torch does.

    Dynamo is answered as torch answers: before compiling a graph it saves the global autocast
    state through these names, sets it back with ``torch.set_autocast_enabled`` after, then checks
    that nothing changed. Given CUDA's state as the run's device's, it switched the idle CUDA
    autocast on, and every compiled call under the cell's ``autocast("cuda")`` on the cpu stand-in
    raised "Global autocast(cuda)_enabled state changed while dynamo tracing".
    """
    is_enabled, get_dtype = torch.is_autocast_enabled, torch.get_autocast_dtype

    def cuda_autocast_on() -> bool:
        # frame 2: the caller of the query that asks (its own frame is 1)
        if sys._getframe(2).f_globals.get("__name__", "").startswith("torch._dynamo"):
            return is_enabled("cuda")
        if host is not None:  # the host's cpu autocast may be the cell's own ("cpu"): not cuda's
            return host.under_cuda_autocast()
        return is_enabled(target)

    def is_autocast_enabled(device_type: str = "cuda") -> bool:
        return cuda_autocast_on() if device_type == "cuda" else is_enabled(device_type)

    def get_autocast_dtype(device_type: str) -> torch.dtype:
        if device_type == "cuda" and cuda_autocast_on():
            return get_dtype(target)
        return get_dtype(device_type)

    def get_autocast_gpu_dtype() -> torch.dtype:
        return get_autocast_dtype("cuda")

    return {
        "is_autocast_enabled": is_autocast_enabled,
        "get_autocast_dtype": get_autocast_dtype,
        "get_autocast_gpu_dtype": get_autocast_gpu_dtype,
    }


def _autocast_cast(target: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.amp.autocast_mode._cast`` (``custom_fwd``'s input cast): "cuda" is the run's device."""

    def _cast(value: Any, device_type: str, dtype: torch.dtype) -> Any:
        return original(value, target if device_type == "cuda" else device_type, dtype)

    return _cast


def _grad_scaler_init(target: str, original: Callable[..., None]) -> Callable[..., None]:
    def __init__(self: Any, device: str = "cuda", *args: Any, **kwargs: Any) -> None:  # noqa: N807
        original(self, remap_device(device, target), *args, **kwargs)

    return __init__


#: The attribute where a ``GradScaler`` built for cuda outside a run, and turned off there for want
#: of CUDA, keeps the arguments it was built with (:func:`remember_grad_scaler_requests`).
_SCALER_REQUEST = "_workbench_request"


def _warned_at_the_builders_line(init: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    """Call ``init`` (torch's ``__init__`` under a wrapper) and warn its warnings again higher up.

    torch's warnings there name their caller's line (``stacklevel=2``), which is the wrapper's;
    they are warned again at the line that called the wrapper.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        init(*args, **kwargs)
    for warning in caught:
        warnings.warn(warning.message, warning.category, stacklevel=3)


def remember_grad_scaler_requests() -> None:
    """Make a ``GradScaler`` built for cuda without CUDA remember it was meant on (once per process).

    ``scaler = torch.amp.GradScaler("cuda")`` (or ``torch.cuda.amp.GradScaler()``) in a plain setup
    cell of a kernel without a GPU warns and turns itself off, keeping neither its wish to be on nor
    its arguments; both runs of a later ``%%neuron`` cell then trained unscaled, where a GPU scales.
    Such a scaler now keeps its arguments, so a run turns it on as the cell meant (see
    :func:`_scaler_methods_waking`). In plain cells it stays off, with torch's warning at the same
    line; a scaler turned off on purpose (``enabled=False``) remembers nothing.
    """
    cls = torch.amp.grad_scaler.GradScaler
    init = vars(cls)["__init__"]
    if getattr(init, "_workbench_remembers", False):
        return
    signature = inspect.signature(init)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        request = dict(bound.arguments)
        del request["self"]
        if not (
            request.get("device") == "cuda"
            and request.get("enabled")
            and torch.cuda.amp.common.amp_definitely_not_available()
        ):
            init(self, *args, **kwargs)
            return
        # What torch does here (off, and its warning, at the line that built the scaler),
        # keeping the arguments the scaler was asked for.
        _warned_at_the_builders_line(init, self, *args, **kwargs)
        del request["device"], request["enabled"]
        self.__dict__[_SCALER_REQUEST] = request

    __init__._workbench_remembers = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[method-assign]


def _scaler_methods_waking(cls: type) -> dict[str, Callable[..., Any]]:
    """``GradScaler``'s public methods for a run: a scaler that remembers a request turns on first.

    A scaler :func:`remember_grad_scaler_requests` kept off for want of CUDA (its copy in this run)
    is built again, as asked, by the run's ``__init__``, which gives it the run's device: the
    scaler then scales as it would on a GPU, and the notebook keeps the kept run's copy, on.
    """
    return {
        name: _waking(cls, value)
        for name, value in vars(cls).items()
        if not name.startswith("_") and inspect.isfunction(value)
    }


@functools.lru_cache(maxsize=64)  # every run wraps the same methods: made once each
def _waking(cls: type, method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` of ``cls`` (a GradScaler's), building first a scaler that remembers a request."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        request = self.__dict__.pop(_SCALER_REQUEST, None)
        if request is not None and not self._enabled and self._device == "cuda":
            cls.__init__(self, "cuda", **request)  # type: ignore[misc]
        return method(self, *args, **kwargs)

    return wrapper


@contextlib.contextmanager
def cuda_remapped_to(
    backend: Backend,
    *,
    rng_on_cpu: bool = False,
    host: CudaOnHost | None = None,
    may_enable_tf32: bool = False,
    writes: UnversionedWrites | None = None,
) -> Iterator[RunFacts]:
    """Run the body with CUDA device uses redirected to ``backend``; yield what was noticed.

    On the ``cuda`` backend itself devices are left alone (and nothing is intercepted unless
    ``rng_on_cpu`` asks for random numbers to come from the CPU generator). ``host``, on the ``cpu``
    backend, gives the CUDA parts of the cell CUDA's semantics; ``may_enable_tf32`` says the cell
    may turn TF32 on (see :meth:`CudaOnHost.active`). ``writes`` is told of the ``.data``
    aliases the run takes and sets (:class:`~neuron_workbench.run.unversioned_writes.UnversionedWrites`).
    """
    target = backend.device_type
    facts = RunFacts(rng_on_cpu=rng_on_cpu)
    keep_dynamo_out_of_the_workbench()  # an earlier cell compiled: not the remap's own frames
    # code compiled for an earlier run's copies, freed since, no longer counts to a recompile limit
    drop_code_compiled_for_the_dead()
    if target == "cuda":
        with contextlib.ExitStack() as stack:
            forms = stack.enter_context(tracked(torch.cuda))
            facts.measured_texts, facts.measured_values = forms.texts, forms.values
            if rng_on_cpu:
                stack.enter_context(warnings_at_callers_line())
                stack.enter_context(
                    _CudaToDeviceMode(target, facts, remap=False, rng_on_cpu=True, writes=writes)
                )
            yield facts
        return
    if target != "cpu":
        host = None
    autocast_cls = torch.amp.autocast_mode.autocast
    made_here: WeakSet[Any] = WeakSet()  # the autocast objects this run builds
    scaler_cls = torch.amp.grad_scaler.GradScaler
    with contextlib.ExitStack() as stack:
        stack.enter_context(warnings_at_callers_line())  # not the mode's line: the cell's
        if host is not None:
            stack.enter_context(host.active(may_enable_tf32))
        shim = CudaModuleShim(torch.cuda, cuda_module_shims(backend, host))
        # torch.save writes the numbers the run made from tensors as plain ones
        replaced: dict[str, Any] = {"cuda": shim, "save": _saving_plain_numbers(torch.save)}
        replaced["seed"] = shim.seed  # the system's seed, drawn alike in both runs
        restored_on_cuda: set[int] | None = None  # storages torch.load restored from cuda
        if host is not None:
            restored_on_cuda = set()
            replaced["load"] = _loading_onto_host_cuda(torch.load, host, restored_on_cuda)
        if hasattr(torch, "accelerator"):  # PyTorch 2.6 on
            replaced["accelerator"] = AcceleratorShim(torch.accelerator, shim)
        if target == "cpu":
            replaced["get_device_module"] = device_modules_as_cuda(
                torch.get_device_module, shim, lambda device: _may_name_cuda(device, host)
            )
        replaced.update(_autocast_queries(target, host))
        stack.enter_context(patched_attributes(torch, replaced))
        autocast_module = torch.amp.autocast_mode
        stack.enter_context(
            patched_attributes(
                autocast_module, {"_cast": _autocast_cast(target, autocast_module._cast)}
            )
        )
        # timers, statistics, tensor scalars keep provenance
        forms = stack.enter_context(tracked(shim))
        facts.measured_texts, facts.measured_values = forms.texts, forms.values
        # `from torch.cuda import nvtx` (in the cell or at the notebook's top) reaches the real
        # module, not the shim's attribute: its functions answer for NVTX during the run.
        stack.enter_context(patched_attributes(_REAL_NVTX, _NVTX_FUNCTIONS))
        # so does `import torch.cuda.profiler`: its capture range marks nothing in a run
        stack.enter_context(patched_attributes(_REAL_CUDA_PROFILER, CUDA_PROFILER_FUNCTIONS))
        emit_nvtx = torch.autograd.profiler.emit_nvtx
        stack.enter_context(patched_attributes(emit_nvtx, EMIT_NVTX_METHODS))
        stack.enter_context(
            patched_attributes(
                autocast_cls,
                {
                    "__init__": _autocast_init(
                        target, autocast_cls.__init__, facts, host, made_here
                    ),
                    "__enter__": _autocast_enter(autocast_cls.__enter__),
                    "__exit__": _autocast_exit(autocast_cls.__exit__),
                    **_foreign_autocasts_read_as_cuda(made_here),
                },
            )
        )
        stack.enter_context(
            patched_attributes(
                scaler_cls,
                {
                    **_scaler_methods_waking(scaler_cls),
                    "__init__": _grad_scaler_init(target, scaler_cls.__init__),
                },
            )
        )
        if host is not None:
            stack.enter_context(fused_dropout_on_cpu())
            jit = torch.jit
            stack.enter_context(
                patched_attributes(
                    jit, {"optimize_for_inference": _inference_optimized_as_on_cuda(jit, host)}
                )
            )
            stack.enter_context(parallel_comm_on_host(host))
            stack.enter_context(profiler_on_host())
            stack.enter_context(loaders_pinning_on_host())
        elif not hasattr(torch._C, "_scatter"):
            stack.enter_context(_data_parallel_refused(target))
        stack.enter_context(_cuda_storages_loaded_to(target, restored_on_cuda))
        stack.enter_context(patched_attributes(torch.Tensor, {"record_stream": _record_stream}))
        stack.enter_context(_generators_for(target, facts, host))
        module_to = vars(torch.nn.Module)["to"]
        stack.enter_context(patched_attributes(torch.nn.Module, {"to": _module_to(module_to)}))
        mode = _CudaToDeviceMode(target, facts, rng_on_cpu=rng_on_cpu, host=host, writes=writes)
        engine_entry = torch.autograd._engine_run_backward
        stack.enter_context(
            patched_attributes(
                torch.autograd, {"_engine_run_backward": _called_in_run(mode, engine_entry)}
            )
        )
        hooks_cls = torch.autograd.graph.saved_tensors_hooks
        stack.enter_context(
            patched_attributes(
                hooks_cls, {"__init__": _saved_tensor_hooks_in_run(mode, hooks_cls.__init__)}
            )
        )
        stack.enter_context(mode)
        try:
            yield facts
        finally:
            if host is not None:
                facts.tf32_matmuls = host.used_tf32
                facts.notes = host.notes(facts)
