"""The worker process's side: set up once, then answer the kernel's run requests until it is gone.

A worker is started by :class:`~neuron_workbench.run.worker_process.WorkerSlot` as
``python -c "from neuron_workbench.run.worker_server import serve; serve(fd, folder)"``. It mirrors
the kernel's ``sys.path``, environment, working directory and torch threads for each request, keeps
the name of the last op its device ran in a memory-mapped file and lets :mod:`faulthandler` dump its
stacks into its folder (both survive a crash, so the kernel can say where it died), and ends itself
when the kernel that started it is gone.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import shutil
import signal
import sys
import time
from multiprocessing.connection import Connection
from typing import Any, NoReturn

import torch

from neuron_workbench.run.module_versions import follow as follow_module_versions
from neuron_workbench.run.target_requests import (
    EXECUTOR_HINT,
    answer_request,
    device_ready,
    refuse_input,
    release_answered,
)
from neuron_workbench.run.transport import dumps, receive, send
from neuron_workbench.worker_launch import LAST_OP_BYTES, WORKER_ENV

#: Variables a worker keeps as it was started: its device, that it is a worker, no inline plots.
_OWN_ENV = ("NEURON_WORKBENCH_EMULATE", "NEURON_WORKBENCH_EMULATE_REPORT", "MPLBACKEND", WORKER_ENV)


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


def serve(fd: int, folder: str) -> NoReturn:
    """Worker main loop: set up, then answer run requests until the pipe closes, then end.

    ``fd`` is the worker's end of the socket pair, ``folder`` its own (last op, stack dumps,
    shared-memory arenas).
    """
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
        slot = mmap.mmap(handle.fileno(), LAST_OP_BYTES)
    import builtins

    if not hasattr(builtins, "display"):
        # IPython puts display() among the builtins; here a displayed object is printed instead.
        builtins.display = lambda *objects, **kwargs: print(*objects)  # type: ignore[attr-defined]
    refuse_input("worker", EXECUTOR_HINT)  # its stdin is /dev/null: say so, not just "EOF"
    from neuron_workbench.backends import get_backend

    backend = get_backend(init["target"])
    from neuron_workbench.run.logging_setup import own_streams_follow_runs

    own_streams_follow_runs()  # a run's torch log lines are its output, not the kernel's stderr
    hello: dict[str, Any] = {"pid": os.getpid(), **device_ready(backend, "worker")}
    try:
        send(conn, dumps(hello), {"id": init["id"]})
        serving = True
    except OSError:  # the kernel is gone: it ended before using this process, launched ahead
        serving = False
    while serving:
        try:
            # the request id, the kernel's import path, environment, folder and torch threads as
            # of this cell, then the request
            head, data = receive(conn)
        except (EOFError, OSError):
            break
        where = head["where"]
        if where["sys_path"] != sys.path:
            sys.path[:] = where["sys_path"]
        _mirror_environment(where["environ"])
        if where["threads"] != torch.get_num_threads():
            torch.set_num_threads(where["threads"])
        if where["cwd"] != os.getcwd():
            with contextlib.suppress(OSError):
                os.chdir(where["cwd"])
        # before the request is loaded: what it holds of a module reloaded there is the new code's
        follow_module_versions(where.get("modules") or {})
        answer = answer_request(
            data,
            backend,
            slot,
            host="worker",
            load_hint=EXECUTOR_HINT,
            hint=EXECUTOR_HINT,
            arena=folder,
            # its fds 1 and 2 are the kernel's (or the terminal's): a run's output there is the
            # run's, kept in files here meanwhile (a crash leaves them to the kernel)
            printed=folder,
        )
        try:
            send(conn, answer, {"id": head["id"]})
        except OSError:  # the kernel is gone (or gave up on this request): nobody will load it
            answer.discard()
            break
        # The cell's state here is freed while the kernel reads the answer, not before it is sent
        # (a destructor that crashes the worker now shows on the next cell, as a worker that died).
        release_answered()
        # a cell's faulthandler.enable() moved the crash report to this process's stderr: a crash
        # of a later cell would lose its cell line (the kernel reads it from faults.log)
        faulthandler.enable(file=faults, all_threads=True)
    # The pipe closed: the kernel stopped this worker or is gone (a kernel killed between cells
    # closes it; one killed mid-cell is noticed by the parent watch). Nobody reads the folder now.
    shutil.rmtree(folder, ignore_errors=True)
    # Nothing is left to finalise, so the interpreter's teardown is skipped, as the parent watch
    # skips it: its garbage collection runs library finalisers (torch's dynamo weakref callbacks)
    # that can print "Exception ignored in ..." into the stderr this process shares with its kernel
    # or the CLI, often cut off halfway by the kernel's kill.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
