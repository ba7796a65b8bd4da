"""Ray clusters for ``--on``: naming one, connecting this kernel to it, what an actor needs there.

:func:`parse_cluster` reads ``--on``; :func:`connect` connects the kernel (``ray://HOST:PORT``
through Ray Client, or ``ray``: the cluster the kernel already connected to with ``ray.init``);
:class:`RayOptions` say which resources a target's actor asks for and what the job ships; the
notebook's own modules (:func:`local_modules`, :func:`module_sources`) travel with each actor.
Ray is an optional dependency (``pip install neuron-workbench[ray]``), imported only on use.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.run.target_requests import first_line

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
                    f"could not connect to the Ray cluster at {cluster}: {first_line(exc)}"
                ) from None
        _connected = cluster
        return ray


def actor_placement(resources: dict[str, float], num_cpus: float | None) -> dict[str, Any]:
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


def node_fits(node: Mapping[str, Any], resources: dict[str, float]) -> bool:
    """Whether a node of ``ray.nodes()`` has ``resources`` (in all, used or not)."""
    have = node.get("Resources") or {}
    return all(float(have.get(name, 0.0)) >= amount for name, amount in resources.items())


def describe_resources(resources: dict[str, float]) -> str:
    """``neuron_cores: 1, CPU: 2`` (``none`` for no resources), as errors name them."""
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


def modules_fingerprint(paths: list[str]) -> tuple[tuple[str, float], ...]:
    """Each path with the newest modification time of its ``.py`` files (a change needs an actor)."""
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
