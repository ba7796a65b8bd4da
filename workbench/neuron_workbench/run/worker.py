"""Run a cell's target side in a child process that owns the target device (the ``worker`` executor).

The kernel never installs the emulator (or loads a vendor SDK's device) itself: each target gets a
spawned Python process, started once and reused. What the cell reads is shipped by
:mod:`~neuron_workbench.run.transport` (notebook functions and classes by value, importable modules
by reference, tensors by storage through shared memory, so views, tied weights and model/optimizer
references arrive as they left), with the kernel's ``sys.path``, environment and working directory
mirrored; the finished :class:`~.records.Run` comes back the same way, its tensors moved to the
host. A result that cannot be rebuilt in the kernel (the target's device module, a device-bound
object) is reported as not compared instead of failing the cell. Every request carries an id, so an
answer from an abandoned request is never taken for the next one.

A worker that dies (a signal, ``os._exit``, the OOM killer), overruns ``timeout`` or does not start in
time becomes one line (an ERROR run naming the signal, the last op it dispatched and the cell line,
or a start-up failure), and the next cell gets a fresh worker; the kernel and its namespace are
never touched. The last dispatched op is written into a small memory-mapped file by the emulator's
native core itself (no Python per op), or by a Python dispatch mode where that core is not in use;
it survives the crash. The cell line comes from :mod:`faulthandler`'s dump.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

from neuron_workbench.backends.base import Availability, Backend, BackendInfo
from neuron_workbench.errors import BackendUnavailable, WorkbenchUsageError
from neuron_workbench.run.namespace import ResidentObjects, on_accelerator, tensors_in
from neuron_workbench.run.records import NotCompared, Run, RunError
from neuron_workbench.run.transport import (
    Loaded,
    Packed,
    arena_folder,
    dumps,
    loads,
    loads_leniently,
    receive,
    send,
    unloadable_in,
)

#: Environment variable set (to the target's name) in every worker process.
WORKER_ENV = "NEURON_WORKBENCH_WORKER"
#: Bytes of the memory-mapped record of the last dispatched op.
_OP_SLOT = 128
#: Seconds a fresh worker may take to import torch and install its device.
START_TIMEOUT_S = 180.0
_EXECUTOR_HINT = "run the cell with --executor inprocess"

# ---- requests ------------------------------------------------------------------------------------

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
    request: dict[str, Any],
    values: dict[str, Any],
    namespace: Mapping[str, Any],
    target: str,
    arena: str | None = None,
) -> Packed:
    """The run request with ``values``; a one-line usage error names what cannot be shipped.

    ``arena`` is a shared-memory folder for the tensors' bytes (a worker on this host), else they
    travel in the message (a Ray actor).
    """
    message = dict(request, values=values, anchor=_anchor(namespace))
    try:
        return dumps(message, arena)
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
            # ``aten::add.Tensor``: the same spelling as the native core's record
            raw = str(func.name()).encode()[: _OP_SLOT - 1]
            name = self._names[func] = raw.ljust(_OP_SLOT, b"\0")
        self._slot[0:_OP_SLOT] = name
        return func(*args, **(kwargs or {}))


# PyTorch wraps a mode's __torch_dispatch__ in a dynamo-disable guard that costs more than this mode
# does per op; the mode only writes bytes, so it runs as written.
_dispatch = _LastOpMode.__dict__["__torch_dispatch__"]
_LastOpMode.__torch_dispatch__ = getattr(_dispatch, "__wrapped__", _dispatch)  # type: ignore[method-assign]


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


def _exit_with_parent(folder: str) -> None:
    """End this process when the kernel that started it is gone, even in the middle of a cell.

    The worker's folder (on shared memory, with any arena not yet loaded) goes with it.
    """
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(0)

    threading.Thread(target=watch, name="neuron-workbench-parent-watch", daemon=True).start()


def _serve(fd: int, folder: str) -> None:
    """Worker main loop: set up, then answer run requests until the pipe closes."""
    import faulthandler

    conn = Connection(fd)
    _exit_with_parent(folder)
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
    send(conn, dumps(hello), {"id": init["id"]})
    while True:
        try:
            # the request id, the kernel's import path, environment, folder and torch threads as
            # of this cell, then the request
            head, data = receive(conn)
        except (EOFError, OSError):
            return
        where = head["where"]
        if where["sys_path"] != sys.path:
            sys.path[:] = where["sys_path"]
        _mirror_environment(where["environ"])
        if where["threads"] != torch.get_num_threads():
            torch.set_num_threads(where["threads"])
        if where["cwd"] != os.getcwd():
            with contextlib.suppress(OSError):
                os.chdir(where["cwd"])
        answer = answer_request(
            data,
            backend,
            slot,
            host="worker",
            load_hint=_EXECUTOR_HINT,
            hint=_EXECUTOR_HINT,
            arena=folder,
        )
        try:
            send(conn, answer, {"id": head["id"]})
        except OSError:  # the kernel is gone (or gave up on this request): nobody will load it
            answer.discard()
            return


def _record_last_op_natively(slot: mmap.mmap | None) -> bool:
    """Point the emulator's native core at ``slot`` (None: stop); False where it is not in use."""
    from neuron_workbench import emulator

    try:
        return bool(emulator.record_last_op(slot))
    except Exception:  # a core that cannot record: the dispatch mode does it
        return False


@contextlib.contextmanager
def _last_op_recorded(slot: mmap.mmap | bytearray) -> Iterator[None]:
    """Record each op the run dispatches into ``slot``.

    The emulator's native core writes the names itself where it is in use (into a worker's memory
    map); otherwise a dispatch mode does.
    """
    if isinstance(slot, mmap.mmap) and _record_last_op_natively(slot):
        try:
            yield
        finally:
            _record_last_op_natively(None)
    else:
        with _LastOpMode(slot):
            yield


def answer_request(
    data: Packed,
    backend: Backend,
    slot: mmap.mmap | bytearray,
    *,
    host: str,
    load_hint: str,
    hint: str,
    running: Callable[[dict[str, Any]], contextlib.AbstractContextManager[Any]] | None = None,
    arena: str | None = None,
) -> Packed:
    """A target process's packed answer to one packed run request (a worker's or a Ray actor's).

    The run, or a one-line ``usage_error``: what the cell reads could not be loaded here (with
    ``load_hint``), an option the target cannot honour, or the workbench failing around the cell
    (with ``hint``). The process keeps serving either way. ``running`` wraps the run itself;
    ``arena`` is the shared-memory folder for the answer's tensors (a worker).
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
            return _run_request(request, backend, slot, arena=arena)
    except WorkbenchUsageError as exc:  # an option the target cannot honour (--what-if)
        return dumps({"usage_error": str(exc)})
    except Exception as exc:  # the workbench failed around the cell: say so, keep serving
        return dumps(
            {"usage_error": f"the {backend.name} {host} failed: {_first_line(exc)}; {hint}"}
        )


def _run_request(
    request: dict[str, Any],
    backend: Backend,
    slot: mmap.mmap | bytearray,
    *,
    arena: str | None,
) -> Packed:
    from neuron_workbench.run.executor import RunSpec, execute, what_if_policy
    from neuron_workbench.run.library_state import restore_library_state

    options = request.get("backend_options")
    if options and options != backend.options():  # the cell's adapter options (--list-fallbacks)
        from neuron_workbench.backends import get_backend

        backend = get_backend(backend.name, **options)

    program = request["program"]
    # the cell's lines as the kernel numbers them (a %%neuron body starts at line 2)
    lines = request.get("lines") or program.source.splitlines(keepends=True)
    linecache.cache[program.filename] = (len(program.source), None, lines, program.filename)
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
    restore_library_state(request["values"].values())
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
        with what_if_policy(backend, request["what_if"]), _last_op_recorded(slot):
            run = execute(spec, backend, run_id="target")
    except KeyboardInterrupt:  # the cell (or a signal) interrupted the run: the kernel re-raises
        slot[0:_OP_SLOT] = bytes(_OP_SLOT)
        return dumps({"interrupted": True})
    slot[0:_OP_SLOT] = bytes(_OP_SLOT)
    from neuron_workbench.run.records import recorded

    run.extras = {name: recorded(value) for name, value in run.extras.items()}
    try:
        return dumps({"run": run}, arena)
    except Exception:
        _leave_out_what_cannot_be_sent(run, backend.name)
        return dumps({"run": run}, arena)


def _leave_out_what_cannot_be_sent(run: Run, target: str) -> None:
    """Replace each result that cannot be pickled by a :class:`NotCompared` naming why."""

    def why(value: Any) -> str | None:
        try:
            dumps(value).discard()
        except Exception as exc:
            return f"could not be sent back from the {target} worker process ({_first_line(exc)})"
        return None

    _not_compared(run, why)


def _not_compared(run: Run, why: Callable[[Any], str | None]) -> None:
    """Leave out of the comparison and of the commit every result ``why`` gives a reason for.

    Outputs become :class:`NotCompared` markers carrying the reason; such bindings and the last
    value are dropped (the kernel keeps its own values).
    """
    for name in list(run.outputs):
        reason = why(run.outputs[name])
        if reason is not None:
            run.outputs[name] = NotCompared(reason)
            run.bindings.pop(name, None)
    for name in list(run.bindings):
        if why(run.bindings[name]) is not None:
            del run.bindings[name]
    if why(run.last_value) is not None:
        run.last_value = None


# ---- the kernel side -----------------------------------------------------------------------------

_BOOT = (
    "import sys; sys.path[:0] = {paths!r}; "
    "from neuron_workbench.run.worker import _serve; _serve({fd}, {folder!r})"
)


class WorkerDied(Exception):
    """The worker process ended (or was ended) while running a cell."""


#: Ids of requests (and of the start-up hello) across every worker of this process.
_REQUEST_IDS = itertools.count(1)


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
        self._pending: Any = None
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
        """Spawn the process and wait until its device is ready (or known unavailable).

        Raises
        ------
        BackendUnavailable
            One line, when the process dies or does not answer within :data:`START_TIMEOUT_S`;
            the process and its files are gone then, and the next call starts afresh.
        """
        self.stop()
        started = time.perf_counter()
        # On shared memory where there is some: the request and answer arenas are written here.
        self._folder = tempfile.mkdtemp(
            prefix=f"neuron-workbench-{self.target}-", dir=arena_folder()
        )
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
        request_id = next(_REQUEST_IDS)
        self._conn.send_bytes(
            pickle.dumps(
                {
                    "sys_path": list(sys.path),
                    "cwd": os.getcwd(),
                    "target": self.target,
                    "id": request_id,
                }
            )
        )
        try:
            hello = self._receive(request_id, time.monotonic() + START_TIMEOUT_S).value
        except WorkerDied as exc:
            self.stop()
            raise BackendUnavailable(
                f"the {self.target} worker process failed to start: {exc}"
            ) from None
        except TimeoutError:
            self.stop()
            raise BackendUnavailable(
                f"the {self.target} worker process did not start within {START_TIMEOUT_S:g} s "
                "(importing torch and installing the device); it was ended, the next cell "
                "starts a new one"
            ) from None
        except BaseException:  # KeyboardInterrupt while starting: nothing half-started stays
            self.stop()
            raise
        self.availability = hello["availability"]
        self.info = hello["info"]
        self.cells_run = 0
        self.started_s = time.perf_counter() - started

    def stop(self) -> None:
        """End the process (if any) and remove its files."""
        self._pending = None
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
        self.availability = None
        self.info = None

    def ensure_started(self) -> None:
        """Start the worker unless it is running."""
        if not self.alive or self._conn is None or self.availability is None:
            self.start()

    # -- running --

    def _receive(self, request_id: int, deadline: float | None) -> Loaded:
        """The answer to ``request_id`` (loaded leniently); answers to other requests are dropped."""
        assert self._conn is not None and self._process is not None
        while True:
            wait = 0.25 if deadline is None else min(0.25, max(0.0, deadline - time.monotonic()))
            packed = None
            try:
                if self._conn.poll(wait):
                    head, packed = receive(self._conn)
            except (EOFError, OSError):
                pass  # the pipe closed: the process died; the poll below says how
            if packed is not None:
                if head.get("id") != request_id:
                    packed.discard()  # a late answer to a request given up on
                    continue
                try:
                    return loads_leniently(packed)
                except Exception as exc:  # an answer this process cannot rebuild at all
                    packed.discard()
                    raise WorkerDied(
                        f"its answer could not be loaded here ({_first_line(exc)})"
                    ) from None
            if self._process.poll() is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._process.wait(timeout=2)
                raise WorkerDied(f"target process died ({_signal_name(self._process.returncode)})")
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError

    @property
    def arena(self) -> str | None:
        """The folder where requests' tensors are written for this worker (its own folder)."""
        return self._folder

    def submit(self, message: Packed) -> int:
        """Send one packed request (the worker starts running it) and return its id."""
        self.ensure_started()
        assert self._conn is not None
        request_id = next(_REQUEST_IDS)
        where = {
            "sys_path": list(sys.path),
            "cwd": os.getcwd(),
            "threads": torch.get_num_threads(),
            "environ": dict(os.environ),
        }
        try:
            send(self._conn, message, {"id": request_id, "where": where})
        except BaseException:
            message.discard()
            self.stop()
            raise
        return request_id

    def collect(
        self, request_id: int, *, timeout: float | None, cell_filename: str, sent: float
    ) -> Loaded:
        """Wait for the answer to ``request_id``, sent at ``sent`` (``time.monotonic()``).

        Raises
        ------
        WorkerDied
            With the one-line message (signal or timeout, last op, cell line); the worker is gone.
        """
        deadline = None if timeout is None else sent + timeout
        try:
            answer = self._receive(request_id, deadline)
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

    def run(self, message: Packed, *, timeout: float | None, cell_filename: str) -> Loaded:
        """Send one packed request and return the worker's answer (see :meth:`collect`)."""
        sent = time.monotonic()
        request_id = self.submit(message)
        return self.collect(request_id, timeout=timeout, cell_filename=cell_filename, sent=sent)

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
    #: A started run goes on in the worker while the caller runs the reference (see :meth:`start`).
    concurrent = True

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
        return self.start(spec, backend, run_id=run_id, what_if=what_if).result()

    def start(
        self, spec: Any, backend: Backend, *, run_id: str, what_if: str | None = None
    ) -> PendingRun:
        """Send ``spec`` to ``backend``'s worker, which starts running it; the run comes later.

        What the cell reads is packed now, so the caller may go on (run the reference in this
        process) while the worker runs; :meth:`PendingRun.result` waits for the answer.
        """
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
            "lines": linecache.getlines(spec.program.filename),
        }
        arena = getattr(worker, "arena", None)
        message = pack_request(request, values, namespace, backend.name, arena)
        info = worker.info or backend.info()
        return PendingRun(self, worker, message, spec, run_id, info)

    def _finish(self, answer: Loaded, spec: Any, run_id: str, target: str) -> Run:
        value = answer.value
        if "interrupted" in value:
            raise KeyboardInterrupt
        if "usage_error" in value:
            raise WorkbenchUsageError(value["usage_error"])
        run: Run = value["run"]
        if answer.stood_in:
            _not_loadable_here(run, target)
        spec.captured[run_id] = _Printed(run.stdout, run.stderr)
        return run


class PendingRun:
    """A target run under way in a worker: :meth:`result` waits for it, :meth:`cancel` ends it."""

    def __init__(
        self,
        executor: WorkerExecutor,
        worker: Any,
        message: Packed,
        spec: Any,
        run_id: str,
        info: BackendInfo,
    ) -> None:
        self._executor = executor
        self._worker = worker
        self._spec = spec
        self._run_id = run_id
        self._info = info
        self._sent = time.monotonic()
        # A slot that cannot run a request in the background (a Ray actor) runs it in result().
        self._message: Packed | None = message
        self._request_id: int | None = None
        if hasattr(worker, "submit"):
            self._request_id = worker.submit(message)
            self._message = None

    def result(self) -> Run:
        """The finished run (an ERROR run naming the cause when the worker died or timed out)."""
        worker, executor = self._worker, self._executor
        filename = self._spec.program.filename
        try:
            if self._request_id is not None:
                answer = worker.collect(
                    self._request_id,
                    timeout=executor.timeout,
                    cell_filename=filename,
                    sent=self._sent,
                )
            else:
                assert self._message is not None
                answer = worker.run(self._message, timeout=executor.timeout, cell_filename=filename)
        except WorkerDied as exc:
            # The message names the cell line itself; no lineno, so reports do not repeat it.
            return Run(backend=self._info, error=RunError("TargetProcessDied", str(exc)))
        if not isinstance(answer, Loaded):
            answer = Loaded(answer, False)
        return executor._finish(answer, self._spec, self._run_id, self._info.name)

    def cancel(self) -> None:
        """Abandon the run; a worker running it is ended.

        The cell may never finish, and its side effects and answer must not reach the next cell,
        which starts a fresh worker.
        """
        if self._request_id is not None:
            self._worker.stop()
        elif self._message is not None:
            self._message.discard()


def _not_loadable_here(run: Run, target: str) -> None:
    """Results holding something this process cannot rebuild are not compared, nor committed."""

    def why(value: Any) -> str | None:
        stand_in = unloadable_in(value)
        if stand_in is None:
            return None
        return f"could not be loaded from the {target} worker process: {stand_in.reason}"

    _not_compared(run, why)


class _Printed:
    """What a worker run printed, replayable in the kernel."""

    def __init__(self, stdout: str, stderr: str) -> None:
        self.stdout = stdout
        self.stderr = stderr

    def show(self) -> None:
        sys.stdout.write(self.stdout)
        sys.stderr.write(self.stderr)
