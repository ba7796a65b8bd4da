"""Spawning a target's worker process, without torch: a command can launch one before it imports it.

Importing torch takes a second or two, in the command's process and in the worker alike. ``run
SCRIPT.py`` launches its targets' workers (:func:`launch_ahead`) before it imports anything heavy,
so both imports happen at once; the session's
:class:`~neuron_workbench.run.worker_process.WorkerSlot` then takes the launched process
(:func:`take_launched`) and waits for what is left of its start. Nothing here imports torch.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import itertools
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

#: Environment variable set (to the target's name) in every target process (worker or Ray actor).
WORKER_ENV = "NEURON_WORKBENCH_WORKER"
#: Bytes of the record of the last op run (a worker's is memory-mapped): the op's name, NUL-padded,
#: and in the last byte ``OP_ENDED`` once that op has returned (0 while it runs).
LAST_OP_BYTES = 128
#: Ids of requests (and of the start-up hello) across every worker of this process: an answer is
#: never taken for another's.
REQUEST_IDS = itertools.count(1)

#: The host's shared-memory folder (Linux).
SHARED_MEMORY = "/dev/shm"
#: The accelerator targets a worker holds, and the module of each one's SDK.
_SDK_MODULES = {"neuron": "torch_neuronx", "tpu": "torch_tpu"}

_BOOT = (
    "import sys; sys.path[:0] = {paths!r}; "
    "from neuron_workbench.run.worker_server import serve; serve({fd}, {folder!r})"
)


def arena_folder() -> str | None:
    """A folder on shared memory for arenas (``/dev/shm`` on Linux), or None."""
    folder = SHARED_MEMORY
    return folder if os.path.isdir(folder) and os.access(folder, os.W_OK) else None


def _package_root() -> str:
    # The folder holding the neuron_workbench package (this file is neuron_workbench/worker_launch.py).
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker_environment(target: str) -> dict[str, str]:
    """The environment ``target``'s worker starts with: this process's, as of now, and its own."""
    env = dict(os.environ)
    env["NEURON_WORKBENCH_EMULATE"] = target if target in _SDK_MODULES else ""
    env[WORKER_ENV] = target
    env.pop("NEURON_WORKBENCH_EMULATE_REPORT", None)  # the kernel's report is not the worker's
    # a notebook's inline plotting backend means nothing in the worker
    env.pop("MPLBACKEND", None)
    return env


@dataclass
class LaunchedWorker:
    """A worker process spawned for ``target``, whose hello (request ``hello``) is not read yet."""

    target: str
    process: subprocess.Popen[bytes]
    conn: Connection
    #: its own folder: the last-op record, stack dumps, shared-memory arenas
    folder: str
    hello: int
    #: the environment it started with
    environment: dict[str, str]
    #: ``time.perf_counter()`` at the launch
    launched: float

    def end(self) -> None:
        """End the process and remove its folder."""
        with contextlib.suppress(OSError):
            self.conn.close()
        if self.process.poll() is None:
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)


def launch_worker(target: str) -> LaunchedWorker:
    """Spawn ``target``'s worker and send it its start-up message; do not wait for it.

    It imports torch and installs its device meanwhile, then answers with its hello.
    """
    launched = time.perf_counter()
    # On shared memory where there is some: the request and answer arenas are written here.
    folder = tempfile.mkdtemp(prefix=f"neuron-workbench-{target}-", dir=arena_folder())
    with open(os.path.join(folder, "lastop"), "wb") as handle:
        handle.write(bytes(LAST_OP_BYTES))
    ours, theirs = socket.socketpair()
    env = worker_environment(target)
    boot = _BOOT.format(paths=[_package_root()], fd=theirs.fileno(), folder=folder)
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", boot],
            pass_fds=(theirs.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
            # its own process group: a notebook interrupt reaches the kernel, which ends it
            start_new_session=True,
        )
    except BaseException:
        ours.close()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        theirs.close()
    conn = Connection(ours.detach())
    hello = next(REQUEST_IDS)
    start = {"sys_path": list(sys.path), "cwd": os.getcwd(), "target": target, "id": hello}
    conn.send_bytes(pickle.dumps(start))
    return LaunchedWorker(target, process, conn, folder, hello, env, launched)


#: Workers :func:`launch_ahead` launched that no slot has taken yet, by target.
_AHEAD: dict[str, LaunchedWorker] = {}


def launch_ahead(target: str) -> None:
    """Launch ``target``'s worker now, for the first slot of ``target`` this process makes.

    Only for an accelerator target that runs in a worker here as ``auto`` decides: none where
    its SDK is installed or the emulator is to be installed in this process (which then holds
    the device), and none launched twice. One no slot takes is ended at exit.
    """
    if target not in _SDK_MODULES or target in _AHEAD:
        return
    if os.environ.get("NEURON_WORKBENCH_EMULATE", "").strip():
        return  # torch's backend autoload installs the emulator here: the target runs here
    if importlib.util.find_spec(_SDK_MODULES[target]) is not None:
        return  # the real device, which may be this process's
    _AHEAD[target] = launch_worker(target)


def take_launched(target: str) -> LaunchedWorker | None:
    """The worker :func:`launch_ahead` launched for ``target``, if one is left; it is the caller's."""
    return _AHEAD.pop(target, None)


@atexit.register
def _end_untaken() -> None:
    for target in list(_AHEAD):
        with contextlib.suppress(Exception):
            _AHEAD.pop(target).end()
