"""The Ray actor that owns a target's device on a cluster node and answers run requests there.

The worker process's counterpart for ``--on`` (:mod:`~neuron_workbench.run.worker_server`): a
:class:`TargetActor`, placed by :class:`~neuron_workbench.run.ray_executor.RayActorSlot` on a node
with the target's resource, makes the device ready and answers each packed request with
:func:`~neuron_workbench.run.target_requests.answer_request`. Messages travel in-band
(:func:`flatten`, :func:`unflatten`): the actor may be on another host, where no shared-memory arena
reaches. This module imports nothing of Ray: ``ray.remote`` wraps the class in the kernel.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

from neuron_workbench.backends.base import Backend
from neuron_workbench.run.target_requests import (
    answer_request,
    device_ready,
    read_last_op,
    release_answered,
)
from neuron_workbench.run.transport import Packed, dumps
from neuron_workbench.worker_launch import LAST_OP_BYTES

#: What a cell the actor failed around is told to do instead.
ON_HINT = "run the cell without --on"


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
        self._slot = bytearray(LAST_OP_BYTES)
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
        self._hello = flatten(dumps(hello))
        return self._hello

    def run(self, data: bytes, buffers: list[list[bytes]], where: dict[str, Any]) -> Any:
        """Answer one packed run request as the worker process does (a packed answer)."""
        if where.get("cwd") and where["cwd"] != os.getcwd() and os.path.isdir(where["cwd"]):
            with contextlib.suppress(OSError):
                os.chdir(where["cwd"])  # the same folder exists here (a cluster on this host)
        self.hello()
        assert self._backend is not None
        try:
            answer = answer_request(
                unflatten((data, buffers)),
                self._backend,
                self._slot,
                host="actor",
                load_hint="install the module on the cluster's nodes or ship it with "
                "NeuronMagics.ray_runtime_env, or run the cell without --on",
                hint=ON_HINT,
                running=self._running_cell,
            )
        finally:
            release_answered()  # nothing runs after the return: the cell's state goes now
        return flatten(answer)

    @contextlib.contextmanager
    def _running_cell(self, request: dict[str, Any]) -> Iterator[None]:
        """While the request runs, :meth:`probe` knows the thread and the cell's file."""
        self._running = (threading.get_ident(), request["program"].filename)
        try:
            yield
        finally:
            self._running = None

    def probe(self) -> tuple[str, int | None, bool]:
        """The op the running cell dispatched last, its cell line (or None), and whether it ended."""
        op, ended = read_last_op(self._slot)
        running = self._running
        if running is None:
            return op, None, ended
        frame: types.FrameType | None = sys._current_frames().get(running[0])
        line = None
        while frame is not None:
            if frame.f_code.co_filename == running[1] and frame.f_code.co_name == "<module>":
                line = frame.f_lineno
            frame = frame.f_back
        return op, line, ended


def package_version() -> str:
    """The installed neuron-workbench version (``unknown`` without package metadata)."""
    from importlib import metadata

    try:
        return metadata.version("neuron-workbench")
    except metadata.PackageNotFoundError:
        return "unknown"


def flatten(packed: Packed) -> tuple[bytes, list[list[bytes]]]:
    """``packed`` as plain bytes Ray can carry: the pickle, its buffers, its storages."""
    # in-band only: the actor may be on another host, where no shared-memory arena reaches
    assert packed.arena is None
    return packed.data, [
        [bytes(buffer.raw()) for buffer in packed.buffers],
        [bytes(buffer.raw()) for buffer in packed.storages],
    ]


def unflatten(message: tuple[bytes, list[list[bytes]]]) -> Packed:
    """The :class:`Packed` message :func:`flatten` made bytes of."""
    data, (buffers, storages) = message
    # writable copies: tensors rebuilt on them are used in place
    return Packed(
        data,
        [pickle.PickleBuffer(bytearray(buffer)) for buffer in buffers],
        [pickle.PickleBuffer(bytearray(buffer)) for buffer in storages],
    )
