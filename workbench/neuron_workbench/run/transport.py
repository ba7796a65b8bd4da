"""Move a cell's values between the kernel and a target process, keeping the object graph.

Values travel as one pickle (``cloudpickle``: notebook functions and classes by value, importable
modules by reference), so objects that reference each other arrive referencing each other. Tensors
travel by *storage*: each storage once, then every tensor as a view of it (offset, sizes, strides),
so views keep their base, tied weights stay tied and a model and its optimizer still share
parameters. A tensor on an accelerator travels as a host copy of its whole storage, marked with the
device it came from.

Between processes of one host, the storages' bytes go into one shared-memory file (an *arena*,
written once by the sender, mapped copy-on-write by the receiver, no pickle copy of tensor data);
to a remote process (a Ray actor) they travel in the message itself.

The receiver can load *leniently*: a class, function or module that does not exist on its side (the
target's device module ``torch.neuron``, a class of a device SDK) becomes an :class:`Unloadable`
stand-in instead of failing the whole message, so one result that cannot come back never hides the
others.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import pickle
import threading
import types
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import torch

from neuron_workbench.run.namespace import ORIGIN_ATTR

#: Storages in an arena start at multiples of this many bytes (any dtype's alignment, a cache line).
ARENA_ALIGN = 64
_PLAIN_TENSOR_TYPES = {torch.Tensor, torch.nn.Parameter}


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


def arena_folder() -> str | None:
    """A folder on shared memory for arenas (``/dev/shm`` on Linux), or None."""
    folder = "/dev/shm"
    return folder if os.path.isdir(folder) and os.access(folder, os.W_OK) else None


# ---- sending -------------------------------------------------------------------------------------


class _StorageSink:
    """Collects the bytes of each storage once: into an arena file, or as in-band buffers."""

    def __init__(self, folder: str | None) -> None:
        self.folder = folder
        self.table: list[tuple[int, int]] = []
        self.storages: list[pickle.PickleBuffer] = []
        self.path: str | None = None
        self._file: io.BufferedWriter | None = None
        self._size = 0
        self._keep: list[Any] = []  # storages stay alive (and their ids unique) while pickling

    def add(self, storage: torch.UntypedStorage) -> int:
        host = storage if storage.device.type == "cpu" else _host_storage(storage)
        self._keep.append(storage)
        nbytes = host.nbytes()
        raw = torch.empty(0, dtype=torch.uint8).set_(host).numpy() if nbytes else b""
        if self.folder is None:
            self.storages.append(pickle.PickleBuffer(raw))
            return len(self.storages) - 1
        if self._file is None:
            self.path = os.path.join(
                self.folder, f"neuron-workbench-{os.getpid()}-{uuid.uuid4().hex}"
            )
            self._file = open(self.path, "wb")  # noqa: SIM115 - closed by finish()
        pad = -self._size % ARENA_ALIGN
        if pad:
            self._file.write(bytes(pad))
            self._size += pad
        self.table.append((self._size, nbytes))
        if nbytes:
            self._file.write(memoryview(raw))
            self._size += nbytes
        return len(self.table) - 1

    def finish(self) -> None:
        self._keep.clear()
        if self._file is not None:
            self._file.close()
            self._file = None

    def abandon(self) -> None:
        self.finish()
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def _host_storage(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """A host copy of a device storage (all of it: every view of it is rebuilt on the copy)."""
    whole = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    return whole.cpu().untyped_storage()


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
        return torch.device("privateuseone", index)


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, plus tensors by storage (with their gradients) that leave any device for the host."""

    def __init__(self, file: io.BytesIO, sink: _StorageSink, buffers: list[Any]) -> None:
        super().__init__(file, protocol=5, buffer_callback=buffers.append)
        self._sink = sink
        self._tokens: dict[int, _StorageToken] = {}

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.CodeType):
            # cloudpickle blanks file names; error reports and crash dumps need the cell's
            rebuild, args = cloudpickle.cloudpickle._code_reduce(obj)
            return rebuild, tuple(
                obj.co_filename if arg == "<dynamic-code>" else arg for arg in args
            )
        if isinstance(obj, torch.device) and obj.type not in ("cpu", "cuda", "meta"):
            return _rebuild_device, (obj.type, obj.index)
        if isinstance(obj, torch.Tensor):
            reduced = self._reduce_tensor(obj)
            if reduced is not None:
                return reduced
        return super().reducer_override(obj)

    def _reduce_tensor(self, obj: torch.Tensor) -> Any:
        if obj.layout != torch.strided or obj.is_quantized or obj.device.type == "meta":
            return None
        on_device = obj.device.type != "cpu"
        if not (on_device or type(obj) in _PLAIN_TENSOR_TYPES):
            return None  # a tensor subclass pickles itself
        data = obj.detach()
        if data.is_conj() or data.is_neg():  # lazy bits a storage view cannot carry
            data = data.resolve_conj().resolve_neg()
        try:
            token = self._token(data.untyped_storage())
        except (RuntimeError, NotImplementedError):  # a device without host-copyable storages
            data = data.cpu()
            token = self._token(data.untyped_storage())
        if on_device:
            # a device tensor's attributes belong to its backend (the emulator's payload)
            state = {ORIGIN_ATTR: str(obj.device)}
        else:
            state = {k: v for k, v in vars(obj).items() if not k.startswith("_backward")}
        return (
            _rebuild_tensor,
            (
                token,
                data.dtype,
                data.storage_offset(),
                tuple(data.shape),
                tuple(data.stride()),
                obj.requires_grad,
                obj.grad if obj.is_leaf else None,
                isinstance(obj, torch.nn.Parameter) or "_is_param" in vars(obj),
                state,
            ),
        )

    def _token(self, storage: torch.UntypedStorage) -> _StorageToken:
        key = storage._cdata
        token = self._tokens.get(key)
        if token is None:
            token = self._tokens[key] = _StorageToken(self._sink.add(storage))
        return token


def dumps(obj: Any, arena: str | None = None) -> Packed:
    """Serialise ``obj`` for another process.

    Parameters
    ----------
    obj : object
        What to send.
    arena : str, optional
        A folder on shared memory (:func:`arena_folder`): the storages' bytes go into one file
        there, for a receiver on this host. Without it they travel in the message.
    """
    stream = io.BytesIO()
    buffers: list[pickle.PickleBuffer] = []
    sink = _StorageSink(arena)
    try:
        _Pickler(stream, sink, buffers).dump(obj)
    except OSError:
        sink.abandon()
        if arena is None:
            raise
        # The shared-memory folder is full (a container's 64 MiB /dev/shm): in the message instead.
        return dumps(obj, None)
    except BaseException:
        sink.abandon()
        raise
    sink.finish()
    return Packed(stream.getvalue(), buffers, sink.storages, sink.path, sink.table)


# ---- receiving -----------------------------------------------------------------------------------

_LOADING = threading.local()


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
    state: dict[str, Any],
) -> torch.Tensor:
    data = torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)
    tensor: torch.Tensor = (
        torch.nn.Parameter(data, requires_grad=requires_grad)
        if parameter
        else data.requires_grad_(requires_grad)
    )
    if grad is not None:
        tensor.grad = grad
    if state:
        tensor.__dict__.update(state)
    return tensor


def _open_storages(packed: Packed) -> list[torch.UntypedStorage]:
    if packed.arena is None:
        return [_writable_storage(buffer) for buffer in packed.storages]
    with open(packed.arena, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        # copy-on-write: the receiver's writes never reach the file (or the sender)
        mapped = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY) if size else None
    with contextlib.suppress(OSError):
        os.unlink(packed.arena)  # the mapping lives on; the name is not needed any more
    storages = []
    for offset, nbytes in packed.table:
        if nbytes:
            view = torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes, offset=offset)
            storages.append(view.untyped_storage())
        else:
            storages.append(torch.UntypedStorage(0))
    return storages


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

    def find_class(self, module: str, name: str) -> Any:
        try:
            found = super().find_class(module, name)
        except (ImportError, AttributeError) as exc:
            if not self.lenient:
                raise
            self.stood_in = True
            return _stand_in(f"{module}.{name}", exc)
        if self.lenient and found is cloudpickle.cloudpickle.subimport:
            return self._subimport
        return found

    def _subimport(self, name: str) -> Any:
        try:
            return cloudpickle.cloudpickle.subimport(name)
        except ImportError as exc:
            equivalent = device_module_equivalent(name)
            if equivalent is not None:
                return equivalent
            self.stood_in = True
            return _stand_in(f"module {name}", exc)()


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


def loads(packed: Packed) -> Any:
    """Inverse of :func:`dumps` (the value; see :func:`loads_leniently` for stand-ins)."""
    return _load(packed, False).value


def loads_leniently(packed: Packed) -> Loaded:
    """Like :func:`loads`, with :class:`Unloadable` stand-ins for what cannot be rebuilt here."""
    return _load(packed, True)


def _load(packed: Packed, lenient: bool) -> Loaded:
    storages = _open_storages(packed)
    previous = getattr(_LOADING, "storages", None)
    _LOADING.storages = storages
    try:
        unpickler = _Unpickler(io.BytesIO(packed.data), packed.buffers, lenient)
        return Loaded(unpickler.load(), unpickler.stood_in)
    finally:
        _LOADING.storages = previous


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
    else:
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
