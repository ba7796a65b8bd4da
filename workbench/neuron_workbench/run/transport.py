"""Move a cell's values between the kernel and a target process, keeping the object graph.

Values travel as one pickle (``cloudpickle``: notebook functions and classes by value, importable
modules by reference), so objects that reference each other arrive referencing each other. Tensors
travel by *storage*: each storage once, then every tensor as a view of it (offset, sizes, strides),
so views keep their base, tied weights stay tied and a model and its optimizer still share
parameters. A tensor on an accelerator travels as a host copy of its whole storage, marked with the
device it came from.

Between processes of one host, the storages' bytes go into one shared-memory file (an *arena*,
written once by the sender, mapped copy-on-write by the receiver, no pickle copy of tensor data);
to a remote process (a Ray actor) they travel in the message itself. In a folder of the two
processes' own (a worker's), an arena's file (up to a share of the host's memory) stays once the
receiver's tensors on it are gone, for the next message to be written into memory the host has
already given it.

The receiver can load *leniently*: a class, function or module that does not exist on its side (the
target's device module ``torch.neuron``, a class of a device SDK), or a compiled program it cannot
rebuild (a TorchScript archive it cannot load, a torch.fx graph module), becomes an
:class:`Unloadable` stand-in instead of failing the whole message, so one result that cannot come
back never hides the others.
"""

from __future__ import annotations

import contextlib
import copyreg
import ctypes
import functools
import importlib
import io
import linecache
import mmap
import os
import pickle
import random
import sys
import tempfile
import threading
import types
import uuid
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import torch

from neuron_workbench.quiet import warnings_ignored
from neuron_workbench.run.compiled_frames import compiled_global, keep_dynamo_out_of_the_workbench
from neuron_workbench.run.custom_ops import custom_op_class, reduce_custom_op
from neuron_workbench.run.exported_programs import EXPORTED_PROGRAM, reduce_exported_program
from neuron_workbench.run.grad_scalers import GRAD_SCALER, grad_scaler_state
from neuron_workbench.run.loader_workers import has_started_workers, reduce_loader_past_its_workers
from neuron_workbench.run.measurements import TAGGED, reduce_tagged
from neuron_workbench.run.namespace import (
    COMPILE_REQUEST_ATTR,
    GRAPH_LEFT_BEHIND_ATTR,
    ORIGIN_ATTR,
    UNUSABLE_DEVICE_TYPE,
    add_leaf_hooks,
    compile_in_place_again,
    compile_request_here,
    compile_request_in_place,
    guard_graph_left_behind,
    leaf_hooks,
    optimizer_extras,
    restore_optimizer_extras,
)
from neuron_workbench.run.notebook_handles import FILE_TYPES as _FILE_TYPES
from neuron_workbench.run.notebook_handles import (
    is_notebook_file,
    progress_bar_class,
    reduce_bar_for_sending,
    reduce_for_sending,
)
from neuron_workbench.run.random_state import RANDOM_MODULE_GENERATOR
from neuron_workbench.run.torch_settings import remember_dynamo_resets
from neuron_workbench.run.torchscript import (
    SCRIPT_FUNCTION,
    SCRIPT_MODULES,
    reduce_script_function,
    reduce_script_module,
    script_module_again,
)
from neuron_workbench.worker_launch import SHARED_MEMORY

#: Storages in an arena start at multiples of this many bytes (any dtype's alignment, a cache line).
ARENA_ALIGN = 64
_TENSOR = torch.Tensor
_PARAMETER = torch.nn.Parameter
_PLAIN_TENSOR_TYPES = {_TENSOR, _PARAMETER}
#: A lazy module's parameters and buffers before its first call (``nn.LazyLinear``).
_UNINITIALIZED = torch.nn.parameter.UninitializedTensorMixin
_STRIDED = torch.strided
_CUSTOM_OP_DEF = custom_op_class()
_OP_PACKET = torch._ops.OpOverloadPacket
_OP_OVERLOAD = torch._ops.OpOverload


def _torch_op_at(namespace: str, name: str, overload: str | None) -> Any:
    """``torch.ops.<namespace>.<name>`` (``.<overload>``) of this process, as a cell names it."""
    packet = getattr(getattr(torch.ops, namespace), name)
    return packet if overload is None else getattr(packet, overload)


#: ``torch.empty`` itself: an emulated device wraps the public one in Python (pinned memory).
_EMPTY = torch._C._VariableFunctions.empty
_CLOUDPICKLE_DISPATCH = cloudpickle.cloudpickle.Pickler._dispatch_table


# A function sent by value (each method of a model class defined in the notebook, with every request
# and every answer) carries the submodules it may use; cloudpickle finds them by going through every
# loaded module for each package the function refers to (``torch``, ``nn``, ``F``): about 0.5 ms per
# function once torch and a model library are loaded. The answer depends only on the function's
# names, those packages' names and the loaded modules, so it is kept while the loaded modules stay
# the same (a remembered answer, that comparison included, costs about 10 us). The replacement is
# process-wide and gives cloudpickle's own answers.
_find_imported_submodules = getattr(cloudpickle.cloudpickle, "_find_imported_submodules", None)
_SUBMODULES: dict[tuple[Any, ...], tuple[types.ModuleType, ...]] = {}
_SUBMODULES_LOADED: list[tuple[str, ...]] = [()]  # the loaded modules the answers were found with


def _imported_submodules(code: types.CodeType, dependencies: Any) -> list[types.ModuleType]:
    assert _find_imported_submodules is not None
    loaded = tuple(sys.modules)
    if loaded != _SUBMODULES_LOADED[0]:  # a module loaded or removed since
        _SUBMODULES.clear()
        _SUBMODULES_LOADED[0] = loaded
    dependencies = tuple(dependencies)
    packages = tuple(
        d.__name__
        for d in dependencies
        if isinstance(d, types.ModuleType) and getattr(d, "__package__", None)
    )
    key = (code, packages)
    found = _SUBMODULES.get(key)
    if found is None:
        if len(_SUBMODULES) >= 1024:
            _SUBMODULES.clear()
        found = _SUBMODULES[key] = tuple(_find_imported_submodules(code, dependencies))
    return list(found)


if _find_imported_submodules is not None:  # a cloudpickle without it: pickled as it does
    cloudpickle.cloudpickle._find_imported_submodules = _imported_submodules


@dataclass
class Packed:
    """A pickled message: the pickle stream, its out-of-band buffers, and the tensors' storages.

    Attributes
    ----------
    data : bytes
        The pickle stream.
    buffers : list of PickleBuffer
        Protocol-5 out-of-band buffers (NumPy arrays), in the order the stream uses them.
    storages : list of PickleBuffer
        In-band storage bytes (a message to another host), one per storage; empty with an arena.
    arena : str or None
        Path of the shared-memory file that holds the storages' bytes (same host).
    table : list of (int, int)
        Each storage's ``(offset, nbytes)`` in the arena.
    """

    data: bytes
    buffers: list[pickle.PickleBuffer] = field(default_factory=list)
    storages: list[pickle.PickleBuffer] = field(default_factory=list)
    arena: str | None = None
    table: list[tuple[int, int]] = field(default_factory=list)

    def discard(self) -> None:
        """Remove the arena file (a message that will never be loaded)."""
        if self.arena is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.arena)


#: A loaded arena stays in its folder for the next message to write into (see
#: :func:`_keeps_arenas`), once the receiver's tensors on it are gone, up to
#: :func:`kept_arena_limit`; a larger one is removed as its name is not needed (its memory goes with
#: the last of them). Always up to this many bytes (a small model's state):
ARENA_KEPT_MIN_BYTES = 8 << 20
#: The most a kept arena may take, each of a worker's two: this share of the memory this process may
#: use (the host's, or its container's limit), so that a worker's two hold at most 1/16 of it
#: between cells; and of its folder's file system, capacity and free space, so that the messages
#: themselves and the notebook's own users of ``/dev/shm`` (DataLoader workers) keep room.
_KEPT_SHARE_OF_MEMORY = 32
_KEPT_SHARE_OF_FOLDER = 8
_KEPT_SHARE_OF_FREE = 4
#: Sets the largest kept arena in MiB instead (0: none kept, every message gets fresh memory).
KEPT_ARENA_ENV = "NEURON_WORKBENCH_KEPT_ARENA_MIB"
#: Where a container's memory limit is read (cgroup v2, then v1); "max" or a huge number: none.
_CGROUP_MEMORY_LIMITS = (
    "/sys/fs/cgroup/memory.max",
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
)
#: The names of the loaded arenas kept in a folder: two, taken by whichever side writes next (in
#: steady state, one for the kernel's request and one for the worker's answer).
_KEPT_ARENAS = ("kept-arena-0", "kept-arena-1")
#: Settings of :data:`KEPT_ARENA_ENV` already warned about (once each per process).
_WARNED_SETTINGS: set[str] = set()


@functools.lru_cache(maxsize=1)
def _usable_memory() -> int | None:
    """The memory this process may use: the host's, or less where a container limits it."""
    try:
        usable = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return None
    for path in _CGROUP_MEMORY_LIMITS:
        try:
            with open(path) as handle:
                text = handle.read().strip()
        except OSError:
            continue
        if text.isascii() and text.isdigit():
            usable = min(usable, int(text))
        break
    return usable


def kept_arena_limit(folder: str) -> int:
    """The largest loaded arena kept in ``folder`` for the next message to be written into.

    Writing a model's state into a kept arena reuses its memory pages: a 35M-parameter GPT-2 step
    with AdamW ships about 400 MiB each way, and its cell takes about a quarter less
    (``benchmarks/transfer.py``). The cost is memory held between cells while the worker lives
    (its last two arenas), so each is at most 1/32 of the memory this process may use (the
    host's, or its container's limit), 1/8 of the folder's file system and 1/4 of the space left
    there, and at least :data:`ARENA_KEPT_MIN_BYTES`. ``NEURON_WORKBENCH_KEPT_ARENA_MIB`` sets it
    instead (a whole number of MiB; anything else is warned about and keeps 8 MiB).
    """
    setting = os.environ.get(KEPT_ARENA_ENV, "").strip()
    if setting:
        if setting.isascii() and setting.isdigit():
            return int(setting) << 20
        if setting not in _WARNED_SETTINGS:
            _WARNED_SETTINGS.add(setting)
            warnings.warn(
                f"{KEPT_ARENA_ENV}={setting!r} is not a whole number of MiB: shared-memory "
                f"files up to {ARENA_KEPT_MIN_BYTES >> 20} MiB are kept between cells",
                stacklevel=2,
            )
        return ARENA_KEPT_MIN_BYTES
    limit = _usable_memory()
    if limit is None:
        return ARENA_KEPT_MIN_BYTES
    limit //= _KEPT_SHARE_OF_MEMORY
    try:
        disk = os.statvfs(folder)
    except OSError:
        return ARENA_KEPT_MIN_BYTES
    limit = min(
        limit,
        disk.f_blocks * disk.f_frsize // _KEPT_SHARE_OF_FOLDER,
        disk.f_bavail * disk.f_frsize // _KEPT_SHARE_OF_FREE,
    )
    return max(ARENA_KEPT_MIN_BYTES, limit)


def kept_arenas_size(folder: str) -> int:
    """The shared memory ``folder``'s kept arenas hold (0 when there are none)."""
    total = 0
    for name in _KEPT_ARENAS:
        with contextlib.suppress(OSError):  # not kept now, or taken by a message meanwhile
            total += os.stat(os.path.join(folder, name)).st_size
    return total


def _keeps_arenas(folder: str) -> bool:
    """Whether an arena loaded from ``folder`` stays there, for the next message to write into.

    A folder of the sender's and receiver's own (a worker's, removed with it) does: a file written
    afresh gets its shared memory page by page (about 0.3 ms a MiB, the most of writing a model's
    arena), and freeing it costs half as much again, where a loaded arena's file, once the
    receiver's tensors on it are gone (and with them its mapping), takes the next message's bytes
    into the pages it has. Never in the host's shared-memory folder itself, where a file left
    behind would outlive both processes.
    """
    return os.path.normpath(folder) != SHARED_MEMORY


# ---- sending -------------------------------------------------------------------------------------


class _StorageSink:
    """Collects each storage once; its bytes go into an arena file, or become in-band buffers.

    Pickling only notes the storages; :meth:`finish` then writes them all at once, in one vectored
    write from their memory (a full shared-memory folder fails there, with ``OSError``, and the
    message can still go in-band).
    """

    def __init__(self, folder: str | None, host_devices: Collection[str] = ()) -> None:
        self.folder = folder
        # device types whose storages are host memory (an emulated device): read in place
        self._host_devices = frozenset(host_devices)
        self.table: list[tuple[int, int]] = []
        self.storages: list[pickle.PickleBuffer] = []
        self.path: str | None = None
        # what each storage's bytes are read from: the storage itself on the host (or in host
        # memory, an emulated device's), else a byte view of it on its device (taken while
        # pickling, where a device that cannot give one falls back to a host copy of the tensor);
        # keeps storages alive and their ids unique
        self._sources: list[torch.UntypedStorage | torch.Tensor] = []

    def add(self, storage: torch.UntypedStorage, device_type: str | None = None) -> int:
        """Note ``storage`` (on a device of type ``device_type``, read from it when not given)."""
        if device_type is None:
            device_type = _device_type(storage.device)
        if device_type == "cpu" or device_type in self._host_devices:
            self._sources.append(storage)
        else:
            self._sources.append(_EMPTY(0, dtype=torch.uint8, device=storage.device).set_(storage))
        return len(self._sources) - 1

    def finish(self) -> None:
        """Write the storages (into the arena when there is a folder; ``OSError`` when full)."""
        if self.folder is None:
            self.storages = [pickle.PickleBuffer(_host_bytes(s)) for s in self._sources]
        elif self._sources:
            self._write_arena()
        self._sources = []

    def in_band(self) -> None:
        """Give up on the arena (a full or missing folder): the storages travel in the message."""
        self.abandon_file()
        self.folder = None
        self.table = []

    def _write_arena(self) -> None:
        # One vectored write of every storage's bytes (and the alignment padding), straight from
        # their memory: no per-storage Python file calls, no NumPy views (a mapped file written
        # through is slower still: a page fault per page).
        table: list[tuple[int, int]] = []
        chunks: list[Any] = []
        hosts: list[torch.UntypedStorage] = []  # alive until written: the chunks point into them
        size = 0
        for source in self._sources:
            # a host storage, or an emulated device's (host memory): written from where it is
            host = source if type(source) is torch.UntypedStorage else _host_copy(source)
            nbytes = host.nbytes()
            pad = -size % ARENA_ALIGN
            if pad:
                chunks.append(_ZEROS[:pad])
                size += pad
            table.append((size, nbytes))
            if nbytes:
                chunks.append(_memory_at(host.data_ptr(), nbytes))
                hosts.append(host)
                size += nbytes
        assert self.folder is not None
        self.path = os.path.join(self.folder, f"neuron-workbench-{os.getpid()}-{uuid.uuid4().hex}")
        fd = self._open_file(self.path)
        try:
            _write_all(fd, chunks, size)
            os.ftruncate(fd, size)  # a kept arena written over may have been longer
        finally:
            os.close(fd)
        self.table = table

    def _open_file(self, path: str) -> int:
        """A new arena file at ``path``: the arena a receiver kept in the folder, when there is one."""
        assert self.folder is not None
        if _keeps_arenas(self.folder):
            limit = None
            for name in _KEPT_ARENAS:
                try:
                    # renamed: no other sender writes into it, and it is this message's own
                    os.rename(os.path.join(self.folder, name), path)
                except OSError:
                    continue  # none kept under this name
                if limit is None:
                    limit = kept_arena_limit(self.folder)
                if os.stat(path).st_size > limit:
                    # kept before the limit was lowered: its memory goes now, not at a restart
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                    continue
                return os.open(path, os.O_WRONLY)
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)

    def abandon_file(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            self.path = None

    def abandon(self) -> None:
        self._sources = []
        self.abandon_file()


#: Each device's type and name (``device.type`` and ``str(device)`` make a new string each time;
#: a device's names never change: a backend renames ``privateuseone`` before a tensor is on it).
_DEVICE_NAMES: dict[torch.device, tuple[str, str]] = {}


def _device_names(device: torch.device) -> tuple[str, str]:
    names = _DEVICE_NAMES.get(device)
    if names is None:
        if len(_DEVICE_NAMES) >= 64:
            _DEVICE_NAMES.clear()
        names = _DEVICE_NAMES[device] = (device.type, str(device))
    return names


def _device_type(device: torch.device) -> str:
    """``device.type``, remembered per device."""
    return _device_names(device)[0]


def _device_name(device: torch.device) -> str:
    """``str(device)``, remembered per device."""
    return _device_names(device)[1]


def _host_copy(source: torch.Tensor) -> torch.UntypedStorage:
    """A host copy of a device storage's bytes (``source`` is a byte view of all of it)."""
    return source.cpu().untyped_storage()


_MEMORY_VIEW = ctypes.pythonapi.PyMemoryView_FromMemory
_MEMORY_VIEW.restype = ctypes.py_object
_MEMORY_VIEW.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
_PYBUF_READ = 0x100


def _memory_at(address: int, nbytes: int) -> memoryview:
    """A read-only view of ``nbytes`` of this process's memory (a host storage's bytes)."""
    return _MEMORY_VIEW(address, nbytes, _PYBUF_READ)


#: The most buffers one ``pwritev`` call takes.
_IOV_MAX = max(16, os.sysconf("SC_IOV_MAX")) if hasattr(os, "sysconf") else 16
_ZEROS = bytes(ARENA_ALIGN)


def _write_all(fd: int, chunks: list[Any], total: int) -> None:
    """Write ``chunks`` (``total`` bytes) one after the other from the start of ``fd``.

    ``OSError`` when the folder is full.
    """
    views = chunks
    offset = 0
    while offset < total:
        written = os.pwritev(fd, views[:_IOV_MAX], offset)
        if written <= 0:
            raise OSError(f"no room left to write the arena ({offset} bytes written)")
        offset += written
        if offset < total:  # (the usual: all of it in one call, nothing to go through)
            # skip what was written; a short write leaves the rest of one chunk to write next
            views = [memoryview(view) for view in views]
            first = 0
            while written >= views[first].nbytes:
                written -= views[first].nbytes
                first += 1
            views = views[first:]
            if written:
                views[0] = views[0][written:]


def _host_bytes(source: torch.UntypedStorage | torch.Tensor) -> Any:
    """A storage's bytes on the host (a NumPy view of host memory, or of a host copy)."""
    if type(source) is torch.UntypedStorage:
        if not source.nbytes():
            return b""
        if source.device.type != "cpu":  # an emulated device's storage: host memory, copied
            return bytearray(_memory_at(source.data_ptr(), source.nbytes()))
        return _EMPTY(0, dtype=torch.uint8).set_(source).numpy()
    return source.cpu().numpy() if source.numel() else b""


class _StorageToken:
    """One storage in a message; every tensor on it pickles this same object (the memo shares it)."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> Any:
        return _storage_at, (self.index,)


def _rebuild_device(kind: str, index: int | None) -> torch.device:
    # An accelerator this process lacks (the kernel holds no device): "privateuseone" still says
    # the cell meant an accelerator, so the next cell's runs put the value on their own device.
    try:
        return torch.device(kind, index)
    except RuntimeError:
        return torch.device(UNUSABLE_DEVICE_TYPE, index)


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, plus tensors by storage (with their gradients) that leave any device for the host."""

    def __init__(
        self,
        file: io.BytesIO,
        sink: _StorageSink,
        buffers: list[Any],
        cuda_devices: Collection[int] = (),
        notebook_handles: bool = False,
    ) -> None:
        # One plain dict instead of cloudpickle's ChainMap: the C pickler looks every object's type
        # up in it, and a ChainMap answers each lookup in Python (same entries, same priority).
        self.dispatch_table = {**copyreg.dispatch_table, **_CLOUDPICKLE_DISPATCH}
        super().__init__(file, protocol=5, buffer_callback=buffers.append)
        self._sink = sink
        self._tokens: dict[int, _StorageToken] = {}
        self._origins: dict[str, dict[str, str]] = {}  # a device tensor's state, by device
        self._cuda_devices = cuda_devices
        self._handles = notebook_handles
        self._bar = progress_bar_class() if notebook_handles else None
        # tqdm.auto's bar class where it is loaded (no global cache of classes: one would keep a
        # notebook class's functions, and the run's globals they read, alive in a worker)
        self._async_bar = getattr(sys.modules.get("tqdm.asyncio"), "tqdm_asyncio", None)

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        # The most frequent objects of a model first (a module holds a dozen ordered dicts).
        if kind is OrderedDict:
            # what OrderedDict.__reduce__ gives, without its per-call slot-name lookup (and no
            # items to add for an empty one, most of a module's)
            return OrderedDict, (), vars(obj) or None, None, (iter(obj.items()) if obj else None)
        if kind is _StorageToken:
            return _storage_at, (obj.index,)
        if kind is tempfile.TemporaryDirectory:
            # the notebook's folder by its name: an answer brings back the sender's own object
            # (a copy, committed in its place, had the original's finalizer delete the folder)
            _TEMPORARY_DIRECTORIES[obj.name] = obj
            return _temporary_directory, (obj.name,)
        if kind is _TENSOR or kind is _PARAMETER or isinstance(obj, torch.Tensor):
            reduced = self._reduce_tensor(obj)
            if reduced is not None:
                return reduced
            return super().reducer_override(obj)
        # A plain class or a function: none of the cases below but a compiled function applies.
        if kind is type:
            return super().reducer_override(obj)
        if kind is types.FunctionType:
            # a torch.compile'd function travels as its original
            reduced = _reduce_compiled(obj)
            if reduced is None:
                reduced = _reduce_library_closure(obj)
            if reduced is None:
                reduced = _reduce_hooked_step(obj)
            return reduced if reduced is not None else super().reducer_override(obj)
        if kind is SCRIPT_FUNCTION:  # @torch.jit.script: cannot be pickled, rebuilt there
            return reduce_script_function(obj)
        if kind is _CUSTOM_OP_DEF:  # a notebook's torch.library.custom_op: defined again there
            return reduce_custom_op(obj)
        if kind is _OP_PACKET:  # op = torch.ops.aten.add: by name (its C++ handle cannot travel)
            return _torch_op_at, (*obj._qualified_op_name.split("::", 1), None)
        if kind is _OP_OVERLOAD:  # torch.ops.aten.add.Tensor
            return _torch_op_at, (*obj._schema.name.split("::", 1), obj._overloadname)
        if kind in TAGGED:  # with its provenance (any other pickle gets the plain value)
            return reduce_tagged(obj)
        if kind is torch.UntypedStorage:
            # torch's own reduction of a storage cannot be loaded back (it asks for a dtype)
            return _storage_at, (self._token(obj, _device_type(obj.device)).index,)
        if kind is types.CodeType:
            # cloudpickle blanks file names; error reports and crash dumps need the cell's
            _, args = cloudpickle.cloudpickle._code_reduce(obj)
            args = tuple(obj.co_filename if arg == "<dynamic-code>" else arg for arg in args)
            lines = _cell_lines(obj.co_filename)
            if lines is not None:
                return _rebuilt_cell_code, (lines, *args)
            return _rebuilt_code, args
        if kind is torch.device:
            if obj.type not in ("cpu", "cuda", "meta"):
                return _rebuild_device, (obj.type, obj.index)
            if id(obj) in self._cuda_devices:  # the host's stand-in for the cell's cuda device
                return torch.device, ("cuda",)
        if self._handles:  # a request: the notebook's open files and bars go as stand-ins
            if kind in _FILE_TYPES and is_notebook_file(obj):
                # log = open("train.log", "w") in a plain cell: a stand-in there, the file on return
                return reduce_for_sending(obj)
            if self._bar is not None and isinstance(obj, self._bar):
                return reduce_bar_for_sending(obj)  # bar = tqdm(total=steps) in a plain cell
        if kind is types.MethodType and obj.__self__ is RANDOM_MODULE_GENERATOR:
            # `from random import shuffle`: the receiver's own module function, drawing from the
            # receiver's generator (which a run starts from the notebook's state), not a copy
            return getattr, (random, obj.__name__)
        if kind is _LRU_CACHE_WRAPPER and not _found_by_name(getattr(obj, "__module__", None)):
            # a notebook's @functools.lru_cache / @cache function: pickle finds it by name, which
            # the receiver's __main__ does not have; it travels as its function (the cache empty)
            reduced = _reduce_cached_function(obj)
            if reduced is not None:
                return reduced
        if kind is not type and isinstance(obj, type):
            # a library class its module exposes under another name (torch's SDPBackend)
            renamed = _class_renamed_in_module(obj)
            if renamed is not None:
                return _module_at, renamed
        if isinstance(obj, types.ModuleType):
            if sys.modules.get(obj.__name__) is obj:
                if kind is not types.ModuleType:
                    # torch.backends.cudnn and its kin put an instance of a module subclass in
                    # sys.modules (a seeding helper that sets cudnn.deterministic refers to it): by
                    # name, as cloudpickle sends a plain module
                    return cloudpickle.cloudpickle.subimport, (obj.__name__,)
            else:
                # A C extension's submodule (torch._C._functions, which once_differentiable's
                # wrapper reads) is no entry of sys.modules: cloudpickle would send it by value,
                # which cannot be rebuilt. Where its parent module leads to it, it goes by that path.
                path = _module_path(obj)
                if path is not None:
                    return _module_at, path
        elif kind in SCRIPT_MODULES:  # torch.jit.script(model): cannot be pickled either
            return reduce_script_module(obj)
        elif kind is EXPORTED_PROGRAM:  # torch.export.export(model, args): nor can this
            return reduce_exported_program(obj)
        elif isinstance(obj, torch.nn.Module) and vars(obj).get("_compiled_call_impl"):
            # compiled in place (``model.compile()``): Module.__getstate__ drops the compiled call
            return _reduce_compiled_in_place(obj)
        elif isinstance(obj, torch.optim.Optimizer):
            extras = optimizer_extras(obj)
            if extras:  # hooks and an LR scheduler's watch, which Optimizer.__getstate__ drops
                return _reduced_then(obj, restore_optimizer_extras, extras)
        elif isinstance(obj, GRAD_SCALER):
            # its __getstate__ drops the scale it had: marked, to be made again where it is used
            return copyreg.__newobj__, (kind,), grad_scaler_state(obj)
        elif has_started_workers(obj):
            # its worker processes cannot be pickled (every cell reading the loader after its
            # first epoch could not be sent)
            return reduce_loader_past_its_workers(obj)
        elif (
            self._async_bar is not None
            and (kind is weakref.ProxyType or issubclass(kind, self._async_bar))
            and _bar_over_a_loader(obj, self._async_bar)
        ):
            # the bar, or the weak proxy of it that its output stream's error guard holds
            return _reduce_bar_past_its_loader_iterator(obj)
        elif (
            isinstance(obj, BaseException)
            and kind.__reduce__ in _EXCEPTION_REDUCTIONS
            and kind.__reduce_ex__ is object.__reduce_ex__
        ):
            # Python's pickling rebuilds an exception from its args: one of the notebook's with
            # arguments of its own (StopTraining(step, loss)) could not be rebuilt
            reduced = obj.__reduce__()  # OSError's carries its filename among the args
            return _rebuilt_exception, (kind, reduced[1], reduced[2] if len(reduced) > 2 else None)
        elif "__getstate__" in kind.__dict__:
            # a torch.compile'd module (OptimizedModule has a __getstate__), or a parametrized one
            reduced = _reduce_compiled(obj)
            if reduced is None:
                reduced = _reduce_parametrized(obj, kind)
            if reduced is not None:
                return reduced
        elif "__slots__" in kind.__dict__ and kind.__module__ == "__main__":
            reduced = _reduce_slotted(obj)
            past_getattr = _asks_getattr_for_setstate(kind)  # a notebook's forwarding proxy
            if reduced is not None and past_getattr:
                return (*reduced, *(None,) * (5 - len(reduced)), _state_set_plainly)[:6]
            if reduced is not None:
                return reduced
            if past_getattr:
                return _reduced_past_getattr(obj)
        elif _asks_getattr_for_setstate(kind):
            return _reduced_past_getattr(obj)
        return super().reducer_override(obj)

    def _reduce_tensor(self, obj: torch.Tensor) -> Any:
        device = obj.device
        device_type = _device_type(device)
        kind = type(obj)
        if kind not in _PLAIN_TENSOR_TYPES and isinstance(obj, _UNINITIALIZED):
            return self._reduce_uninitialized(obj, device, device_type)
        if obj.layout != _STRIDED or obj.is_quantized or device_type == "meta":
            return None
        on_device = device_type != "cpu"
        if not (on_device or kind in _PLAIN_TENSOR_TYPES):
            return None  # a tensor subclass pickles itself
        # The tensor's own metadata is read (no detached alias: on a device that is one more op).
        data = obj
        if data.is_conj() or data.is_neg():  # lazy bits a storage view cannot carry
            data = obj.detach().resolve_conj().resolve_neg()
        try:
            token = self._token(data.untyped_storage(), device_type)
        except (RuntimeError, NotImplementedError):  # a device without host-copyable storages
            data = obj.detach().cpu()
            token = self._token(data.untyped_storage(), "cpu")
        attributes = vars(obj)
        if on_device:
            # a device tensor's attributes belong to its backend (the emulator's payload); one
            # state per device for the whole message (the memo sends it once; it is only read)
            name = _device_name(device)
            state: dict[str, Any] | None = self._origins.get(name)
            if state is None:
                state = self._origins[name] = {ORIGIN_ATTR: name}
        elif attributes:
            state = {k: v for k, v in attributes.items() if not k.startswith("_backward")}
        else:
            state = None
        parameter = (
            kind is _PARAMETER
            or (kind is not _TENSOR and isinstance(obj, _PARAMETER))
            or "_is_param" in attributes
        )
        if obj.is_leaf:
            grad, graph, hooks = obj.grad, None, leaf_hooks(obj)
        else:
            grad_fn = obj.grad_fn
            # computed by a graph that stays here: a backward pass reaching it there says so
            grad, graph, hooks = None, None if grad_fn is None else type(grad_fn).__name__, None
        arguments: tuple[Any, ...] = (
            token,
            data.dtype,
            data.storage_offset(),
            tuple(data.shape),
            data.stride(),
            obj.requires_grad,
            grad,
            parameter,
        )
        # an inference tensor (`feats` computed under torch.inference_mode()) arrives as one, so a
        # backward pass through it fails as on a GPU; a parameter arrives as a normal one, as
        # namespace's copies make it
        inference = obj.is_inference() and not parameter
        # most tensors have no state, graph or hooks and are no inference tensors: their stream
        # leaves the defaults out
        if state or graph is not None or hooks is not None or inference:
            arguments += (state, graph, hooks, inference)
        return _rebuild_tensor, arguments

    def _reduce_uninitialized(self, obj: Any, device: torch.device, device_type: str) -> Any:
        # A lazy module's parameter or buffer before its first call has no data: it travels as
        # what makes it again (its own pickling forgets its dtype and device), one from a device
        # as a host one marked with that device, as a device tensor comes back
        state = {k: v for k, v in vars(obj).items() if not k.startswith("_backward")}
        if device_type not in ("cpu", "meta"):
            state[ORIGIN_ATTR] = _device_name(device)
        return _uninitialized_again, (type(obj), obj.requires_grad, obj.dtype, state)

    def _token(self, storage: torch.UntypedStorage, device_type: str) -> _StorageToken:
        key = storage._cdata
        token = self._tokens.get(key)
        if token is None:
            token = self._tokens[key] = _StorageToken(self._sink.add(storage, device_type))
        return token


_LRU_CACHE_WRAPPER = type(functools.lru_cache(None)(lambda: None))
_LOADER_ITER = torch.utils.data.dataloader._BaseDataLoaderIter


def _bar_over_a_loader(obj: Any, bar_class: type) -> bool:
    """Whether ``obj`` (or what it is a weak proxy of) is a ``bar_class`` bar over a loader.

    ``bar_class`` is tqdm's asyncio bar (what ``tqdm.auto`` gives), which holds an iterator of what
    it wraps.
    """
    try:
        kind = obj.__class__  # a weak proxy answers its referent's class
    except ReferenceError:  # a proxy whose referent is gone
        return False
    return (
        isinstance(kind, type)
        and issubclass(kind, bar_class)
        and isinstance(vars(obj).get("iterable_iterator"), _LOADER_ITER)
    )


def _reduce_bar_past_its_loader_iterator(bar: Any) -> Any:
    """A tqdm asyncio bar over a ``DataLoader`` (``pbar = tqdm(loader)``): sent without its iterator.

    The bar takes an iterator of what it wraps when it is built, for ``async for``; a loader's
    iterator cannot be pickled, so the bar could not be sent back (``not compared``). ``for x in
    pbar`` never reads it. The receiver's copy starts a fresh iterator of the loader at its first
    ``async for`` step.
    """
    state = {k: v for k, v in vars(bar).items() if k not in ("iterable_iterator", "iterable_next")}
    # built by its class, not __newobj__: pickle refuses that for a proxy (its type is the proxy's)
    return _new_bar, (bar.__class__,), state, None, None, _bar_state_set


def _new_bar(kind: type) -> Any:
    """An empty bar of ``kind``; tqdm's own ``__new__`` would count it among the open bars."""
    return object.__new__(kind)


def _bar_state_set(bar: Any, state: dict[str, Any]) -> None:
    vars(bar).update(state)
    vars(bar)["iterable_next"] = functools.partial(_next_of_fresh_iterator, bar)


def _next_of_fresh_iterator(bar: Any) -> Any:
    """The next item of a fresh iterator of ``bar``'s iterable, which it then keeps for ``async for``."""
    iterator = bar.iterable_iterator = iter(bar.iterable)
    bar.iterable_next = iterator.__next__
    return iterator.__next__()


def _asks_getattr_for_setstate(kind: type) -> bool:
    """Whether unpickling an instance of ``kind`` asks its own ``__getattr__`` for ``__setstate__``.

    Pickle looks ``__setstate__`` up on the new, empty instance; a class without one whose
    ``__getattr__`` reads an attribute of the instance (a wrapper forwarding to ``self._wrapped``,
    as tqdm's output stream is) recursed until a RecursionError, and the whole answer was lost.
    """
    found = _GETATTR_ASKED.get(kind)
    if found is None:
        own = [vars(cls) for cls in kind.__mro__ if cls is not object]
        found = _GETATTR_ASKED[kind] = (
            # a class (its metaclass's __getattr__: Python 3.11's EnumType has one) travels as a
            # class does, by reference or by value, never rebuilt as an instance
            not issubclass(kind, type)
            and any("__getattr__" in names for names in own)
            and not any("__setstate__" in names for names in own)
            and kind.__reduce_ex__ is object.__reduce_ex__  # type: ignore[comparison-overlap]
            and kind.__reduce__ is object.__reduce__  # type: ignore[comparison-overlap]
        )
    return found


_GETATTR_ASKED: dict[type, bool] = {}


def _reduced_past_getattr(obj: Any) -> Any:
    """Python's own reduction of ``obj``, its state set without asking the instance for a setter."""
    reduced = obj.__reduce_ex__(4)
    if not isinstance(reduced, tuple) or len(reduced) < 3 or reduced[2] is None:
        return reduced
    return (*reduced, *(None,) * (5 - len(reduced)), _state_set_plainly)


def _state_set_plainly(obj: Any, state: Any) -> None:
    """What pickle does with an instance's state when the class has no ``__setstate__``."""
    slots = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slots = state
    if state:
        object.__getattribute__(obj, "__dict__").update(state)
    for name, value in (slots or {}).items():
        object.__setattr__(obj, name, value)


def _module_path(module: types.ModuleType) -> tuple[str, tuple[str, ...]] | None:
    """An imported module and the attributes that lead from it to ``module`` (None: none do)."""
    name = getattr(module, "__name__", None)
    if type(name) is not str:
        return None
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        found: Any = sys.modules.get(".".join(parts[:cut]))
        if found is None:
            continue
        for part in parts[cut:]:
            found = getattr(found, part, None)
        if found is module:
            return ".".join(parts[:cut]), tuple(parts[cut:])
    return None


def _class_renamed_in_module(kind: type) -> tuple[str, tuple[str]] | None:
    """A library class's module and the other name it has there (None: pickle finds it).

    ``torch.nn.attention.SDPBackend`` is a C++ enum named ``_SDPBackend`` in a module that has no
    such name: pickle, which finds a class by its module and name, could not send it or its members
    (``with sdpa_kernel(SDPBackend.FLASH_ATTENTION):`` in a %%neuron cell was a usage error).
    """
    module_name = getattr(kind, "__module__", None)
    module = sys.modules.get(module_name) if _found_by_name(module_name) else None
    if module is None:
        return None
    found: Any = module
    for part in getattr(kind, "__qualname__", "").split("."):
        found = getattr(found, part, None)
    if found is kind:
        return None
    for name, value in list(vars(module).items()):
        if value is kind:
            return module.__name__, (name,)
    return None


def _module_at(parent: str, attributes: tuple[str, ...]) -> Any:
    """The module (or class) that ``attributes`` lead to from the imported module ``parent``."""
    found: Any = importlib.import_module(parent)
    for attribute in attributes:
        found = getattr(found, attribute)
    return found


#: Every code object this process rebuilt, by itself and its file: the same code sent again is the
#: same object here.
_CODES: dict[tuple[types.CodeType, str], types.CodeType] = {}


#: The TemporaryDirectory objects this process sent, by folder.
_TEMPORARY_DIRECTORIES: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def _temporary_directory(name: str) -> Any:
    """The TemporaryDirectory of folder ``name`` this process sent, else a stand-in.

    The stand-in never removes the folder by itself (its ``cleanup()`` does, as the notebook's
    would): a run's copy is no owner of the notebook's folder.
    """
    sent = _TEMPORARY_DIRECTORIES.get(name)
    if sent is not None:
        return sent
    stand_in = object.__new__(tempfile.TemporaryDirectory)
    stand_in.__dict__.update(
        name=name,
        _ignore_cleanup_errors=False,
        _delete=True,
        _finalizer=weakref.finalize(stand_in, _nothing),
    )
    stand_in._finalizer.detach()
    _TEMPORARY_DIRECTORIES[name] = stand_in
    return stand_in


def _nothing() -> None:
    pass


def _rebuilt_code(*args: Any) -> types.CodeType:
    """A code object sent by value: the one this process rebuilt before when it is the same.

    A notebook's functions and its classes' methods arrive anew with every request. torch.compile
    keeps what it compiled on the code object (and in the globals its functions read, see
    :func:`notebook_globals_cleared`), so a model compiled in place compiled again in every cell's
    target run, where a notebook, and the kernel's copy, compile it once.
    """
    code = types.CodeType(*args)
    return _CODES.setdefault((code, code.co_filename), code)


def _cell_lines(filename: str) -> list[str] | None:
    """The source lines of a notebook cell's code, which only this process's linecache holds.

    IPython keeps each cell's source in ``linecache`` with no file behind it (no modification
    time); the lines of a module on disk are not sent, the receiver reads its own file.
    """
    entry = linecache.cache.get(filename)
    if entry is None or len(entry) != 4 or entry[1] is not None:
        return None
    return entry[2]


def _rebuilt_cell_code(lines: list[str], *args: Any) -> types.CodeType:
    """A notebook cell's code sent by value, with the cell's source put into this linecache.

    ``inspect.getsource`` reads it there: ``torch.jit.script(model)`` of a model class an earlier
    cell defined raised "could not get source code" in the target's worker alone.
    """
    code = _rebuilt_code(*args)
    entry = linecache.cache.get(code.co_filename)
    if entry is None or len(entry) != 4 or entry[2] != lines:
        linecache.cache[code.co_filename] = (sum(map(len, lines)), None, lines, code.co_filename)
    return code


#: The globals of the notebook's functions in this process, kept from one request to the next.
_NOTEBOOK_GLOBALS: dict[str, Any] = {"__name__": "__main__"}


def notebook_globals_cleared() -> None:
    """Empty the notebook's globals here for the next request, but what torch.compile put there.

    Every request rebuilds the notebook's functions over one dict, this one, as the notebook's own
    functions share its namespace: code torch.compile rewrote reads its compiled graph from the
    globals it was compiled under, which a dict of each request's own lost (``NameError:
    __compiled_fn_...``).

    While another thread runs code over them (one a cell started, still at work after the answer)
    they stay as they are, as a notebook's globals do, and go when a later request finds it ended.
    Emptying them under it made it fail (``NameError`` on a name the cell bound), and a fresh dict
    instead would split them from the functions Dynamo made over this one (``__resume_at_...``).
    """
    if _run_by_other_threads(_NOTEBOOK_GLOBALS):
        return
    # Name by name, Dynamo's names never out: a value dropped here can free compiled code, whose
    # cleanup deletes the names Dynamo put here for it. Emptying the dict and putting them back
    # had them missing then ("Exception ignored ... KeyError: '__builtins_dict___30'" on stderr).
    for name in [k for k in _NOTEBOOK_GLOBALS if not compiled_global(k)]:
        _NOTEBOOK_GLOBALS.pop(name, None)
    _NOTEBOOK_GLOBALS["__name__"] = "__main__"


def _run_by_other_threads(namespace: dict[str, Any]) -> bool:
    """Whether a thread other than this one is running code whose globals are ``namespace``."""
    me = threading.get_ident()
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        while frame is not None:
            if frame.f_globals is namespace:
                return True
            frame = frame.f_back
    return False


def _make_notebook_function(
    code: types.CodeType, namespace: dict[str, Any], *args: Any
) -> types.FunctionType:
    if namespace.get("__name__") == "__main__" and namespace is not _NOTEBOOK_GLOBALS:
        _NOTEBOOK_GLOBALS.update(namespace)
        namespace = _NOTEBOOK_GLOBALS
    return _MAKE_FUNCTION(code, namespace, *args)


_MAKE_FUNCTION = cloudpickle.cloudpickle._make_function


def _found_by_name(module: object) -> bool:
    """Whether a function of ``module`` pickles by name: the module is importable there too."""
    return isinstance(module, str) and module != "__main__" and module in sys.modules


def _reduce_hooked_step(func: types.FunctionType) -> Any:
    """An optimizer class's ``step`` as torch hooks it, as ``(its class,)``; None for the rest.

    The first optimizer of a class wraps the class's ``step`` in its step hooks (pre and post
    hooks, an LR scheduler's count), keeping its name. By that name pickle sends it, and a process
    that has made no optimizer of the class yet finds the bare ``step`` there: a bound
    ``opt.step`` (``torch.compile(opt.step)``) saved in an earlier cell ran without the hooks in
    the first cell of a target (a step post hook not called).
    """
    if not getattr(func, "hooked", False) or not _found_by_name(func.__module__):
        return None
    owner_name, _, name = func.__qualname__.partition(".")
    owner = getattr(sys.modules[func.__module__], owner_name, None)
    if (
        name != "step"
        or not isinstance(owner, type)
        or not issubclass(owner, torch.optim.Optimizer)
        or vars(owner).get("step") is not func
    ):
        return None
    return _hooked_step, (owner,)


def _hooked_step(owner: type) -> Any:
    """``owner.step`` with torch's step hooks, as an optimizer of ``owner`` made here leaves it."""
    if not getattr(owner.step, "hooked", None):  # what Optimizer._patch_step_function does
        owner.step = torch.optim.Optimizer.profile_hook_step(owner.step)  # type: ignore[method-assign]
        owner.step.hooked = True  # type: ignore[attr-defined]
    return owner.step


def _reduce_cached_function(obj: Any) -> Any:
    """A cached function defined in the notebook as ``(lru_cache(maxsize, typed), function)``."""
    wrapped = getattr(obj, "__wrapped__", None)
    parameters = getattr(obj, "cache_parameters", None)
    if wrapped is None or parameters is None:
        return None
    settings = parameters()
    return _cached_function, (wrapped, settings["maxsize"], settings["typed"])


def _cached_function(function: Any, maxsize: int | None, typed: bool) -> Any:
    return functools.lru_cache(maxsize=maxsize, typed=typed)(function)


def remember_compile_requests() -> None:
    """Make what ``torch.compile`` returns remember the arguments it was given (once per process).

    A function compiled in a notebook cell (``@torch.compile``, ``f = torch.compile(g)``) is a
    closure over Dynamo's thread-local state, which cannot be pickled, and a compiled module pickles
    with the compiler settings of the process that compiled it. With the request remembered, either
    travels to a target process as its original and those arguments and is compiled again there by
    that process's own ``torch.compile`` (an emulated device's picks its backend, as the vendor's
    does on its machine). Nothing else changes.
    """
    current = torch.compile
    if getattr(current, "_workbench_remembers", False):
        return

    def compile(model: Any = None, **kwargs: Any) -> Any:  # noqa: A001 - it is torch.compile
        if model is None:  # @torch.compile(mode=...): the decorator, remembering too
            return functools.partial(compile, **kwargs)
        request = dict(kwargs)  # before a compile of an emulated process changes its own copy
        compiled = current(model, **kwargs)
        keep_dynamo_out_of_the_workbench()  # before anything compiled runs; Dynamo is loaded now
        remember_dynamo_resets()  # and a reset from now on travels to a target process
        if compiled is not model:  # disable=True gives the model itself
            _remember(compiled, request)
        return compiled

    functools.update_wrapper(compile, current)
    compile._workbench_remembers = True  # type: ignore[attr-defined]
    torch.compile = compile  # type: ignore[assignment]


def _reduce_compiled(obj: Any) -> Any:
    """A compiled function or module as ``(its original, the compile request)``, when remembered.

    Raises
    ------
    pickle.PicklingError
        For a module ``torch.compile`` wrapped before the request could be remembered (before
        ``%load_ext``).
    """
    attributes = getattr(obj, "__dict__", None)
    request = attributes.get(COMPILE_REQUEST_ATTR) if isinstance(attributes, dict) else None
    # (no compiled module without torch._dynamo imported: a plain cell does not import it here)
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if request is None and eval_frame is not None and isinstance(obj, eval_frame.OptimizedModule):
        # pickle would send it with this process's compiler callback (Inductor's for the host's
        # cuda stand-in), which then failed in the target's compile with an error of its own
        # ("'DeviceProperties' object has no attribute 'gcnArchName'")
        raise pickle.PicklingError(COMPILED_BEFORE_LOAD)
    if request is None:
        return None
    if isinstance(obj, torch.nn.Module):
        original = getattr(obj, "_orig_mod", None)
    else:
        original = attributes.get("_torchdynamo_orig_callable")
    if original is None:
        return None
    return _compiled_again, (original, request)


def _reduce_library_closure(func: types.FunctionType) -> Any:
    """A function an imported module made at run time, rebuilt over that module's own globals.

    A hook a library installs on a model (transformers' output-capturing hooks, made when a cell
    asks for ``output_hidden_states``) is a closure no name reaches, which cloudpickle sends by
    value with copies of the module globals it reads: those could not be pickled (a ContextVar),
    so the model could not be sent again, and a copy would not be the state the library's own
    code sets. Its code and closure travel; its globals are the live module's where it arrives.
    None for anything else (a notebook's functions travel as cloudpickle sends them).
    """
    module_name = func.__module__
    if (
        "<locals>" not in func.__qualname__
        or not isinstance(module_name, str)
        or module_name == "__main__"
    ):
        return None
    module = sys.modules.get(module_name)
    if (
        module is None
        or getattr(module, "__dict__", None) is not func.__globals__
        or not isinstance(getattr(module, "__file__", None), str)  # importable where it arrives
    ):
        return None
    cells = func.__closure__ or ()
    state = {
        "qualname": func.__qualname__,
        "defaults": func.__defaults__,
        "kwdefaults": func.__kwdefaults__,
        "dict": dict(vars(func)),
        "cells": tuple(_cell_contents(cell) for cell in cells),
    }
    # the function first, its state after: a closure may hold the function itself (recursion)
    args = (module_name, func.__code__, func.__name__, len(cells))
    return _library_closure, args, state, None, None, _set_library_closure_state


class _EmptyCell:
    """Stands for a closure cell not filled yet (a class: it travels by reference)."""


def _cell_contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return _EmptyCell


def _library_closure(
    module_name: str, code: types.CodeType, name: str, cells: int
) -> types.FunctionType:
    """The function of :func:`_reduce_library_closure`, its closure cells still empty."""
    module = importlib.import_module(module_name)
    closure = tuple(types.CellType() for _ in range(cells)) or None
    return types.FunctionType(code, vars(module), name, None, closure)


def _set_library_closure_state(func: types.FunctionType, state: dict[str, Any]) -> None:
    func.__qualname__ = state["qualname"]
    func.__defaults__ = state["defaults"]
    func.__kwdefaults__ = state["kwdefaults"]
    vars(func).update(state["dict"])
    for cell, value in zip(func.__closure__ or (), state["cells"]):
        if value is not _EmptyCell:
            cell.cell_contents = value


def _reduce_compiled_in_place(module: torch.nn.Module) -> Any:
    """A module compiled with ``module.compile()``: as pickle gives it, compiled again on arrival.

    Raises
    ------
    pickle.PicklingError
        When it was compiled before the request could be remembered (before ``%load_ext``).
    """
    request = compile_request_in_place(module)
    if request is None:
        raise pickle.PicklingError(COMPILED_BEFORE_LOAD)
    return _reduced_then(module, _compile_in_place, request)


def _reduced_then(obj: Any, then: Callable[[Any, Any], None], extra: Any) -> Any:
    """``obj`` as pickle reduces it; on arrival its state is set, then ``then(obj, extra)`` runs.

    For what ``__getstate__`` drops (a module's compiled call, an optimizer's hooks).
    """
    func, args, state, items, entries = (*obj.__reduce_ex__(5), None, None, None)[:5]
    return func, args, (state, then, extra), items, entries, _state_then


def _state_then(obj: Any, packed: tuple[Any, Callable[[Any, Any], None], Any]) -> None:
    state, then, extra = packed
    if state is not None:
        obj.__setstate__(state)
    then(obj, extra)


def _compile_in_place(module: torch.nn.Module, request: dict[str, Any]) -> None:
    with _warned_before():
        compile_in_place_again(module, request)


@contextlib.contextmanager
def _warned_before() -> Iterator[None]:
    """Quiet for a compile request made again where it arrives (a later cell's, in a worker).

    What ``torch.compile`` warns of a request (``mode="reduce-overhead"`` is not supported on
    neuron) was shown with the run that made it; made again while a later cell's request loads,
    it went to the worker's stderr, outside any run, and showed under that unrelated cell.
    """
    with warnings_ignored():  # (catch_warnings would show already-shown warnings again)
        yield


def _reduce_slotted(obj: Any) -> Any:
    """An instance of a notebook class with ``__slots__``, its slots' values as slots only.

    cloudpickle rebuilds such a class by value without real slots: its instances in a target
    process have a ``__dict__`` too, and pickle gives the slots' values in both parts of the state;
    loaded here, where the class has real slots, that state failed ("'P' object has no attribute
    '__dict__'").
    """
    reduced = obj.__reduce_ex__(5)
    if not isinstance(reduced, tuple) or len(reduced) < 3:
        return None
    state = reduced[2]
    if not (isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict)):
        return None
    slots = set(_slot_names(type(obj)))
    rest = {k: v for k, v in state[0].items() if k not in slots} or None
    return (*reduced[:2], (rest, state[1]), *reduced[3:])


def _slot_names(kind: type) -> Iterator[str]:
    for klass in kind.__mro__:
        names = vars(klass).get("__slots__", ())
        yield from (names,) if isinstance(names, str) else names


#: Why a module or function compiled in an earlier cell cannot go to another process.
COMPILED_BEFORE_LOAD = "compiled with torch.compile before %load_ext neuron_workbench"


def _compiled_again(original: Any, request: dict[str, Any]) -> Any:
    """``torch.compile(original, **request)`` in this process, remembering the request again."""
    with _warned_before():
        compiled = torch.compile(original, **compile_request_here(request))
    _remember(compiled, request)
    return compiled


#: The backend each torch.compile setting got in this process (see share_compile_backends).
_BACKENDS: dict[str, Any] = {}


def share_compile_backends() -> None:
    """``torch.compile`` gives the same settings the same backend object in this process (once).

    For a target's process. A notebook compiles once and calls the compiled code in later cells;
    a target's process compiles the request again with each cell, and torch.compile wraps its
    backend anew each time, which Dynamo's cache entries guard on (BACKEND_MATCH): every cell
    compiled again. The emulated device's backend and a backend named by a string are shared by
    their settings; a backend of the user's own is left as torch.compile gives it.
    """
    wrapper_class = torch._TorchCompileWrapper  # type: ignore[attr-defined]
    if "_workbench_shared" in vars(wrapper_class):
        return

    def __new__(cls: type, backend: Any, mode: Any, options: Any, dynamic: Any) -> Any:  # noqa: N807
        if isinstance(backend, str):
            named = backend
        elif type(backend).__module__.startswith("neuron_workbench."):
            # the emulated device's backend, made anew by each call: the same by its settings
            named = repr((type(backend).__qualname__, sorted(vars(backend).items())))
        else:
            return object.__new__(cls)
        key = repr((named, mode, sorted((options or {}).items()), dynamic))
        wrapper = _BACKENDS.get(key)
        if wrapper is None:
            wrapper = _BACKENDS[key] = object.__new__(cls)
        return wrapper  # __init__ sets it up again, with the same settings

    wrapper_class.__new__ = __new__
    wrapper_class._workbench_shared = True


def _remember(compiled: Any, request: dict[str, Any]) -> None:
    # On the object itself: a compiled module's own setattr would give it to the original module.
    with contextlib.suppress(AttributeError, TypeError):
        object.__setattr__(compiled, COMPILE_REQUEST_ATTR, request)


def _reduce_parametrized(obj: Any, kind: type) -> Any:
    """A parametrized module (``weight_norm``, ``spectral_norm``) as its class and its state.

    ``torch.nn.utils.parametrize`` gives each such module a class of its own, made from the
    module's class, with a property per parametrized tensor and a ``__getstate__`` that refuses
    pickling ("only supported through state_dict()"). Deep copies work, so the reference runs
    them; here the module travels as its original class, the parametrized names and its state,
    and is parametrized again on arrival.
    """
    getstate = kind.__dict__["__getstate__"]
    if getattr(getstate, "__qualname__", "").partition(".")[0] != "_inject_new_class":
        return None
    parametrizations = vars(obj).get("_modules", {}).get("parametrizations")
    if parametrizations is None:
        return None
    base = kind.__bases__[0]
    # the state as the module's own class gives it (a class of the user's may drop a lock)
    state = super(kind, obj).__getstate__()
    return _parametrized, (base, tuple(parametrizations.keys())), state


def _parametrized(base: type, names: tuple[str, ...]) -> Any:
    """An empty instance of ``base`` parametrized on ``names`` (its state is set after)."""
    from torch.nn.utils import parametrize

    module = base.__new__(base)
    parametrize._inject_new_class(module)
    for name in names:
        parametrize._inject_property(module, name)
    return module


def dumps(
    obj: Any,
    arena: str | None = None,
    host_devices: Collection[str] = (),
    cuda_devices: Collection[int] = (),
    notebook_handles: bool = False,
) -> Packed:
    """Serialise ``obj`` for another process.

    Parameters
    ----------
    obj : object
        What to send.
    arena : str, optional
        A folder on shared memory (:func:`arena_folder`): the storages' bytes go into one file
        there, for a receiver on this host. Without it they travel in the message.
    host_devices : collection of str
        Device types whose storages are host memory (an emulated device): their bytes are read
        straight from the device's memory (written into the arena, or copied into the message),
        with no device-to-host copy through the device.
    cuda_devices : collection of int
        The ids of CPU device objects that stand for the cell's cuda device (the host's stand-in,
        wherever the notebook holds it): they travel as ``torch.device("cuda")``.
    notebook_handles : bool
        A request from the kernel: the notebook's open files and progress bars travel as
        stand-ins (:mod:`~neuron_workbench.run.notebook_handles`), which come back as themselves.
    """
    stream = io.BytesIO()
    buffers: list[pickle.PickleBuffer] = []
    sink = _StorageSink(arena, host_devices)
    try:
        _Pickler(stream, sink, buffers, cuda_devices, notebook_handles).dump(obj)
        try:
            sink.finish()
        except OSError:
            if arena is None:
                raise
            # The shared-memory folder is full (a container's 64 MiB /dev/shm) or gone: the
            # storages travel in the message instead.
            sink.in_band()
            sink.finish()
    except BaseException:
        sink.abandon()
        raise
    return Packed(stream.getvalue(), buffers, sink.storages, sink.path, sink.table)


def sending_error(value: Any) -> Exception | None:
    """Why ``value`` cannot be sent to another process (None: it can)."""
    try:
        dumps(value).discard()
    except Exception as exc:
        return exc
    return None


# ---- receiving -----------------------------------------------------------------------------------

_LOADING = threading.local()


#: The reductions of exceptions that rebuild them from their args alone.
_EXCEPTION_REDUCTIONS = (BaseException.__reduce__, OSError.__reduce__)


def _rebuilt_exception(
    kind: type[BaseException], args: tuple[Any, ...], state: dict[str, Any] | None
) -> BaseException:
    """An exception as Python's pickling rebuilds it, or without ``__init__`` where that fails.

    ``kind(*args)`` fills what built-in exceptions keep outside their args (``StopIteration.value``,
    ``SystemExit.code``); a notebook's exception with arguments of its own is made by its built-in
    base's ``__init__`` (its args, an ``OSError``'s errno and filename) and gets its attributes.
    """
    try:
        exception = kind(*args)
    except Exception:
        exception = kind.__new__(kind, *args)
        base = next(k for k in kind.__mro__ if k.__module__ == "builtins")
        base.__init__(exception, *args)
    if state:
        exception.__setstate__(state)
    return exception


def _storage_at(index: int) -> torch.UntypedStorage:
    return _LOADING.storages[index]


def _rebuild_tensor(
    storage: torch.UntypedStorage,
    dtype: torch.dtype,
    offset: int,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    requires_grad: bool,
    grad: torch.Tensor | None,
    parameter: bool,
    state: dict[str, Any] | None = None,
    graph: str | None = None,
    hooks: tuple[Any, Any] | None = None,
    inference: bool = False,
) -> torch.Tensor:
    tensor: torch.Tensor
    if inference:  # an inference tensor is made in inference mode, the only place where it can be
        with torch.inference_mode():
            tensor = _tensor_over(storage, dtype, offset, shape, stride, requires_grad, parameter)
    else:  # (nearly every one: no context to enter)
        tensor = _tensor_over(storage, dtype, offset, shape, stride, requires_grad, parameter)
    if grad is not None:
        tensor.grad = grad
    if state:
        tensor.__dict__.update(state)
        graph = graph or state.get(GRAPH_LEFT_BEHIND_ATTR)
    if graph is not None and requires_grad:
        guard_graph_left_behind(tensor, graph)
    if hooks is not None:
        add_leaf_hooks(tensor, hooks)
    return tensor


def _uninitialized_again(
    kind: type, requires_grad: bool, dtype: torch.dtype, state: dict[str, Any]
) -> torch.Tensor:
    """A lazy module's parameter or buffer before its first call, on the host, as sent."""
    tensor = kind(requires_grad=requires_grad, dtype=dtype)
    tensor.__dict__.update(state)
    return tensor


def _tensor_over(
    storage: torch.UntypedStorage,
    dtype: torch.dtype,
    offset: int,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    requires_grad: bool,
    parameter: bool,
) -> torch.Tensor:
    data = _EMPTY(0, dtype=dtype).set_(storage, offset, shape, stride)
    if parameter:
        return _PARAMETER(data, requires_grad=requires_grad)
    # a new tensor does not require grad: only the ones that do are told
    return data.requires_grad_() if requires_grad else data


def _open_storages(packed: Packed) -> list[torch.UntypedStorage]:
    if packed.arena is None:
        return [_writable_storage(buffer) for buffer in packed.storages]
    with open(packed.arena, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        # copy-on-write: the receiver's writes never reach the file (or the sender)
        mapped = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY) if size else None
    folder = os.path.dirname(packed.arena)
    with contextlib.suppress(OSError):
        if mapped is not None and _keeps_arenas(folder) and size <= kept_arena_limit(folder):
            # renamed (the message cannot be loaded twice), then kept once the mapping is gone
            in_use = f"{packed.arena}-loaded"
            os.rename(packed.arena, in_use)
            finalizer = weakref.finalize(mapped, _keep_arena, in_use, _FORKS[0])
            finalizer.atexit = False  # an ending process leaves its folder to be removed
        else:
            os.unlink(packed.arena)  # the mapping lives on; the name is not needed any more
    storages = []
    for offset, nbytes in packed.table:
        if nbytes:
            view = torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes, offset=offset)
            storages.append(view.untyped_storage())
        else:
            storages.append(torch.UntypedStorage(0))
    return storages


def _keep_arena(path: str, forks: int) -> None:
    """Keep a loaded arena whose mapping is gone for a next message (see :func:`_keeps_arenas`).

    Under a kept name not taken (a link fails where one is: no sender's claim can race it), else
    removed; removed too after a fork since it was loaded (``forks``): the other process (a
    DataLoader's worker, or its parent) may still map it, and must not see a next message's bytes.
    """
    folder = os.path.dirname(path)
    if forks == _FORKS[0]:
        for name in _KEPT_ARENAS:
            try:
                os.link(path, os.path.join(folder, name))
            except FileExistsError:
                continue
            except OSError:  # no hard links here (or the folder is gone): not kept
                break
            break
    with contextlib.suppress(OSError):  # (the folder removed with its worker)
        os.unlink(path)


#: Forks of this process, and of its parents since (an arena loaded before a fork is never kept).
_FORKS = [0]


def _forked() -> None:
    _FORKS[0] += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_parent=_forked, after_in_child=_forked)


def _writable_storage(buffer: Any) -> torch.UntypedStorage:
    raw = buffer.raw() if isinstance(buffer, pickle.PickleBuffer) else memoryview(buffer)
    if not raw.nbytes:
        return torch.UntypedStorage(0)
    if raw.readonly or not isinstance(raw.obj, bytearray):
        # not memory of this message's own (a sender's storage, in one process): copy it
        raw = memoryview(bytearray(raw))
    return torch.frombuffer(raw, dtype=torch.uint8).untyped_storage()


class Unloadable:
    """Stands for a value the receiving process could not rebuild.

    Its class, function or module does not exist here (the target's device module, a class of a
    device SDK). ``reason`` says which; the value is reported as not compared.
    """

    reason = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> Unloadable:
        """Build from whatever the stream passes (a missing class's constructor arguments)."""
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Unloadable:
        """Stand in for a missing function's result too."""
        return self

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        """Accept list items the stream adds (ignored)."""

    def extend(self, items: Any) -> None:
        """Accept list items the stream adds (ignored)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __repr__(self) -> str:
        return f"<not loadable here: {self.reason}>"


def _stand_in(what: str, exc: BaseException) -> type[Unloadable]:
    text = str(exc).strip().splitlines()
    reason = f"{what} ({type(exc).__name__}: {text[0]})" if text else what
    return type("Unloadable", (Unloadable,), {"reason": reason})


class _Unpickler(pickle.Unpickler):
    def __init__(self, stream: io.BytesIO, buffers: list[Any], lenient: bool) -> None:
        super().__init__(stream, buffers=buffers)
        self.lenient = lenient
        self.stood_in = False
        # classes sent by value that this process already had (found by cloudpickle's tracker id)
        self._known_classes: set[int] = set()
        # the notebook's classes and functions a request rebuilt (see Loaded.notebook_definitions)
        self.definitions: list[Any] = []

    def find_class(self, module: str, name: str) -> Any:
        try:
            found = super().find_class(module, name)
        except (ImportError, AttributeError) as exc:
            if not self.lenient:
                raise
            self.stood_in = True
            return _stand_in(f"{module}.{name}", exc)
        if id(found) not in _REPLACED_WHEN_LOADED:  # nearly every one: nothing more to ask
            return found
        if not self.lenient and found is _MAKE_FUNCTION:  # a request: the notebook's globals
            return self._notebook_function
        if not self.lenient and found in _SKELETON_MAKERS:
            return functools.partial(self._notebook_class, found)
        if self.lenient:
            if found is cloudpickle.cloudpickle.subimport:
                return self._subimport
            if found in _REBUILT_OR_STOOD_IN:
                return functools.partial(self._rebuilt_or_stand_in, found)
            # An answer's notebook class is the kernel's own (cloudpickle finds it by its tracker
            # id), and stays as the notebook defined it: cloudpickle would set the target's rebuilt
            # methods on it, whose globals are the target's copy of the notebook's, so every
            # method of the class read stale globals from then on, in every later cell.
            if not getattr(_ANSWERS_SET_CLASSES, "on", False):
                if found in _SKELETON_MAKERS:
                    return functools.partial(self._skeleton, found)
                if found is _CLASS_SETSTATE:
                    return self._class_setstate
        return found

    def _notebook_function(self, *args: Any) -> types.FunctionType:
        made = _make_notebook_function(*args)
        self.definitions.append(made)
        return made

    def _notebook_class(self, make: Callable[..., Any], *args: Any) -> Any:
        made = make(*args)
        self.definitions.append(made)
        return made

    def _skeleton(self, make: Callable[..., Any], *args: Any) -> Any:
        tracker_id = args[-2] if len(args) > 1 else None  # (..., class_tracker_id, extra)
        known = tracker_id is not None and tracker_id in _CLASS_TRACKER
        made = make(*args)
        if known:
            self._known_classes.add(id(made))
        return made

    def _class_setstate(self, obj: Any, state: Any) -> Any:
        if id(obj) in self._known_classes:
            return obj
        return _CLASS_SETSTATE(obj, state)

    def _rebuilt_or_stand_in(self, rebuild: Callable[..., Any], *args: Any) -> Any:
        try:
            return rebuild(*args)
        except Exception as exc:  # this value alone is lost, not the whole answer
            self.stood_in = True
            return _stand_in(_REBUILT_OR_STOOD_IN[rebuild], exc)()

    def _subimport(self, name: str) -> Any:
        try:
            return cloudpickle.cloudpickle.subimport(name)
        except ImportError as exc:
            equivalent = device_module_equivalent(name)
            if equivalent is not None:
                return equivalent
            self.stood_in = True
            return _stand_in(f"module {name}", exc)()


#: On while answers may change this process's classes (:func:`answers_set_classes`).
_ANSWERS_SET_CLASSES = threading.local()


@contextlib.contextmanager
def answers_set_classes() -> Iterator[None]:
    """Answers loaded meanwhile change the classes this process has, as the target changed them.

    For a cell no run of which happens here (``--against``): the target's run is the only one that
    changed a notebook class (``C.count += 1``). Otherwise the kernel's own run did, in place.
    """
    before = getattr(_ANSWERS_SET_CLASSES, "on", False)
    _ANSWERS_SET_CLASSES.on = True
    try:
        yield
    finally:
        _ANSWERS_SET_CLASSES.on = before


_CLASS_SETSTATE = cloudpickle.cloudpickle._class_setstate
_CLASS_TRACKER = cloudpickle.cloudpickle._DYNAMIC_CLASS_TRACKER_BY_ID
_SKELETON_MAKERS = (
    cloudpickle.cloudpickle._make_skeleton_class,
    cloudpickle.cloudpickle._make_skeleton_enum,
)
#: What rebuilds a compiled program in an answer, which this process may fail to load though its
#: classes exist here: a scripted module whose archive does not load (``optimize_for_inference``'s
#: oneDNN constants), a graph module whose tracer torch.fx cannot make again (``ep.module()`` of
#: an exported program, which itself travels as its archive). Each stands in alone, and the
#: answer's other values come back.
_REBUILT_OR_STOOD_IN: dict[Callable[..., Any], str] = {
    script_module_again: "a scripted module",
    torch.fx.graph_module.reduce_graph_module: "a torch.fx GraphModule",
    torch.fx.graph_module.reduce_package_graph_module: "a torch.fx GraphModule",
}
#: The ids of the functions :meth:`_Unpickler.find_class` may give a replacement of its own for.
_REPLACED_WHEN_LOADED = frozenset(
    map(
        id,
        (
            _MAKE_FUNCTION,
            cloudpickle.cloudpickle.subimport,
            *_SKELETON_MAKERS,
            _CLASS_SETSTATE,
            *_REBUILT_OR_STOOD_IN,
        ),
    )
)


def device_module_equivalent(name: str) -> types.ModuleType | None:
    """What a cell running on CUDA holds where the target held its device module (``torch.cuda``).

    ``torch.neuron`` or ``torch.tpu`` from a target process, in a process without that device.
    """
    from neuron_workbench.emulator.profiles import DEVICES

    prefix, _, device = name.partition(".")
    return torch.cuda if prefix == "torch" and device in DEVICES else None


@dataclass
class Loaded:
    """What :func:`loads` rebuilt, and whether any part of it is an :class:`Unloadable` stand-in."""

    value: Any
    stood_in: bool
    #: The classes and functions sent by value that it rebuilt (a request's, :func:`loads_request`).
    definitions: tuple[Any, ...] = ()


def loads(packed: Packed) -> Any:
    """Inverse of :func:`dumps` (the value; see :func:`loads_leniently` for stand-ins)."""
    return _load(packed, False).value


def loads_request(packed: Packed) -> Loaded:
    """Like :func:`loads`, with the notebook's classes and functions the message carried by value.

    A target process names them in its ``__main__`` for the run (see
    ``target_requests.main_module_over``): pickle finds a class by name, also when the cell never
    names it (``torch.save(model, path)``).
    """
    return _load(packed, False)


def loads_leniently(packed: Packed) -> Loaded:
    """Like :func:`loads`, for a target's answer in the kernel.

    What cannot be rebuilt here becomes an :class:`Unloadable` stand-in, and a class sent by value
    that this process already has stays as it is here (the target's copy of its methods is not set
    on it) unless :func:`answers_set_classes` is on.
    """
    return _load(packed, True)


def _load(packed: Packed, lenient: bool) -> Loaded:
    storages = _open_storages(packed)
    previous = getattr(_LOADING, "storages", None)
    _LOADING.storages = storages
    unpickler = None
    try:
        unpickler = _Unpickler(io.BytesIO(packed.data), packed.buffers, lenient)
        bars_before = _open_progress_bars() if lenient else None
        # What rebuilding an object warns was shown when the notebook built it: a method decorated
        # with @torch.cuda.amp.autocast() (a deprecated class, which warns when made) showed its
        # FutureWarning twice in every cell, at this line (the request's load, the answer's)
        with warnings_ignored():
            value = unpickler.load()
        if bars_before is not None:
            _forget_progress_bars_loaded(bars_before)
        return Loaded(value, unpickler.stood_in, tuple(unpickler.definitions))
    finally:
        _LOADING.storages = previous
        if unpickler is not None:
            # The memo holds every object loaded and the unpickler's own methods find_class gave
            # (a cycle back to it): the whole message stayed alive until the collector ran, and in
            # a worker every other cell found the last run's device tensors there and paid for a
            # full collection (130 ms with transformers loaded)
            unpickler.memo.clear()


def _open_progress_bars() -> list[Any]:
    """The progress bars tqdm counts as open in this process."""
    return list(getattr(progress_bar_class(), "_instances", ()))


def _forget_progress_bars_loaded(before: list[Any]) -> None:
    """Take the bars an answer rebuilt out of tqdm's open bars (all but those open ``before``).

    They are the target's copies (for the report, or kept by ``--keep target``), drawn nowhere
    here; tqdm counted them as open bars, so while a report holding one lived, each later bar, in
    plain cells too, was drawn one line lower (a newline and a cursor-up on every refresh).
    """
    bar = progress_bar_class()
    instances = getattr(bar, "_instances", None)
    if instances is None:
        return
    if len(instances) <= len(before):  # none rebuilt (most answers): tqdm's lock not taken
        return
    kept = {id(each) for each in before}  # alive: ``before`` holds them
    with bar.get_lock():
        for each in list(instances):
            if id(each) not in kept:
                instances.discard(each)


def unloadable_in(value: Any, depth: int = 0, seen: set[int] | None = None) -> Unloadable | None:
    """The first :class:`Unloadable` stand-in reachable from ``value`` (containers, attributes)."""
    if isinstance(value, Unloadable):
        return value
    if isinstance(value, type):  # a stand-in for a class or function sent by reference
        return value() if issubclass(value, Unloadable) else None
    if depth > 12 or isinstance(value, (torch.Tensor, str, bytes, int, float)):
        return None
    seen = set() if seen is None else seen
    if id(value) in seen:
        return None
    seen.add(id(value))
    for item in _children(value):
        found = unloadable_in(item, depth + 1, seen)
        if found is not None:
            return found
    return None


def _children(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        yield from value.keys()
        yield from value.values()
    elif isinstance(value, (list, tuple, set, frozenset)):
        yield from value
    elif not isinstance(value, types.ModuleType):
        # a module that loaded is this process's own (one that did not is a stand-in): its
        # globals lead to every module torch imports, deprecated names that warn when touched,
        # and this module's own Unloadable, so `import torch` of a script was "not loaded"
        attributes = getattr(value, "__dict__", None)
        if isinstance(attributes, dict):
            yield from attributes.values()


# ---- a message over a pipe -----------------------------------------------------------------------


def send(conn: Connection, packed: Packed, header: dict[str, Any] | None = None) -> None:
    """Write ``packed`` to ``conn``: a header (sizes, arena, ``header``), the stream, each buffer."""
    raws = [buffer.raw() for buffer in packed.buffers]
    storages = [buffer.raw() for buffer in packed.storages]
    head = {
        **(header or {}),
        "sizes": [raw.nbytes for raw in raws],
        "storage_sizes": [raw.nbytes for raw in storages],
        "arena": packed.arena,
        "table": packed.table,
    }
    conn.send_bytes(pickle.dumps(head))
    conn.send_bytes(packed.data)
    for raw in (*raws, *storages):
        conn.send_bytes(raw)


def receive(conn: Connection) -> tuple[dict[str, Any], Packed]:
    """Read one :func:`send` message: its header and the packed message (buffers writable)."""
    head = pickle.loads(conn.recv_bytes())
    data = conn.recv_bytes()
    lists: list[list[pickle.PickleBuffer]] = [[], []]
    for target, sizes in zip(lists, (head["sizes"], head["storage_sizes"])):
        for size in sizes:
            buffer = bytearray(size)
            if size:
                conn.recv_bytes_into(buffer)
            else:
                conn.recv_bytes()
            target.append(pickle.PickleBuffer(buffer))
    packed = Packed(data, lists[0], lists[1], head["arena"], [tuple(e) for e in head["table"]])
    return head, packed
