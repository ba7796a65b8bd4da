"""The run request a target slot is sent, and how the target process answers it.

Both ends of the request: the kernel packs what a cell reads with :func:`pack_request` (shipped by
:mod:`~neuron_workbench.run.transport`: notebook functions and classes by value, importable modules
by reference, tensors by storage); a target process (a worker, see
:mod:`~neuron_workbench.run.worker_server`, or a Ray actor, see
:mod:`~neuron_workbench.run.ray_actor`) makes its device ready with :func:`device_ready` and answers
each request with :func:`answer_request`: the finished :class:`~.records.Run`, its tensors moved to
the host, or a one-line usage error. Results that cannot travel are reported as not compared.

While a run is under way the name of the last op, and whether it has ended, is kept in a small
buffer of :data:`LAST_OP_BYTES` (a worker's is a memory-mapped file, so it survives a crash): the
emulator's native core writes each op its device runs itself where it is in use (no Python per op,
nothing for host ops), otherwise a dispatch mode writes every dispatched op.
"""

from __future__ import annotations

import collections.abc
import contextlib
import csv
import functools
import gc
import io
import linecache
import mmap
import sys
import types
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import PurePath
from typing import Any

import torch

from neuron_workbench.backends.base import Availability, Backend
from neuron_workbench.dispatch_calls import call_op
from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.run.custom_ops import CUSTOM_OP_BEFORE_LOAD, remember_custom_op_definitions
from neuron_workbench.run.grad_scalers import ScalerMidStep, mid_step_message
from neuron_workbench.run.namespace import ResidentObjects
from neuron_workbench.run.notebook_handles import drain_made
from neuron_workbench.run.records import NotCompared, Run
from neuron_workbench.run.transport import (
    COMPILED_BEFORE_LOAD,
    Packed,
    dumps,
    loads_request,
    notebook_globals_cleared,
    remember_compile_requests,
    sending_error,
    share_compile_backends,
)
from neuron_workbench.sites import is_cell_filename, program_line
from neuron_workbench.worker_launch import LAST_OP_BYTES

#: In the last byte of the record of the last op run (:data:`LAST_OP_BYTES`) once that op returned.
OP_ENDED = 1
#: Seconds a fresh target process may take to import torch and make its device ready.
START_TIMEOUT_S = 180.0
#: What a cell that cannot be shipped to its target process is told to do instead.
EXECUTOR_HINT = "run the cell with --executor inprocess"

# ---- requests ------------------------------------------------------------------------------------

_ANCHOR_CODE = (lambda: None).__code__


def _anchor(namespace: Mapping[str, Any]) -> types.FunctionType:
    # A function whose globals are the namespace: cloudpickle gives every notebook function it
    # ships in one message the same globals dict, and this function's copy leads the worker to it.
    return types.FunctionType(_ANCHOR_CODE, namespace, "anchor")  # type: ignore[arg-type]


def _describe(value: Any) -> str:
    kind = type(value).__name__
    return f"a {kind}" if kind[0].lower() not in "aeiou" else f"an {kind}"


def read_last_op(slot: bytes | bytearray | mmap.mmap) -> tuple[str, bool]:
    """The op a last-op record names (``""`` for none), and whether that op had ended."""
    data = bytes(slot[:LAST_OP_BYTES])
    op = data.split(b"\0", 1)[0].decode(errors="replace")
    return op, len(data) == LAST_OP_BYTES and data[-1] == OP_ENDED


def where_it_was(op: str, ended: bool, line: int | None, filename: str = "") -> str:
    """Where a target process was: `` while running aten::op at cell line N``.

    `` at cell line N, after running aten::op`` when the op had ended (the process was in host
    code after it); ``""`` when nothing is known.

    Parameters
    ----------
    op : str
        The op the process ran last (``""`` when unknown).
    ended : bool
        Whether that op had returned.
    line : int or None
        The program's line the process was at.
    filename : str
        The program's compiled filename: a script's own path (``train.py``) names the line as
        Python's traceback does, ``at train.py, line N``; a cell's pseudo-file (or ``""``) reads
        ``at cell line N``.

    Returns
    -------
    str
        The text to append to the process's one-line error.
    """
    # a script has no cell: its line reads as the report names a script's error line
    script = PurePath(filename).name if filename and not is_cell_filename(filename) else None
    at = f" at {program_line(script, line)}" if line is not None else ""
    if not op:
        return at
    if ended:
        return f"{at}, after running {op}" if at else f" after running {op}"
    return f" while running {op}{at}"


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` of ``exc`` (one-line errors name their cause so)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


_CSV_WRITER = type(csv.writer(io.StringIO()))


def pack_request(
    request: dict[str, Any],
    values: dict[str, Any],
    namespace: Mapping[str, Any],
    target: str,
    arena: str | None = None,
    cuda_devices: Collection[int] = (),
) -> Packed:
    """The run request with ``values``; a one-line usage error names what cannot be shipped.

    ``arena`` is a shared-memory folder for the tensors' bytes (a worker on this host), else they
    travel in the message (a Ray actor). ``cuda_devices``: the ids of the device objects that
    stand for the cell's cuda device (:meth:`ResidentObjects.devices`), sent as cuda.
    """
    message = dict(request, values=values, anchor=_anchor(namespace))
    try:
        return dumps(message, arena, cuda_devices=cuda_devices, notebook_handles=True)
    except Exception as exc:
        for name in sorted(values):
            try:
                dumps({"anchor": message["anchor"], name: values[name]}, notebook_handles=True)
            except Exception as item_exc:
                if name == "get_ipython":  # what IPython makes of a %magic or !command line
                    raise WorkbenchUsageError(
                        f"the cell runs IPython itself (a %magic or !command line), which the "
                        f"{target} worker process does not have; move that line out of the "
                        f"%%neuron cell, or {EXECUTOR_HINT}"
                    ) from None
                if getattr(
                    values[name], "_torchdynamo_orig_callable", None
                ) is not None or COMPILED_BEFORE_LOAD in str(item_exc):
                    # compiled before the extension remembered what torch.compile was asked
                    raise WorkbenchUsageError(
                        f"{name!r} was compiled with torch.compile before %load_ext "
                        f"neuron_workbench, so it cannot be sent to the {target} worker process; "
                        f"run the cell that compiles it again, or {EXECUTOR_HINT}"
                    ) from None
                if CUSTOM_OP_BEFORE_LOAD in str(item_exc):
                    raise WorkbenchUsageError(
                        f"{name!r} was {CUSTOM_OP_BEFORE_LOAD}, so it cannot be sent to the "
                        f"{target} worker process; run the cell that defines it again, or "
                        f"{EXECUTOR_HINT}"
                    ) from None
                if type(values[name]) is _CSV_WRITER:
                    # it writes to a file it does not name: the file itself can travel
                    raise WorkbenchUsageError(
                        f"{name!r} (a csv writer) cannot be sent to the {target} worker process; "
                        f"make the writer in the %%neuron cell over the notebook's open file "
                        f"({name} = csv.writer(f)): each run then writes through its own, and the "
                        f"run that is not kept writes apart from the file"
                    ) from None
                if isinstance(values[name], collections.abc.Iterator) and not isinstance(
                    values[name],
                    io.IOBase,  # a file is an iterator too, but not drawn from here
                ):
                    # --executor inprocess would share it: both runs (and a FAIL's float64 oracle)
                    # would draw from it, each a different item, and compare those
                    raise WorkbenchUsageError(
                        f"{name!r} ({_describe(values[name])}) cannot be sent to the {target} "
                        f"worker process ({first_line(item_exc)}), and both runs cannot draw from "
                        f"one iterator; make it in the %%neuron cell ({name} = iter(...)), each "
                        f"run then draws from its own, or take a single item in a plain cell "
                        f"(batch = next({name})) and use it in the %%neuron cell"
                    ) from None
                if isinstance(item_exc, ScalerMidStep):  # --executor inprocess cannot help
                    raise WorkbenchUsageError(mid_step_message(name)) from None
                raise WorkbenchUsageError(
                    f"{name!r} ({_describe(values[name])}) cannot be sent to the {target} worker "
                    f"process ({first_line(item_exc)}); {EXECUTOR_HINT}"
                ) from None
        raise WorkbenchUsageError(
            f"the cell cannot be sent to the {target} worker process ({first_line(exc)}); "
            f"{EXECUTOR_HINT}"
        ) from None


# ---- the target process --------------------------------------------------------------------------


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
            raw = str(func.name()).encode()[: LAST_OP_BYTES - 2]
            name = self._names[func] = raw.ljust(LAST_OP_BYTES, b"\0")
        slot = self._slot
        slot[0:LAST_OP_BYTES] = name
        out = call_op(func, args, kwargs)
        slot[LAST_OP_BYTES - 1] = OP_ENDED
        return out


# PyTorch wraps a mode's __torch_dispatch__ in a dynamo-disable guard that costs more than this mode
# does per op; the mode only writes bytes, so it runs as written.
_dispatch = _LastOpMode.__dict__["__torch_dispatch__"]
_LastOpMode.__torch_dispatch__ = getattr(_dispatch, "__wrapped__", _dispatch)  # type: ignore[method-assign]


def device_ready(backend: Backend, host: str) -> dict[str, Any]:
    """Make ``backend``'s device ready in this target process: ``availability`` and ``info``.

    Run once when a worker or a Ray actor starts; a failure is reported as unavailability
    (naming the ``host`` kind), never raised, so the kernel gets one line.
    """
    try:
        availability = backend.availability()
        if availability:
            with backend.activated():  # install the emulated device before any backward pass
                pass
            from neuron_workbench.run import torch_settings

            torch_settings.keep_own()  # what the backend defaults (a TPU's matmul precision)
            # a function or module the cell compiles can come back, compiled again in the kernel
            # (after the device: an emulated torch.compile stays inside)
            remember_compile_requests()
            # a notebook's torch.library.custom_op a request brings is defined here again
            remember_custom_op_definitions(defines_received=True)
        return {"availability": availability, "info": backend.info() if availability else None}
    except Exception as exc:
        reason = f"{backend.name} {host}: {first_line(exc)}"
        return {"availability": Availability(False, reason), "info": None}


def refuse_input(host: str, hint: str) -> None:
    """Make ``input()`` in this target process fail with why, not with a bare end of file.

    A worker's standard input is ``/dev/null``: a cell's ``input()`` raised ``EOFError: EOF when
    reading a line``, which read as a failure of the device. It still raises ``EOFError`` (what a
    cell catching it expects), now saying that the ``host`` process has no standard input, and
    ``hint``. Run once when the process starts, in a process of the workbench's own only (it
    replaces ``builtins.input`` for the whole process).

    Parameters
    ----------
    host : str
        What the process is, as the message names it (``"worker"``).
    hint : str
        What to do instead (:data:`EXECUTOR_HINT`).
    """
    import builtins

    def refused(prompt: object = "", /) -> str:
        raise EOFError(f"input() cannot ask: the {host} process has no standard input; {hint}")

    builtins.input = refused


def _record_last_op_natively(slot: mmap.mmap | None) -> bool:
    """Point the emulator's native core at ``slot`` (None: stop); False where it is not in use."""
    from neuron_workbench import emulator

    try:
        return bool(emulator.record_last_op(slot))
    except Exception:  # a core that cannot record: the dispatch mode does it
        return False


@contextlib.contextmanager
def _last_op_recorded(slot: mmap.mmap | bytearray) -> Iterator[None]:
    """Record the run's ops into ``slot``, so a crash report can name the op it died in.

    The emulator's native core writes the names itself where it is in use (into a worker's memory
    map): each op its device runs, and custom ops, not host ops. Otherwise a dispatch mode writes
    every op the run dispatches.
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
    printed: str | None = None,
) -> Packed:
    """A target process's packed answer to one packed run request (a worker's or a Ray actor's).

    The run, or a one-line ``usage_error``: what the cell reads could not be loaded here (with
    ``load_hint``), an option the target cannot honour, or the workbench failing around the cell
    (with ``hint``). The process keeps serving either way. ``running`` wraps the run itself;
    ``arena`` is the shared-memory folder for the answer's tensors (a worker). ``printed``: a folder
    where the run's fds 1 and 2 point meanwhile (a worker, whose fds are the kernel's or the
    terminal's): what the run writes below Python is its output, not shown next to the reference's.

    What the request held (the cell's whole state here, and the run) stays alive after the answer
    until :func:`release_answered` (or the next request): freeing it takes a while, which a worker
    spends after it has sent the answer, not before.
    """
    release_answered()  # the notebook's globals too: the request's functions are rebuilt over them
    share_compile_backends()  # a compiled model's code compiled in one cell serves the next
    drain_made()  # stand-ins of the notebook's files a request that failed to load left
    try:
        loaded = loads_request(data)
        request = loaded.value
    except Exception as exc:
        return dumps(
            {
                "usage_error": f"the {backend.name} {host} could not load what the cell reads "
                f"({first_line(exc)}); {load_hint}"
            }
        )
    _answered.append(request)
    if "held_copies" in request:  # the kernel explains a failure with what the last run kept
        return dumps({"copies": _held.get(request["held_copies"], {})}, arena)
    try:
        with running(request) if running is not None else contextlib.nullcontext():
            return _run_request(
                request, backend, slot, arena=arena, defined=loaded.definitions, printed=printed
            )
    except WorkbenchUsageError as exc:  # an option the target cannot honour (--what-if)
        return dumps({"usage_error": str(exc)})
    except Exception as exc:  # the workbench failed around the cell: say so, keep serving
        return dumps(
            {"usage_error": f"the {backend.name} {host} failed: {first_line(exc)}; {hint}"}
        )


def _run_request(
    request: dict[str, Any],
    backend: Backend,
    slot: mmap.mmap | bytearray,
    *,
    arena: str | None,
    defined: Collection[Any] = (),
    printed: str | None = None,
) -> Packed:
    from neuron_workbench.run import (
        logging_setup,
        numpy_settings,
        pandas_settings,
        torch_settings,
        warning_filters,
    )
    from neuron_workbench.run.executor import RunSpec, capture_text, execute, what_if_policy
    from neuron_workbench.run.library_state import (
        apply_module_hooks,
        apply_registrations,
        restore_library_state,
    )
    from neuron_workbench.run.module_versions import import_submodules, take_assigned_values

    _held.clear()  # the previous run's evidence goes before this run needs the memory
    if backend.memory_stats().current_bytes:
        # an earlier cell's device tensors kept by reference cycles (a traceback's frames) go
        # now, not when the collector next runs: the run starts on an empty device, as its peak
        # memory (nothing ran on the device, or how much did) is read
        gc.collect()
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
    apply_registrations(request.get("library_registrations"))
    apply_module_hooks(request.get("module_hooks"))
    torch_settings.apply(request.get("torch_settings"))
    logging_setup.apply(request.get("logging"))
    warning_filters.apply(request.get("warnings"))
    numpy_settings.apply(request.get("numpy_settings"))
    pandas_settings.apply(request.get("pandas_options"))
    # before the settings: config.train.LR = 0.5 is set on the submodule imported here
    import_submodules(request.get("submodules"))
    take_assigned_values(request.get("module_values"))
    resident = ResidentObjects()
    for name in request["force"]:
        if name in namespace:
            resident.add(namespace[name])
    spec = RunSpec(
        program,
        namespace,
        seed=request["seed"],
        random_state=request.get("random_state"),
        hidden=request["hidden"],
        resident=resident,
        # fds 1 and 2 to files while it runs: os.system's output is the run's (its record)
        capture=functools.partial(capture_text, below=printed),
        instruments=request["instruments"],
        rng_on_cpu=request["rng_on_cpu"],
        steps=request["steps"],
        isolate_inputs=False,
        ref_precision=request["ref_precision"],
        kept_run=request.get("kept_run"),
        default_device=request.get("default_device"),
        notebook_temp=request.get("notebook_temp"),
        originals=request.get("originals"),
        # the kernel sent the names sharing state with the cell's: no walk to find them again
        inputs=request["values"].keys(),
        # the namespace is dropped after the answer (release_answered), or stays while a thread
        # the cell started reads it: that thread sees what the cell bound, not the names before it
        restore_namespace=False,
        entropy=request.get("entropy"),
    )
    try:
        with (
            what_if_policy(backend, request["what_if"]),
            _last_op_recorded(slot),
            main_module_over(namespace, defined),
        ):
            run = execute(spec, backend, run_id=request.get("run_id", "target"))
    except KeyboardInterrupt:  # the cell (or a signal) interrupted the run: the kernel re-raises
        slot[0:LAST_OP_BYTES] = bytes(LAST_OP_BYTES)
        return dumps({"interrupted": True})
    slot[0:LAST_OP_BYTES] = bytes(LAST_OP_BYTES)
    from neuron_workbench.run.records import recorded

    run.extras = {name: recorded(value) for name, value in run.extras.items()}
    _answered.append(run)
    _hold_copies(run)
    host_devices = (backend.device_type,) if backend.memory_on_host() else ()
    try:
        return dumps({"run": run}, arena, host_devices)
    except Exception:
        _leave_out_what_cannot_be_sent(run, backend.name)
        return dumps({"run": run}, arena, host_devices)


def _namespace_module(
    namespace: dict[str, Any], defined: Mapping[str, Any] | None = None
) -> types.ModuleType:
    """A module whose attributes are ``namespace``'s names, as IPython's ``__main__`` in a kernel.

    A real module (``inspect.ismodule``), whose own ``__spec__``, ``__loader__`` and ``__package__``
    (None) answer where the namespace has none (``multiprocessing``'s spawn reads
    ``__main__.__spec__``); a module's ``__dict__`` cannot be replaced, so it reads and writes the
    namespace instead. A name the namespace lacks is looked up in ``defined`` (the notebook's
    classes and functions by name), as the kernel's module holds every one the notebook defined.
    """
    defined = defined or {}

    class NamespaceModule(types.ModuleType):
        @property  # type: ignore[misc]
        def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
            return namespace

        def __getattr__(self, name: str) -> Any:
            try:
                return namespace[name]
            except KeyError:
                if name in defined:
                    return defined[name]
                raise AttributeError(
                    f"module {self.__name__!r} has no attribute {name!r}"
                ) from None

        def __setattr__(self, name: str, value: Any) -> None:
            namespace[name] = value

        def __delattr__(self, name: str) -> None:
            try:
                del namespace[name]
            except KeyError:
                raise AttributeError(name) from None

    return NamespaceModule(namespace.get("__name__", "__main__"))


def _by_name(defined: Collection[Any], module: str) -> dict[str, Any]:
    """``defined``'s top-level classes and functions of ``module``, by name.

    A name two of them share is left out: which one the notebook's name means now is not known here
    (pickle says it cannot find it, as before).
    """
    found: dict[str, Any] = {}
    shared: set[str] = set()
    for value in defined:
        name = getattr(value, "__qualname__", None)
        if getattr(value, "__module__", None) != module or not isinstance(name, str):
            continue
        if not name.isidentifier():  # a method, a nested class or function, a lambda
            continue
        if found.setdefault(name, value) is not value:
            shared.add(name)
    return {name: value for name, value in found.items() if name not in shared}


@contextlib.contextmanager
def main_module_over(namespace: dict[str, Any], defined: Collection[Any] = ()) -> Iterator[None]:
    """For the run, the module named by the namespace's ``__name__`` is the namespace, as in a kernel.

    ``defined``: the notebook's classes and functions a request carried by value. The module finds
    them by name too, where the namespace (the names the cell reads) lacks them: ``torch.save`` and
    pickle look a model's class up in ``__main__`` also when the cell never names it.

    (A script run in the command line's own process needs it too: ``multiprocessing``'s spawn and
    pickle find the script's classes through ``sys.modules["__main__"]``.)

    TorchDynamo reads the globals of a function it inlines (a notebook model's ``forward`` called
    from a compiled training step) through ``sys.modules[f.__globals__["__name__"]]``; in a
    kernel that is IPython's user module, in this process it would be the process's own
    ``__main__`` ("module '__main__' has no attribute 'F'").
    """
    name = namespace["__name__"]
    module = _namespace_module(namespace, _by_name(defined, name))
    saved = sys.modules.get(name)
    sys.modules[name] = module  # type: ignore[assignment]
    try:
        yield
    finally:
        if saved is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = saved


#: The last request and its run, kept past the answer until :func:`release_answered`.
_answered: list[Any] = []


def release_answered() -> None:
    """Free what the last answered request held (its values, its run, the notebook's globals).

    The run's values live in the notebook's globals here (:func:`notebook_globals_cleared`) until
    then: a worker frees them after sending the answer, while the kernel reads it (or later, once
    no thread the cell started runs code over them).
    """
    _answered.clear()
    notebook_globals_cleared()


#: Host copies the last run's records left here (by token), until the next run request.
_held: dict[str, Any] = {}


def _hold_copies(run: Run) -> None:
    """Keep the bulky evidence of ``run``'s records here; the answer goes without it.

    A record offering ``hold_copies(token)`` (the optimizer's gradients and second moments at each
    step) is read only to explain a failing output: the kernel fetches it then, with a
    ``{"held_copies": token}`` request, before this process runs anything else (which clears
    them).
    """
    for record in run.extras.values():
        hold = getattr(record, "hold_copies", None)
        if callable(hold):
            token = uuid.uuid4().hex
            _held[token] = hold(token)


def _leave_out_what_cannot_be_sent(run: Run, target: str) -> None:
    """Replace each result that cannot be pickled by a :class:`NotCompared` naming why.

    A closed file (``with open(...) as f`` in the cell) or a generator is left out without a word:
    nothing in it is compared, and the reference's yields no output either.
    """
    for name in list(run.outputs):
        value = run.outputs[name]
        if _holds_nothing_compared(value) and sending_error(value) is not None:
            # it was "not compared: could not be sent back (Cannot pickle closed files)"
            del run.outputs[name]
            if run.bindings.pop(name, None) is not None:
                run.left_behind.append(name)

    def why(value: Any) -> str | None:
        exc = sending_error(value)
        if exc is None:
            return None
        return f"could not be sent back from the {target} worker process ({first_line(exc)})"

    not_compared(run, why)


def _holds_nothing_compared(value: Any) -> bool:
    """Whether ``value`` is a closed file or a generator: values the comparison never looks into."""
    if isinstance(value, io.IOBase):
        return value.closed
    return isinstance(value, types.GeneratorType | types.AsyncGeneratorType | types.CoroutineType)


def not_compared(run: Run, why: Callable[[Any], str | None]) -> None:
    """Leave out of the comparison and of the commit every result ``why`` gives a reason for.

    Outputs become :class:`NotCompared` markers carrying the reason; such bindings and the last
    value are dropped (the kernel keeps its own values).
    """
    for name in list(run.outputs):
        reason = why(run.outputs[name])
        if reason is not None:
            run.outputs[name] = NotCompared(reason)
            if name in run.bindings:
                del run.bindings[name]
                run.left_behind.append(name)
    for name in list(run.bindings):
        if why(run.bindings[name]) is not None:
            del run.bindings[name]
            run.left_behind.append(name)
    if why(run.last_value) is not None:
        run.last_value = None
