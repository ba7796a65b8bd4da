"""Run a cell's target side in a Ray actor on a cluster node that has the target's device (``--on``).

The local worker's protocol, shipped through Ray: the kernel packs the same run request
(:func:`~neuron_workbench.run.target_requests.pack_request`), a
:class:`~neuron_workbench.run.ray_actor.TargetActor` placed on a node with the target's resource
(``neuron_cores`` for neuron, ``TPU`` for tpu, ``GPU`` for cuda) answers it with the worker's own
code, and the finished :class:`~.records.Run` comes back with its tensors on the host. The
reference stays in the kernel. :class:`RayActorSlot` is a
:class:`~neuron_workbench.run.slots.TargetSlot`, so
:class:`~neuron_workbench.run.slot_executor.SlotExecutor` drives it as it drives a worker.

Ray is an optional dependency (``pip install neuron-workbench[ray]``) and is imported only when a
cell names a cluster: this module itself imports nothing of Ray at import time.

- ``ray://HOST:PORT`` connects this kernel to that cluster (Ray Client) on first use;
  ``ray`` means the cluster the kernel already connected to with ``ray.init(...)``
  (:mod:`~neuron_workbench.run.ray_cluster`).
- A target no node can hold is a one-line error: at once when no alive node has the resource,
  after :attr:`~neuron_workbench.run.ray_cluster.RayOptions.ready_timeout_s` (30 s) when the actor
  still could not be placed.
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
import itertools
import os
import sys
import time
from typing import Any

from neuron_workbench.backends.base import Availability, BackendInfo
from neuron_workbench.errors import BackendUnavailable, WorkbenchUsageError
from neuron_workbench.run.ray_actor import ON_HINT, TargetActor, flatten, package_version, unflatten
from neuron_workbench.run.ray_cluster import (
    RayOptions,
    actor_placement,
    connect,
    describe_resources,
    local_modules,
    module_sources,
    modules_fingerprint,
    node_fits,
)
from neuron_workbench.run.slot_executor import SlotExecutor
from neuron_workbench.run.slots import SlotPool, WorkerDied, WorkerRow
from neuron_workbench.run.target_requests import (
    START_TIMEOUT_S,
    first_line,
    where_it_was,
)
from neuron_workbench.run.transport import Loaded, Packed, loads, loads_leniently
from neuron_workbench.worker_launch import WORKER_ENV

#: Seconds between the kernel's looks at what a running actor is doing (last op, cell line).
_PROBE_EVERY_S = 0.5
#: Ids of the requests submitted to actors of this process.
_REQUEST_IDS = itertools.count(1)


class RayActorSlot:
    """One actor that owns ``target``'s device on the cluster; created lazily, again after a death.

    A :class:`~neuron_workbench.run.slots.TargetSlot` that runs a submitted request when its
    answer is collected (after the reference: no overlap), in-band (no shared-memory arena).
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
        self._submitted: dict[int, Packed] = {}

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

    @property
    def arena(self) -> None:
        """None: requests travel in the message (the actor may be on another host)."""
        return None

    def row(self) -> WorkerRow:
        """Its line of ``%neuron_workers`` (memory is not measured for a remote actor)."""
        return WorkerRow(f"{self.target}@{self.where}", self.pid, self.alive, None, self.cells_run)

    def ensure_started(self) -> None:
        """Start the actor unless one runs with the current settings and local modules."""
        ray = sys.modules.get("ray")
        if self._actor is not None and (ray is None or not ray.is_initialized()):
            self._actor = None  # the kernel disconnected (ray.shutdown): the handle is gone
        modules = self._local_modules()
        if (
            self._actor is not None
            and self._placed == self._placement_key()
            and modules_fingerprint(modules) == self._modules
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
                f"could not list the nodes of {where}: {first_line(exc)}"
            ) from None
        if need and not any(node_fits(node, need) for node in nodes):
            raise BackendUnavailable(
                f"no node of {where} has {describe_resources(need)} for the {self.target} target "
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
                **actor_placement(need, self.options.num_cpus),
            ).remote(self.target, sources)
        except Exception as exc:
            raise BackendUnavailable(
                f"could not create the {self.target} actor on {where}: {first_line(exc)}"
            ) from None
        timeout = self.options.ready_timeout_s
        try:
            # placed on a node and running: a resource in use elsewhere would make this wait
            ray.get(actor.placed.remote(), timeout=timeout)
            hello = loads(unflatten(ray.get(actor.hello.remote(), timeout=START_TIMEOUT_S)))
        except Exception as exc:
            with contextlib.suppress(Exception):
                ray.kill(actor)
            if isinstance(exc, ray.exceptions.GetTimeoutError):
                raise BackendUnavailable(
                    f"the {self.target} actor on {where} was not ready within {timeout:g} s: no "
                    f"node had {describe_resources(need)} free for it (in use by other actors?)"
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
        self._modules = modules_fingerprint(modules)
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

    def submit(self, message: Packed) -> int:
        """Keep one packed request until :meth:`collect` runs it; its id."""
        request_id = next(_REQUEST_IDS)
        self._submitted[request_id] = message
        return request_id

    def cancel(self, request_id: int) -> None:
        """Forget a request not collected yet."""
        message = self._submitted.pop(request_id, None)
        if message is not None:
            message.discard()

    def collect(
        self,
        request_id: int,
        *,
        timeout: float | None,
        cell_filename: str,
        sent: float,
        cell: bool = True,
    ) -> Loaded:
        """Send the request to the actor now and return its answer; its run says where it ran.

        ``timeout`` counts from now: the request waited in the kernel until the reference ran.

        Raises
        ------
        WorkerDied
            The actor died or overran ``timeout`` (one line: cause, last op, cell line); it is gone.
        """
        answer = self._run(
            self._submitted.pop(request_id), timeout=timeout, cell_filename=cell_filename
        )
        if cell:
            self.cells_run += 1
        run = answer.value.get("run") if isinstance(answer.value, dict) else None
        if run is not None and run.backend.details.get("ran_on") != self.where:
            run.backend = _located(run.backend, self)
        return answer

    def _run(self, message: Packed, *, timeout: float | None, cell_filename: str = "") -> Loaded:
        self.ensure_started()
        import ray

        actor = self._actor
        data, buffers = flatten(message)
        deadline = None if timeout is None else time.monotonic() + timeout
        seen: tuple[str, int | None, bool] = ("", None, False)
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
                        f"{_seen(seen, filename=cell_filename)}; it was ended"
                    )
                if probe is None:
                    probe = actor.probe.remote()
            answer = loads_leniently(unflatten(ray.get(pending)))
        except WorkerDied:
            raise
        except ray.exceptions.RayActorError as exc:
            self._actor = None
            last = _seen(seen, last=True, filename=cell_filename)
            raise WorkerDied(
                f"target actor on {self.where} died ({_ray_cause(exc)}){last}"
            ) from None
        except ray.exceptions.RayTaskError as exc:
            self.stop()
            raise WorkbenchUsageError(
                f"the {self.target} actor failed: {_ray_cause(exc)}; {ON_HINT}"
            ) from None
        except BaseException:  # KeyboardInterrupt, a lost connection: the actor's state is unknown
            self.stop()
            raise
        return answer


def _seen(seen: tuple[str, int | None, bool], last: bool = False, filename: str = "") -> str:
    # filename: the program's (a script's path names its line as the script's, not a cell's)
    op, line, ended = seen
    text = where_it_was(op, ended, line, filename)
    return f"; last seen{text}" if last and text else text


def _ray_cause(exc: BaseException) -> str:
    """One line from a Ray error: the cause Ray gives, without its tracebacks and log tails."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and not type(cause).__module__.startswith("ray"):
        return first_line(cause)
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


def _located(info: BackendInfo, target: RayActorSlot) -> BackendInfo:
    details = dict(info.details)
    details["ran_on"] = target.where
    if target.node:
        details["ray_node"] = target.node
    return dataclasses.replace(info, details=details)


class RayActorPool(SlotPool[RayActorSlot]):
    """The target actors of one session on one cluster, one per target, created on first use."""

    def __init__(self, cluster: str, options: RayOptions | None = None) -> None:
        super().__init__(lambda target: RayActorSlot(target, self.cluster, self.options))
        self.cluster = cluster
        self.options = options if options is not None else RayOptions()

    def get(self, target: str) -> RayActorSlot:
        """The actor slot for ``target`` (created, not yet started, on first use)."""
        slot = super().get(target)
        slot.options = self.options  # the session's settings may have changed since
        return slot


class RayExecutor(SlotExecutor):
    """Executes the target run of a cell in a Ray actor on a node that has the target's device."""

    name = "ray"
    #: An actor runs the request when its result is asked for, after the reference (no overlap).
    concurrent = False

    def __init__(self, pool: RayActorPool, timeout: float | None = None) -> None:
        super().__init__(pool, timeout=timeout)
