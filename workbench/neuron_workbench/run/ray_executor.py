"""Run a cell's target side in a Ray actor on a cluster node that has the target's device (``--on``).

The local ``worker`` executor's protocol, shipped through Ray: the kernel packs the same run request
(:func:`~neuron_workbench.run.worker.pack_request`), a :class:`TargetActor` placed on a node with
the target's resource (``neuron_cores`` for neuron, ``TPU`` for tpu, ``GPU`` for cuda) answers it
with the worker's own code (``answer_request``), and the finished :class:`~.records.Run` comes back
with its tensors on the host. The reference stays in the kernel.

Ray is an optional dependency (``pip install neuron-workbench[ray]``) and is imported only when a
cell names a cluster: this module itself imports nothing of Ray at import time.

- ``ray://HOST:PORT`` connects this kernel to that cluster (Ray Client) on first use;
  ``ray`` means the cluster the kernel already connected to with ``ray.init(...)``.
- A target no node can hold is a one-line error: at once when no alive node has the resource,
  after :attr:`RayOptions.ready_timeout_s` (30 s) when the actor still could not be placed.
- The notebook's own modules (imported from the kernel's working folder or a folder it added to
  ``sys.path``, outside site-packages) travel with the actor: their ``.py`` files are written to a
  folder on the node that leads the actor's ``sys.path`` (Ray takes local ``py_modules`` only for a
  whole job). A changed set (a new module, an edited file) starts a fresh actor. Anything else
  (data files, packages to install) goes in ``RayOptions.runtime_env``, handed to ``ray.init`` when
  the workbench connects (``working_dir``, ``py_modules``, ``pip``); its ``env_vars`` also reach
  every actor.
- An actor that dies mid-run (``ray.kill``, a signal, the node going away) or overruns ``--timeout``
  gives an ERROR run naming the last op and cell line it was seen running; the next cell gets a
  fresh actor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pickle
import sys
import threading
import time
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from neuron_workbench.backends.base import Availability, Backend, BackendInfo
from neuron_workbench.errors import BackendUnavailable, WorkbenchUsageError
from neuron_workbench.run.records import Run
from neuron_workbench.run.transport import Packed, dumps, loads, loads_leniently
from neuron_workbench.run.worker import (
    _OP_SLOT,
    START_TIMEOUT_S,
    WORKER_ENV,
    WorkerDied,
    WorkerExecutor,
    WorkerPool,
    WorkerRow,
    _first_line,
    answer_request,
    device_ready,
)

#: What a missing Ray installation is told to run.
INSTALL_HINT = "pip install neuron-workbench[ray]"
#: The resource an actor of each target asks for (Ray's names for AWS Neuron cores and TPUs).
DEFAULT_RESOURCES: dict[str, dict[str, float]] = {
    "neuron": {"neuron_cores": 1},
    "tpu": {"TPU": 1},
    "cuda": {"GPU": 1},
    "cpu": {},
}
#: Seconds an actor may take to be placed and install its device before the cell is refused.
READY_TIMEOUT_S = 30.0
#: Connections tried to a ``ray://`` address when its server fails as it starts.
CONNECT_ATTEMPTS = 3
#: The most source the notebook's own modules may add to an actor's start (bytes).
MODULES_LIMIT_BYTES = 16 * 2**20
#: Seconds between the kernel's looks at what a running actor is doing (last op, cell line).
_PROBE_EVERY_S = 0.5
_HINT = "run the cell without --on"


def parse_cluster(text: str | None) -> str:
    """``""`` (run here), ``"ray"`` (the connected cluster) or a ``ray://HOST:PORT`` address.

    Raises
    ------
    WorkbenchUsageError
        For anything else.
    """
    value = (text or "").strip()
    if value.lower() in ("", "local", "none"):
        return ""
    if value.lower() == "ray":
        return "ray"
    if value.lower().startswith("ray://") and len(value) > len("ray://"):
        return value
    raise WorkbenchUsageError(
        f"--on takes ray://HOST:PORT, ray (the cluster this kernel connected to with ray.init) "
        f"or local, not {value!r}"
    )


@dataclass(frozen=True)
class RayOptions:
    """How target actors are placed and set up on a Ray cluster.

    Attributes
    ----------
    resources : dict
        Target → Ray resources its actor asks for, merged over :data:`DEFAULT_RESOURCES`
        (``{"neuron": {"neuron_cores": 2}}``). ``GPU`` and ``CPU`` become ``num_gpus``/``num_cpus``.
    ready_timeout_s : float
        Seconds the actor may take to be placed and ready before the cell gets a one-line error.
    runtime_env : dict
        The job's ``runtime_env``, given to ``ray.init`` when the workbench connects to a
        ``ray://`` address (``{"working_dir": "."}`` ships data files too, ``{"pip": [...]}``);
        its ``env_vars`` are also set in each actor.
    ship_local_modules : bool
        Ship the ``.py`` files of the notebook's own modules (see the module docstring).
    num_cpus : float or None
        CPUs each actor holds while it lives; None keeps Ray's default for actors (one to be
        placed, none held), so the accelerator resource alone decides where it goes.
    """

    resources: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    ready_timeout_s: float = READY_TIMEOUT_S
    runtime_env: Mapping[str, Any] = field(default_factory=dict)
    ship_local_modules: bool = True
    num_cpus: float | None = None

    def resources_for(self, target: str) -> dict[str, float]:
        """The resources ``target``'s actor asks for."""
        merged = dict(DEFAULT_RESOURCES.get(target, {}))
        merged.update(self.resources.get(target, {}))
        return {name: float(amount) for name, amount in merged.items() if amount}

    def validate(self) -> None:
        """Raise :class:`WorkbenchUsageError` for settings no actor could be placed with."""
        if self.ready_timeout_s <= 0:
            raise WorkbenchUsageError("the Ray ready timeout must be a positive number of seconds")
        for target, wanted in self.resources.items():
            if not isinstance(wanted, Mapping) or not all(
                isinstance(v, (int, float)) and v >= 0 for v in wanted.values()
            ):
                raise WorkbenchUsageError(
                    f"Ray resources for {target!r} must map resource names to amounts, "
                    f"e.g. {{'neuron_cores': 1}}"
                )


# ---- connecting ----------------------------------------------------------------------------------

#: The ``ray://`` address this module connected the process to (None: it connected nowhere).
_connected: str | None = None
_connect_lock = threading.Lock()


def connected_address() -> str | None:
    """The ``ray://`` address this process connected to through :func:`connect`, if still connected."""
    ray = sys.modules.get("ray")
    return _connected if ray is not None and ray.is_initialized() else None


def import_ray() -> Any:
    """The ``ray`` module, or a one-line usage error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise WorkbenchUsageError(
            f"running a target on a Ray cluster needs Ray: {INSTALL_HINT}"
        ) from None
    return ray


def connect(cluster: str, runtime_env: Mapping[str, Any] | None = None) -> Any:
    """The ``ray`` module, connected to ``cluster`` (``ray`` or ``ray://HOST:PORT``).

    ``runtime_env`` is the job's, used when this call connects.

    Raises
    ------
    WorkbenchUsageError
        Ray missing, no connected cluster for ``ray``, another cluster connected, or the address
        unreachable.
    """
    global _connected
    if cluster == "ray":
        ray = sys.modules.get("ray")
        if ray is None or not ray.is_initialized():
            if ray is None:
                import importlib.util

                if importlib.util.find_spec("ray") is None:
                    import_ray()  # says how to install it
            raise WorkbenchUsageError(
                "--on ray runs the target on the Ray cluster this kernel connected to with "
                "ray.init(...), and it is connected to none; call ray.init first or give "
                "--on ray://HOST:PORT"
            )
        return ray
    ray = import_ray()
    with _connect_lock:
        if ray.is_initialized():
            if _connected == cluster:
                return ray
            raise WorkbenchUsageError(
                f"this kernel is already connected to a Ray cluster ({_connected or 'by ray.init'}); "
                f"use --on ray to run there, or ray.shutdown() before --on {cluster}"
            )
        for attempt in range(CONNECT_ATTEMPTS):
            try:
                ray.init(
                    cluster,
                    logging_level=logging.WARNING,
                    log_to_driver=False,
                    runtime_env=dict(runtime_env) if runtime_env else None,
                )
                break
            except Exception as exc:
                with contextlib.suppress(Exception):
                    ray.shutdown()
                # Ray Client's server process for this client can die as it starts (a gRPC fork
                # race, ray-project/ray#63202): "Initialization failure from server"; try again.
                if isinstance(exc, ConnectionAbortedError) and attempt + 1 < CONNECT_ATTEMPTS:
                    continue
                raise WorkbenchUsageError(
                    f"could not connect to the Ray cluster at {cluster}: {_first_line(exc)}"
                ) from None
        _connected = cluster
        return ray


def _placement(resources: dict[str, float], num_cpus: float | None) -> dict[str, Any]:
    """``actor.options(...)`` arguments: GPU and CPU have keywords of their own in Ray."""
    custom = {k: v for k, v in resources.items() if k not in ("GPU", "CPU")}
    options: dict[str, Any] = {}
    cpus = resources.get("CPU", num_cpus)
    if cpus is not None:
        options["num_cpus"] = cpus
    if "GPU" in resources:
        options["num_gpus"] = resources["GPU"]
    if custom:
        options["resources"] = custom
    return options


def _fits(node: Mapping[str, Any], resources: dict[str, float]) -> bool:
    have = node.get("Resources") or {}
    return all(float(have.get(name, 0.0)) >= amount for name, amount in resources.items())


def _describe(resources: dict[str, float]) -> str:
    return ", ".join(f"{name}: {amount:g}" for name, amount in sorted(resources.items())) or "none"


def local_modules(folders: list[str] | None = None) -> list[str]:
    """Files and package folders of the notebook's own modules, to ship to actors.

    A top-level module counts when it was imported from the working folder or another folder on
    ``sys.path`` that is not part of an installation (site-packages, the interpreter's prefix), and
    it is not the workbench itself.
    """
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    roots = []
    for folder in folders if folders is not None else [os.getcwd(), *sys.path]:
        path = os.path.realpath(folder or os.getcwd())
        if (
            os.path.isdir(path)
            and "site-packages" not in path
            and "dist-packages" not in path
            and not any(path == p or path.startswith(p + os.sep) for p in prefixes)
            and path not in roots
        ):
            roots.append(path)
    found = set()
    for name, module in list(sys.modules.items()):
        if "." in name or name in ("__main__", "neuron_workbench") or module is None:
            continue
        file = getattr(module, "__file__", None)
        if not file:
            continue
        paths = list(getattr(module, "__path__", None) or [])
        where = os.path.realpath(paths[0] if len(paths) == 1 else file)
        if not paths and not where.endswith(".py"):
            continue  # a compiled extension module: its source cannot travel
        if os.path.dirname(where) in roots:
            found.add(where)
    return sorted(found)


def module_sources(paths: list[str]) -> dict[str, bytes]:
    """Relative path → source of every ``.py`` file of ``paths`` (modules and package folders).

    Raises
    ------
    WorkbenchUsageError
        When they add up to more than :data:`MODULES_LIMIT_BYTES`.
    """
    sources: dict[str, bytes] = {}
    for path in paths:
        if os.path.isdir(path):
            top = os.path.dirname(path)
            for folder, dirs, files in os.walk(path):
                dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
                for name in files:
                    if name.endswith(".py"):
                        full = os.path.join(folder, name)
                        with open(full, "rb") as handle:
                            sources[os.path.relpath(full, top)] = handle.read()
        else:
            with open(path, "rb") as handle:
                sources[os.path.basename(path)] = handle.read()
    size = sum(len(source) for source in sources.values())
    if size > MODULES_LIMIT_BYTES:
        raise WorkbenchUsageError(
            f"the notebook's own modules are {size / 2**20:.0f} MiB of source, more than an actor "
            f"takes ({MODULES_LIMIT_BYTES / 2**20:.0f} MiB); install them on the cluster's nodes "
            "or ship them with NeuronMagics.ray_runtime_env"
        )
    return sources


def _fingerprint(paths: list[str]) -> tuple[tuple[str, float], ...]:
    marks = []
    for path in paths:
        newest = 0.0
        with contextlib.suppress(OSError):
            newest = os.stat(path).st_mtime
            if os.path.isdir(path):
                for folder, _, files in os.walk(path):
                    for name in files:
                        if name.endswith(".py"):
                            with contextlib.suppress(OSError):
                                newest = max(newest, os.stat(os.path.join(folder, name)).st_mtime)
        marks.append((path, newest))
    return tuple(marks)


# ---- the actor (runs on the cluster) -------------------------------------------------------------


class TargetActor:
    """Owns the target device on a Ray node and answers run requests (wrapped by ``ray.remote``).

    Creating it only unpacks the notebook's modules; :meth:`hello` sets the device up, so the kernel
    can tell a placement that does not happen from a slow start.

    Methods run in a small thread pool (``max_concurrency=2``): :meth:`probe` answers while
    :meth:`run` runs, so the kernel knows the last op and cell line should the actor die.
    """

    def __init__(self, target: str, modules: dict[str, bytes] | None = None) -> None:
        import atexit
        import shutil
        import tempfile

        if modules:  # the notebook's own modules, first on the import path
            folder = tempfile.mkdtemp(prefix="neuron-workbench-modules-")
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            for relative, source in modules.items():
                path = os.path.join(folder, relative)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as handle:
                    handle.write(source)
            sys.path.insert(0, folder)
        self._target = target
        self._slot = bytearray(_OP_SLOT)
        self._running: tuple[int, str] | None = None
        self._backend: Backend | None = None
        self._hello: tuple[bytes, list[bytes]] | None = None

    def placed(self) -> int:
        """The actor's pid: it was placed on a node and its process runs."""
        return os.getpid()

    def hello(self) -> tuple[bytes, list[bytes]]:
        """Set up the device; the actor's pid, node, workbench version, device availability, info."""
        if self._hello is not None:
            return self._hello
        import builtins
        import socket

        if not hasattr(builtins, "display"):
            # IPython puts display() among the builtins; here a displayed object is printed instead.
            builtins.display = lambda *objects, **kwargs: print(*objects)  # type: ignore[attr-defined]
        from neuron_workbench.backends import get_backend

        backend = self._backend = get_backend(self._target)
        hello: dict[str, Any] = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "version": package_version(),
        }
        with contextlib.suppress(Exception):
            import ray

            hello["node"] = ray.util.get_node_ip_address()
        hello.update(device_ready(backend, "actor"))
        self._hello = _flatten(dumps(hello))
        return self._hello

    def run(self, data: bytes, buffers: list[list[bytes]], where: dict[str, Any]) -> Any:
        """Answer one packed run request as the worker process does (a packed answer)."""
        if where.get("cwd") and where["cwd"] != os.getcwd() and os.path.isdir(where["cwd"]):
            with contextlib.suppress(OSError):
                os.chdir(where["cwd"])  # the same folder exists here (a cluster on this host)
        self.hello()
        assert self._backend is not None
        answer = answer_request(
            _unflatten((data, buffers)),
            self._backend,
            self._slot,
            host="actor",
            load_hint="install the module on the cluster's nodes or ship it with "
            "NeuronMagics.ray_runtime_env, or run the cell without --on",
            hint=_HINT,
            running=self._running_cell,
        )
        return _flatten(answer)

    @contextlib.contextmanager
    def _running_cell(self, request: dict[str, Any]) -> Iterator[None]:
        """While the request runs, :meth:`probe` knows the thread and the cell's file."""
        self._running = (threading.get_ident(), request["program"].filename)
        try:
            yield
        finally:
            self._running = None

    def probe(self) -> tuple[str, int | None]:
        """The op the running cell dispatched last, and the cell line it is at (or None)."""
        op = bytes(self._slot).split(b"\0", 1)[0].decode(errors="replace")
        running = self._running
        if running is None:
            return op, None
        frame: types.FrameType | None = sys._current_frames().get(running[0])
        line = None
        while frame is not None:
            if frame.f_code.co_filename == running[1] and frame.f_code.co_name == "<module>":
                line = frame.f_lineno
            frame = frame.f_back
        return op, line


def package_version() -> str:
    """The installed neuron-workbench version (``unknown`` without package metadata)."""
    from importlib import metadata

    try:
        return metadata.version("neuron-workbench")
    except metadata.PackageNotFoundError:
        return "unknown"


def _flatten(packed: Packed) -> tuple[bytes, list[list[bytes]]]:
    # in-band only: the actor may be on another host, where no shared-memory arena reaches
    assert packed.arena is None
    return packed.data, [
        [bytes(buffer.raw()) for buffer in packed.buffers],
        [bytes(buffer.raw()) for buffer in packed.storages],
    ]


def _unflatten(message: tuple[bytes, list[list[bytes]]]) -> Packed:
    data, (buffers, storages) = message
    # writable copies: tensors rebuilt on them are used in place
    return Packed(
        data,
        [pickle.PickleBuffer(bytearray(buffer)) for buffer in buffers],
        [pickle.PickleBuffer(bytearray(buffer)) for buffer in storages],
    )


# ---- the kernel side -----------------------------------------------------------------------------


class RayTarget:
    """One actor that owns ``target``'s device on the cluster; created lazily, again after a death.

    Quacks like :class:`~neuron_workbench.run.worker.TargetWorker`, so
    :class:`~neuron_workbench.run.worker.WorkerExecutor` drives it unchanged.
    """

    def __init__(self, target: str, cluster: str, options: RayOptions) -> None:
        self.target = target
        self.cluster = cluster
        self.options = options
        self.cells_run = 0
        self.info: BackendInfo | None = None
        self.availability: Availability | None = None
        self.pid: int | None = None
        self.node: str | None = None
        self.started_s: float | None = None
        self._actor: Any = None
        self._modules: tuple[tuple[str, float], ...] = ()
        self._placed: Any = None

    @property
    def where(self) -> str:
        """Where the actor runs, as reports name it: the address, or ``ray node IP``."""
        if self.cluster != "ray":
            return self.cluster
        return f"ray node {self.node}" if self.node else "ray"

    @property
    def alive(self) -> bool:
        """Whether this kernel holds a started actor (Ray decides whether it still runs)."""
        return self._actor is not None

    def memory_bytes(self) -> int | None:
        """Not measured for a remote actor."""
        return None

    def ensure_started(self) -> None:
        """Start the actor unless one runs with the current settings and local modules."""
        ray = sys.modules.get("ray")
        if self._actor is not None and (ray is None or not ray.is_initialized()):
            self._actor = None  # the kernel disconnected (ray.shutdown): the handle is gone
        modules = self._local_modules()
        if (
            self._actor is not None
            and self._placed == self._placement_key()
            and _fingerprint(modules) == self._modules
        ):
            return
        self.start(modules)

    def _placement_key(self) -> Any:
        # what the actor was created with: other settings need another actor
        return (
            sorted(self.options.resources_for(self.target).items()),
            self.options.num_cpus,
            repr(self._runtime_env()),
        )

    def _local_modules(self) -> list[str]:
        return local_modules() if self.options.ship_local_modules else []

    def _runtime_env(self) -> dict[str, Any]:
        """The actor's own ``runtime_env``: the worker marker and the job's ``env_vars``."""
        env_vars = dict(self.options.runtime_env.get("env_vars") or {})
        return {"env_vars": {**env_vars, WORKER_ENV: self.target}}

    def start(self, modules: list[str] | None = None) -> None:
        """Place a fresh actor on a node with the target's resource and wait until it is ready.

        Raises
        ------
        BackendUnavailable
            No alive node has the resource, or the actor was not ready within the ready timeout.
        """
        started = time.perf_counter()
        ray = connect(self.cluster, self.options.runtime_env)
        modules = self._local_modules() if modules is None else modules
        sources = module_sources(modules)
        need = self.options.resources_for(self.target)
        if self.options.num_cpus:
            need.setdefault("CPU", float(self.options.num_cpus))
        where = self.cluster if self.cluster != "ray" else "the connected Ray cluster"
        try:
            nodes = [node for node in ray.nodes() if node.get("Alive")]
        except Exception as exc:
            raise BackendUnavailable(
                f"could not list the nodes of {where}: {_first_line(exc)}"
            ) from None
        if need and not any(_fits(node, need) for node in nodes):
            raise BackendUnavailable(
                f"no node of {where} has {_describe(need)} for the {self.target} target "
                f"({len(nodes)} node(s) alive); start a node with that resource or change "
                "NeuronMagics.ray_resources"
            )
        self.stop()  # only now: a cell the cluster cannot serve leaves the running actor be
        actor_class = ray.remote(TargetActor)
        try:
            actor = actor_class.options(
                max_concurrency=2,
                max_restarts=0,
                runtime_env=self._runtime_env(),
                **_placement(need, self.options.num_cpus),
            ).remote(self.target, sources)
        except Exception as exc:
            raise BackendUnavailable(
                f"could not create the {self.target} actor on {where}: {_first_line(exc)}"
            ) from None
        timeout = self.options.ready_timeout_s
        try:
            # placed on a node and running: a resource in use elsewhere would make this wait
            ray.get(actor.placed.remote(), timeout=timeout)
            hello = loads(_unflatten(ray.get(actor.hello.remote(), timeout=START_TIMEOUT_S)))
        except Exception as exc:
            with contextlib.suppress(Exception):
                ray.kill(actor)
            if isinstance(exc, ray.exceptions.GetTimeoutError):
                raise BackendUnavailable(
                    f"the {self.target} actor on {where} was not ready within {timeout:g} s: no "
                    f"node had {_describe(need)} free for it (in use by other actors?)"
                ) from None
            raise BackendUnavailable(
                f"the {self.target} actor on {where} failed to start: {_ray_cause(exc)}"
            ) from None
        version = package_version()
        if hello.get("version") != version:
            with contextlib.suppress(Exception):
                ray.kill(actor)
            raise BackendUnavailable(
                f"{where} runs neuron-workbench {hello.get('version')}, this kernel "
                f"{version}; install the same version on both"
            )
        self._actor = actor
        self._modules = _fingerprint(modules)
        self._placed = self._placement_key()
        self.pid = hello.get("pid")
        self.node = hello.get("node")
        self.availability = hello["availability"]
        info = hello["info"]
        self.info = _located(info, self) if info is not None else None
        if self.availability is not None and not self.availability:
            self.availability = dataclasses.replace(
                self.availability, reason=f"{self.availability.reason} (on {self.where})"
            )
        self.cells_run = 0
        self.started_s = time.perf_counter() - started

    def stop(self) -> None:
        """End the actor (if any)."""
        actor, self._actor = self._actor, None
        ray = sys.modules.get("ray")
        if actor is not None and ray is not None and ray.is_initialized():
            with contextlib.suppress(Exception):
                ray.kill(actor)

    def run(self, message: Packed, *, timeout: float | None, cell_filename: str) -> Any:
        """Send one packed request to the actor and return its answer.

        Raises
        ------
        WorkerDied
            The actor died or overran ``timeout`` (one line: cause, last op, cell line); it is gone.
        """
        self.ensure_started()
        import ray

        actor = self._actor
        data, buffers = _flatten(message)
        deadline = None if timeout is None else time.monotonic() + timeout
        seen: tuple[str, int | None] = ("", None)
        probe = None
        try:
            pending = actor.run.remote(data, buffers, {"cwd": os.getcwd()})
            while True:
                wait = _PROBE_EVERY_S
                if deadline is not None:
                    wait = max(0.0, min(wait, deadline - time.monotonic()))
                done, _ = ray.wait([pending], timeout=wait)
                if done:
                    break
                if probe is not None and ray.wait([probe], timeout=0)[0]:
                    with contextlib.suppress(Exception):
                        seen = ray.get(probe)
                    probe = None
                if deadline is not None and time.monotonic() >= deadline:
                    with contextlib.suppress(Exception):
                        seen = ray.get(actor.probe.remote(), timeout=2)
                    self.stop()
                    raise WorkerDied(
                        f"target actor on {self.where} timed out after {timeout:g} s"
                        f"{_seen(seen)}; it was ended"
                    )
                if probe is None:
                    probe = actor.probe.remote()
            answer = loads_leniently(_unflatten(ray.get(pending)))
        except WorkerDied:
            raise
        except ray.exceptions.RayActorError as exc:
            self._actor = None
            raise WorkerDied(
                f"target actor on {self.where} died ({_ray_cause(exc)}){_seen(seen, last=True)}"
            ) from None
        except ray.exceptions.RayTaskError as exc:
            self.stop()
            raise WorkbenchUsageError(
                f"the {self.target} actor failed: {_ray_cause(exc)}; {_HINT}"
            ) from None
        except BaseException:  # KeyboardInterrupt, a lost connection: the actor's state is unknown
            self.stop()
            raise
        self.cells_run += 1
        return answer


def _seen(seen: tuple[str, int | None], last: bool = False) -> str:
    op, line = seen
    text = f" running {op}" if op else ""
    text += f" at cell line {line}" if line is not None else ""
    if not text:
        return ""
    return f"; last seen{text}" if last else f" while{text}"


def _ray_cause(exc: BaseException) -> str:
    """One line from a Ray error: the cause Ray gives, without its tracebacks and log tails."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and not type(cause).__module__.startswith("ray"):
        return _first_line(cause)
    text = " ".join(str(exc).split())
    for marker in ("killed by `ray.kill`", "ray.kill"):
        if marker in text:
            return "ended with ray.kill"
    for marker in ("exit detail:", "Error message:", "error_message:"):
        if marker in text:
            detail = text.split(marker, 1)[1].strip()
            return detail.split(". ", 1)[0].rstrip(".")[:200]
    first = str(exc).strip().splitlines()
    return first[0][:200] if first else type(exc).__name__


def _located(info: BackendInfo, target: RayTarget) -> BackendInfo:
    details = dict(info.details)
    details["ran_on"] = target.where
    if target.node:
        details["ray_node"] = target.node
    return dataclasses.replace(info, details=details)


class RayActorPool(WorkerPool):
    """The target actors of one session on one cluster, one per target, created on first use."""

    def __init__(self, cluster: str, options: RayOptions | None = None) -> None:
        super().__init__()
        self.cluster = cluster
        self.options = options if options is not None else RayOptions()

    def _new(self, target: str) -> RayTarget:
        return RayTarget(target, self.cluster, self.options)

    def _row(self, slot: RayTarget) -> WorkerRow:
        return WorkerRow(f"{slot.target}@{slot.where}", slot.pid, slot.alive, None, slot.cells_run)

    def get(self, target: str) -> RayTarget:
        """The actor slot for ``target`` (created, not yet started, on first use)."""
        slot = super().get(target)
        slot.options = self.options  # the session's settings may have changed since
        return slot


class RayExecutor(WorkerExecutor):
    """Executes the target run of a cell in a Ray actor on a node that has the target's device."""

    name = "ray"
    #: An actor runs the request when its result is asked for, after the reference (no overlap).
    concurrent = False

    def __init__(self, pool: RayActorPool, timeout: float | None = None) -> None:
        super().__init__(pool, timeout=timeout)  # type: ignore[arg-type]

    def _finish(self, answer: Any, spec: Any, run_id: str, target: str) -> Run:
        """The actor's run; its backend says where it ran."""
        run = super()._finish(answer, spec, run_id, target)
        slot = self.pool.get(target)
        if run.backend.details.get("ran_on") != slot.where:
            run.backend = _located(run.backend, slot)  # type: ignore[arg-type]
        return run
