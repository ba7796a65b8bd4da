"""Run a cell's target side in a child process that owns the target device (the ``worker`` executor).

The kernel never installs the emulator (or loads a vendor SDK's device) itself: each target gets a
spawned Python process, started once and reused. What the cell reads is shipped with
``cloudpickle`` (notebook functions and classes by value, importable modules by reference, with the
kernel's ``sys.path`` and working directory mirrored); the finished :class:`~.records.Run` comes back
with its tensors moved to the host. A worker that dies (a signal, ``os._exit``, the OOM killer) or
overruns ``timeout`` becomes an ERROR run naming the signal, the last op it dispatched and the cell
line, and the next cell gets a fresh worker; the kernel and its namespace are never touched.

The last dispatched op is written to a small memory-mapped file by a dispatch mode (one slice
assignment per op), so it survives the crash; the cell line comes from :mod:`faulthandler`'s dump.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import linecache
import mmap
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import torch

from neuron_workbench.backends.base import Availability, Backend, BackendInfo
from neuron_workbench.errors import BackendUnavailable, WorkbenchUsageError
from neuron_workbench.run.namespace import ORIGIN_ATTR, ResidentObjects, on_accelerator, tensors_in
from neuron_workbench.run.records import Run, RunError

#: Environment variable set (to the target's name) in every worker process.
WORKER_ENV = "NEURON_WORKBENCH_WORKER"
#: Bytes of the memory-mapped record of the last dispatched op.
_OP_SLOT = 128
#: Seconds a fresh worker may take to import torch and install its device.
START_TIMEOUT_S = 180.0
_EXECUTOR_HINT = "run the cell with --executor inprocess"

# ---- transport -----------------------------------------------------------------------------------


def _rebuild_tensor(
    data: torch.Tensor,
    requires_grad: bool,
    grad: torch.Tensor | None,
    parameter: bool,
    state: dict[str, Any],
) -> torch.Tensor:
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


def _rebuild_device(kind: str, index: int | None) -> torch.device:
    # An accelerator this process lacks (the kernel holds no device): "privateuseone" still says
    # the cell meant an accelerator, so the next cell's runs put the value on their own device.
    try:
        return torch.device(kind, index)
    except RuntimeError:
        return torch.device("privateuseone", index)


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, plus tensors that carry their gradient and leave any device for the host.

    A tensor on an accelerator (emulated or real) travels as a host copy marked with the device it
    came from, so the receiving side still knows the cell had put it there.
    """

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.CodeType):
            # cloudpickle blanks file names; error reports and crash dumps need the cell's
            rebuild, args = cloudpickle.cloudpickle._code_reduce(obj)
            return rebuild, tuple(
                obj.co_filename if arg == "<dynamic-code>" else arg for arg in args
            )
        if isinstance(obj, torch.device) and obj.type not in ("cpu", "cuda", "meta"):
            return _rebuild_device, (obj.type, obj.index)
        if isinstance(obj, torch.Tensor) and obj.layout == torch.strided:
            on_device = obj.device.type not in ("cpu", "meta")
            if on_device or type(obj) in _PLAIN_TENSOR_TYPES:
                data = obj.detach()
                if on_device:
                    # a device tensor's attributes belong to its backend (the emulator's payload)
                    data = data.to("cpu")
                    state = {ORIGIN_ATTR: str(obj.device)}
                else:
                    state = {k: v for k, v in vars(obj).items() if not k.startswith("_backward")}
                return (
                    _rebuild_tensor,
                    (
                        _PlainData(data),
                        obj.requires_grad,
                        obj.grad if obj.is_leaf else None,
                        isinstance(obj, torch.nn.Parameter) or "_is_param" in vars(obj),
                        state,
                    ),
                )
        return super().reducer_override(obj)


_PLAIN_TENSOR_TYPES = {torch.Tensor, torch.nn.Parameter}


def _rebuild_data(raw: Any, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    flat = torch.from_numpy(raw)
    return flat.view(dtype).reshape(shape) if flat.numel() else torch.empty(shape, dtype=dtype)


class _PlainData:
    """A host tensor's values as raw bytes (a NumPy array pickles them in one copy, any dtype)."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __reduce__(self) -> Any:
        tensor = self.tensor.contiguous()
        if tensor.numel() == 0 or tensor.dtype.is_complex or tensor.is_quantized:
            return tensor.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        raw = tensor.reshape(-1).view(torch.uint8).numpy()
        return (_rebuild_data, (raw, tensor.dtype, tuple(tensor.shape)))


@dataclass
class Packed:
    """A pickled message: the pickle stream plus the tensors' bytes, kept out of band (no copy)."""

    data: bytes
    buffers: list[pickle.PickleBuffer]


def dumps(obj: Any) -> Packed:
    """Serialise ``obj`` for the other side of a worker pipe."""
    stream = io.BytesIO()
    buffers: list[pickle.PickleBuffer] = []
    _Pickler(stream, protocol=5, buffer_callback=buffers.append).dump(obj)
    return Packed(stream.getvalue(), buffers)


def loads(packed: Packed) -> Any:
    """Inverse of :func:`dumps`."""
    return pickle.loads(packed.data, buffers=packed.buffers)


def send(conn: Connection, packed: Packed) -> None:
    """Write ``packed`` to ``conn``: the buffer sizes, the stream, then each buffer as it is."""
    raws = [buffer.raw() for buffer in packed.buffers]
    conn.send_bytes(pickle.dumps([raw.nbytes for raw in raws]))
    conn.send_bytes(packed.data)
    for raw in raws:
        conn.send_bytes(raw)


def receive(conn: Connection) -> Packed:
    """Read one :func:`send` message; buffers land in writable memory that tensors then use."""
    sizes = pickle.loads(conn.recv_bytes())
    data = conn.recv_bytes()
    buffers = []
    for size in sizes:
        buffer = bytearray(size)
        if size:
            conn.recv_bytes_into(buffer)
        else:
            conn.recv_bytes()
        buffers.append(pickle.PickleBuffer(buffer))
    return Packed(data, buffers)


_ANCHOR_CODE = (lambda: None).__code__


def _anchor(namespace: Mapping[str, Any]) -> types.FunctionType:
    # A function whose globals are the namespace: cloudpickle gives every notebook function it
    # ships in one message the same globals dict, and this function's copy leads the worker to it.
    return types.FunctionType(_ANCHOR_CODE, namespace, "anchor")  # type: ignore[arg-type]


def _describe(value: Any) -> str:
    kind = type(value).__name__
    return f"a {kind}" if kind[0].lower() not in "aeiou" else f"an {kind}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def pack_request(
    request: dict[str, Any], values: dict[str, Any], namespace: Mapping[str, Any], target: str
) -> Packed:
    """The run request with ``values``; a one-line usage error names what cannot be shipped."""
    message = dict(request, values=values, anchor=_anchor(namespace))
    try:
        return dumps(message)
    except Exception as exc:
        for name in sorted(values):
            try:
                dumps({"anchor": message["anchor"], name: values[name]})
            except Exception as item_exc:
                raise WorkbenchUsageError(
                    f"{name!r} ({_describe(values[name])}) cannot be sent to the {target} worker "
                    f"process ({_first_line(item_exc)}); {_EXECUTOR_HINT}"
                ) from None
        raise WorkbenchUsageError(
            f"the cell cannot be sent to the {target} worker process ({_first_line(exc)}); "
            f"{_EXECUTOR_HINT}"
        ) from None


# ---- the worker process --------------------------------------------------------------------------


class _LastOpMode(torch.utils._python_dispatch.TorchDispatchMode):
    """Writes the name of every dispatched op into a memory map (survives the process)."""

    def __init__(self, slot: mmap.mmap) -> None:
        super().__init__()
        self._slot = slot
        self._names: dict[Any, bytes] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = self._names.get(func)
        if name is None:
            raw = str(func._schema.name).encode()[: _OP_SLOT - 1]
            name = self._names[func] = raw.ljust(_OP_SLOT, b"\0")
        self._slot[0:_OP_SLOT] = name
        return func(*args, **(kwargs or {}))


# PyTorch wraps a mode's __torch_dispatch__ in a dynamo-disable guard that costs more than this mode
# does per op; the mode only writes bytes, so it runs as written.
_LastOpMode.__torch_dispatch__ = _LastOpMode.__dict__["__torch_dispatch__"].__wrapped__  # type: ignore[attr-defined]


#: Variables a worker keeps as it was started: its device, that it is a worker, no inline plots.
_OWN_ENV = ("NEURON_WORKBENCH_EMULATE", "NEURON_WORKBENCH_EMULATE_REPORT", "MPLBACKEND", WORKER_ENV)


def device_ready(backend: Backend, host: str) -> dict[str, Any]:
    """Make ``backend``'s device ready in this target process: ``availability`` and ``info``.

    Run once when a worker or a Ray actor starts; a failure is reported as unavailability
    (naming the ``host`` kind), never raised, so the kernel gets one line.
    """
    try:
        availability = backend.availability()
        if availability:
            with backend.session():  # install the emulated device before any backward pass
                pass
        return {"availability": availability, "info": backend.info() if availability else None}
    except Exception as exc:
        reason = f"{backend.name} {host}: {_first_line(exc)}"
        return {"availability": Availability(False, reason), "info": None}


def _mirror_environment(kernel: dict[str, str]) -> None:
    """The kernel's environment as of this cell (``%env`` settings reach the run), less ours."""
    for name in [n for n in os.environ if n not in kernel and n not in _OWN_ENV]:
        del os.environ[name]
    for name, value in kernel.items():
        if name not in _OWN_ENV and os.environ.get(name) != value:
            os.environ[name] = value


def _exit_with_parent() -> None:
    """End this process when the kernel that started it is gone, even in the middle of a cell."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="neuron-workbench-parent-watch", daemon=True).start()


def _serve(fd: int, folder: str) -> None:
    """Worker main loop: set up, then answer run requests until the pipe closes."""
    import faulthandler

    conn = Connection(fd)
    _exit_with_parent()
    init = pickle.loads(conn.recv_bytes())
    sys.path[:] = list(init["sys_path"])
    with contextlib.suppress(OSError):
        os.chdir(init["cwd"])
    faults = open(os.path.join(folder, "faults.log"), "w")  # noqa: SIM115 - open for the process
    faulthandler.enable(file=faults, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=faults, all_threads=True, chain=False)
    with open(os.path.join(folder, "lastop"), "r+b") as handle:
        slot = mmap.mmap(handle.fileno(), _OP_SLOT)
    import builtins

    if not hasattr(builtins, "display"):
        # IPython puts display() among the builtins; here a displayed object is printed instead.
        builtins.display = lambda *objects, **kwargs: print(*objects)  # type: ignore[attr-defined]
    from neuron_workbench.backends import get_backend

    backend = get_backend(init["target"])
    hello: dict[str, Any] = {"pid": os.getpid(), **device_ready(backend, "worker")}
    send(conn, dumps(hello))
    while True:
        try:
            # the kernel's import path, folder and torch threads as of this cell, then the request
            where = pickle.loads(conn.recv_bytes())
            data = receive(conn)
        except (EOFError, OSError):
            return
        if where["sys_path"] != sys.path:
            sys.path[:] = where["sys_path"]
        _mirror_environment(where["environ"])
        if where["threads"] != torch.get_num_threads():
            torch.set_num_threads(where["threads"])
        if where["cwd"] != os.getcwd():
            with contextlib.suppress(OSError):
                os.chdir(where["cwd"])
        answer = answer_request(
            data, backend, slot, host="worker", load_hint=_EXECUTOR_HINT, hint=_EXECUTOR_HINT
        )
        send(conn, answer)


def answer_request(
    data: Packed,
    backend: Backend,
    slot: mmap.mmap | bytearray,
    *,
    host: str,
    load_hint: str,
    hint: str,
    running: Callable[[dict[str, Any]], contextlib.AbstractContextManager[Any]] | None = None,
) -> Packed:
    """A target process's packed answer to one packed run request (a worker's or a Ray actor's).

    The run, or a one-line ``usage_error``: what the cell reads could not be loaded here (with
    ``load_hint``), an option the target cannot honour, or the workbench failing around the cell
    (with ``hint``). The process keeps serving either way. ``running`` wraps the run itself.
    """
    try:
        request = loads(data)
    except Exception as exc:
        return dumps(
            {
                "usage_error": f"the {backend.name} {host} could not load what the cell reads "
                f"({_first_line(exc)}); {load_hint}"
            }
        )
    try:
        with running(request) if running is not None else contextlib.nullcontext():
            return _run_request(request, backend, slot)
    except WorkbenchUsageError as exc:  # an option the target cannot honour (--what-if)
        return dumps({"usage_error": str(exc)})
    except Exception as exc:  # the workbench failed around the cell: say so, keep serving
        return dumps(
            {"usage_error": f"the {backend.name} {host} failed: {_first_line(exc)}; {hint}"}
        )


def _run_request(request: dict[str, Any], backend: Backend, slot: mmap.mmap | bytearray) -> Packed:
    from neuron_workbench.run.executor import RunSpec, execute, what_if_policy

    options = request.get("backend_options")
    if options and options != backend.options():  # the cell's adapter options (--list-fallbacks)
        from neuron_workbench.backends import get_backend

        backend = get_backend(backend.name, **options)

    program = request["program"]
    linecache.cache[program.filename] = (
        len(program.source),
        None,
        program.source.splitlines(keepends=True),
        program.filename,
    )
    namespace = request["anchor"].__globals__
    namespace.setdefault("__name__", "__main__")
    # Strings are interned as the kernel's were: `device = "cuda"` rebinding the same text must
    # not look like a new binding (runs find their outputs by identity).
    namespace.update(
        {
            name: sys.intern(value) if type(value) is str else value
            for name, value in request["values"].items()
        }
    )
    resident = ResidentObjects()
    for name in request["force"]:
        if name in namespace:
            resident.add(namespace[name])
    spec = RunSpec(
        program,
        namespace,
        seed=request["seed"],
        hidden=request["hidden"],
        resident=resident,
        instruments=request["instruments"],
        rng_on_cpu=request["rng_on_cpu"],
        steps=request["steps"],
        isolate_inputs=False,
        ref_precision=request["ref_precision"],
    )
    try:
        with what_if_policy(backend, request["what_if"]), _LastOpMode(slot):
            run = execute(spec, backend, run_id="target")
    except KeyboardInterrupt:  # the cell (or a signal) interrupted the run: the kernel re-raises
        slot[0:_OP_SLOT] = bytes(_OP_SLOT)
        return dumps({"interrupted": True})
    slot[0:_OP_SLOT] = bytes(_OP_SLOT)
    from neuron_workbench.run.records import recorded

    run.extras = {name: recorded(value) for name, value in run.extras.items()}
    try:
        return dumps({"run": run})
    except Exception:
        dropped = []
        for field_name in ("outputs", "bindings"):
            values = getattr(run, field_name)
            for name in list(values):
                try:
                    dumps(values[name])
                except Exception:
                    values.pop(name)
                    dropped.append(name)
        try:
            dumps(run.last_value)
        except Exception:
            run.last_value = None
        note = "".join(
            f"neuron-workbench: {name!r} could not be sent back from the {backend.name} worker "
            "process; it is left out of the comparison\n"
            for name in sorted(set(dropped))
        )
        run.stderr += note
        return dumps({"run": run})


# ---- the kernel side -----------------------------------------------------------------------------

_BOOT = (
    "import sys; sys.path[:0] = {paths!r}; "
    "from neuron_workbench.run.worker import _serve; _serve({fd}, {folder!r})"
)


class WorkerDied(Exception):
    """The worker process ended (or was ended) while running a cell."""


def _signal_name(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-returncode).name
        return f"signal {-returncode}"
    return f"exit status {returncode}"


def _package_root() -> str:
    # The folder holding the neuron_workbench package (this file is neuron_workbench/run/worker.py).
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class TargetWorker:
    """One worker process that owns ``target``'s device; started lazily, restarted after a death."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.cells_run = 0
        self.info: BackendInfo | None = None
        self.availability: Availability | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._folder: str | None = None
        self.started_s: float | None = None

    # -- lifecycle --

    @property
    def alive(self) -> bool:
        """Whether the process is running."""
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """The worker's process id (None before it started)."""
        return self._process.pid if self._process is not None else None

    def memory_bytes(self) -> int | None:
        """Resident set size of the worker (Linux ``/proc``), or None."""
        if not self.alive:
            return None
        try:
            with open(f"/proc/{self.pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def start(self) -> None:
        """Spawn the process and wait until its device is ready (or known unavailable)."""
        self.stop()
        started = time.perf_counter()
        self._folder = tempfile.mkdtemp(prefix=f"neuron-workbench-{self.target}-")
        with open(os.path.join(self._folder, "lastop"), "wb") as handle:
            handle.write(bytes(_OP_SLOT))
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["NEURON_WORKBENCH_EMULATE"] = self.target if self.target in ("neuron", "tpu") else ""
        env[WORKER_ENV] = self.target
        env.pop("NEURON_WORKBENCH_EMULATE_REPORT", None)  # the kernel's report is not the worker's
        # a notebook's inline plotting backend means nothing in the worker
        env.pop("MPLBACKEND", None)
        boot = _BOOT.format(paths=[_package_root()], fd=theirs.fileno(), folder=self._folder)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", boot],
                pass_fds=(theirs.fileno(),),
                env=env,
                stdin=subprocess.DEVNULL,
                # its own process group: a notebook interrupt reaches the kernel, which ends it
                start_new_session=True,
            )
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        self._conn.send_bytes(
            pickle.dumps({"sys_path": list(sys.path), "cwd": os.getcwd(), "target": self.target})
        )
        try:
            hello = self._receive(START_TIMEOUT_S)
        except WorkerDied as exc:
            self.stop()
            raise BackendUnavailable(
                f"the {self.target} worker process failed to start: {exc}"
            ) from None
        self.availability = hello["availability"]
        self.info = hello["info"]
        self.cells_run = 0
        self.started_s = time.perf_counter() - started

    def stop(self) -> None:
        """End the process (if any) and remove its files."""
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=10)
            self._process = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def ensure_started(self) -> None:
        """Start the worker unless it is running."""
        if not self.alive:
            self.start()

    # -- running --

    def _receive(self, timeout: float | None) -> Any:
        assert self._conn is not None and self._process is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = 0.25 if deadline is None else min(0.25, max(0.0, deadline - time.monotonic()))
            try:
                if self._conn.poll(wait):
                    return loads(receive(self._conn))
            except (EOFError, OSError):
                pass  # the pipe closed: the process died; the poll below says how
            if self._process.poll() is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._process.wait(timeout=2)
                raise WorkerDied(f"target process died ({_signal_name(self._process.returncode)})")
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError

    def run(self, message: Packed, *, timeout: float | None, cell_filename: str) -> Any:
        """Send one packed request and return the worker's answer.

        Raises
        ------
        WorkerDied
            With the one-line message (signal or timeout, last op, cell line); the worker is gone.
        """
        self.ensure_started()
        assert self._conn is not None
        try:
            where = {
                "sys_path": list(sys.path),
                "cwd": os.getcwd(),
                "threads": torch.get_num_threads(),
                "environ": dict(os.environ),
            }
            self._conn.send_bytes(pickle.dumps(where))
            send(self._conn, message)
            answer = self._receive(timeout)
        except TimeoutError:
            self._dump_stacks()
            where = self._where(cell_filename)
            self.stop()
            raise WorkerDied(
                f"target process timed out after {timeout:g} s{where}; it was ended"
            ) from None
        except WorkerDied as exc:
            where = self._where(cell_filename)
            self.stop()
            raise WorkerDied(f"{exc}{where}") from None
        except BaseException:  # KeyboardInterrupt: the worker's state is unknown; start afresh
            self.stop()
            raise
        self.cells_run += 1
        return answer

    def _dump_stacks(self) -> None:
        # faulthandler in the worker writes every thread's stack on SIGUSR1, even mid C call.
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(OSError):
                self._process.send_signal(signal.SIGUSR1)
            time.sleep(0.3)

    def _where(self, cell_filename: str) -> str:
        """`` while running aten::op at cell line N`` from the files the worker left."""
        if self._folder is None:
            return ""
        text = ""
        with contextlib.suppress(OSError):
            with open(os.path.join(self._folder, "lastop"), "rb") as handle:
                op = handle.read(_OP_SLOT).split(b"\0", 1)[0].decode(errors="replace")
            text += f" while running {op}" if op else ""
        with contextlib.suppress(OSError):
            with open(os.path.join(self._folder, "faults.log"), errors="replace") as handle:
                dump = handle.read()[-200_000:]
            # The cell's top-level frame; faulthandler may print exec'd code as <dynamic-code>.
            names = f"(?:{re.escape(cell_filename)}|<dynamic-code>)"
            pattern = re.compile(r'File "' + names + r'", line (\d+) in <module>')
            match = pattern.search(dump)
            if match:
                text += f" at cell line {match.group(1)}"
        return text


@dataclass
class WorkerRow:
    """One line of ``%neuron_workers``."""

    target: str
    pid: int | None
    alive: bool
    memory_bytes: int | None
    cells_run: int


_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


@atexit.register
def _close_pools() -> None:
    for pool in list(_POOLS):
        with contextlib.suppress(Exception):  # at exit: a pool's runtime may already be gone
            pool.close()


class WorkerPool:
    """The workers of one session, one per target, started on first use.

    Subclasses keep other kinds of target slot (Ray actors) by overriding :meth:`_new` and
    :meth:`_row`; a slot has ``start()``, ``stop()``, ``target``, ``alive`` and ``cells_run``.
    """

    def __init__(self) -> None:
        self._slots: dict[str, Any] = {}
        _POOLS.add(self)

    def _new(self, target: str) -> Any:
        return TargetWorker(target)

    def _row(self, worker: Any) -> WorkerRow:
        pid = worker.pid if worker.alive else None
        return WorkerRow(worker.target, pid, worker.alive, worker.memory_bytes(), worker.cells_run)

    def get(self, target: str) -> Any:
        """The worker for ``target`` (created, not yet started, on first use)."""
        if target not in self._slots:
            self._slots[target] = self._new(target)
        return self._slots[target]

    def rows(self) -> list[WorkerRow]:
        """Every worker with its state."""
        return [self._row(slot) for slot in self._slots.values()]

    def restart(self, target: str) -> Any:
        """Stop ``target``'s worker and start a fresh one."""
        worker = self.get(target)
        worker.start()
        return worker

    def close(self) -> None:
        """Stop every worker."""
        for worker in self._slots.values():
            worker.stop()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


_ATOMS = (str, int, float, bool, bytes, complex, type(None))


class WorkerExecutor:
    """Executes the target run of a cell in the pool's worker for that target."""

    name = "worker"

    def __init__(self, pool: WorkerPool | None = None, timeout: float | None = None) -> None:
        self.pool = pool if pool is not None else WorkerPool()
        self.timeout = timeout

    def availability(self, backend: Backend) -> Availability:
        """Whether ``backend`` can run in its worker (starts the worker)."""
        worker = self.pool.get(backend.name)
        try:
            worker.ensure_started()
        except BackendUnavailable as exc:
            return Availability(False, str(exc))
        assert worker.availability is not None
        return worker.availability

    def run(self, spec: Any, backend: Backend, *, run_id: str, what_if: str | None = None) -> Run:
        """Run ``spec`` on ``backend`` in its worker and return the :class:`Run` it sent back."""
        from neuron_workbench.run.cell import referenced_names

        worker = self.pool.get(backend.name)
        worker.ensure_started()
        namespace = spec.namespace
        names = set(referenced_names(spec.program, namespace))
        # Plain values the cell may rebind without reading: in this process a run finds its outputs
        # by identity against the whole namespace, so `device = "cuda"` twice is no new binding.
        names |= {
            name for name in spec.program.body.co_names if type(namespace.get(name)) in _ATOMS
        }
        names = sorted(n for n in names if n in namespace)
        values = {name: namespace[name] for name in names}
        force = [
            name
            for name, value in values.items()
            if value in spec.resident or any(on_accelerator(t) for t in tensors_in(value))
        ]
        request = {
            "program": spec.program,
            "seed": spec.seed,
            "hidden": frozenset(spec.hidden) & (set(names) | set(spec.program.body.co_names)),
            "force": force,
            "instruments": spec.instruments,
            "rng_on_cpu": spec.rng_on_cpu,
            "steps": spec.steps,
            "what_if": what_if,
            "ref_precision": getattr(spec, "ref_precision", "cuda"),
            "backend_options": backend.options(),
        }
        message = pack_request(request, values, namespace, backend.name)
        info = worker.info or backend.info()
        try:
            answer = worker.run(message, timeout=self.timeout, cell_filename=spec.program.filename)
        except WorkerDied as exc:
            # The message names the cell line itself; no lineno, so reports do not repeat it.
            return Run(backend=info, error=RunError("TargetProcessDied", str(exc)))
        if "interrupted" in answer:
            raise KeyboardInterrupt
        if "usage_error" in answer:
            raise WorkbenchUsageError(answer["usage_error"])
        run: Run = answer["run"]
        spec.captured[run_id] = _Printed(run.stdout, run.stderr)
        return run


class _Printed:
    """What a worker run printed, replayable in the kernel."""

    def __init__(self, stdout: str, stderr: str) -> None:
        self.stdout = stdout
        self.stderr = stderr

    def show(self) -> None:
        sys.stdout.write(self.stdout)
        sys.stderr.write(self.stderr)
