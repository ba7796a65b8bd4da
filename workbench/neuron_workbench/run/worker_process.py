"""The worker slot: a child process on this host that owns one target's device (``--executor worker``).

The kernel never installs the emulator (or loads a vendor SDK's device) itself: each target gets a
spawned Python process (:mod:`~neuron_workbench.run.worker_server`), started once and reused. What
the cell reads is shipped by :mod:`~neuron_workbench.run.transport` (tensors by storage through
shared memory, so views, tied weights and model/optimizer references arrive as they left), with the
kernel's ``sys.path``, environment and working directory mirrored; the finished
:class:`~.records.Run` comes back the same way. Every request carries an id, so an answer from an
abandoned request is never taken for the next one.

A worker that dies (a signal, ``os._exit``, the OOM killer), overruns ``timeout`` or does not start in
time becomes one line (an ERROR run naming the signal, the last op it dispatched and the cell line,
or a start-up failure), and the next cell gets a fresh worker; the kernel and its namespace are
never touched. The last op comes from the memory-mapped file the worker writes it into, the cell
line from :mod:`faulthandler`'s dump.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Connection

import torch

from neuron_workbench.backends.base import Availability, BackendInfo
from neuron_workbench.errors import BackendUnavailable
from neuron_workbench.run.module_versions import loaded_versions
from neuron_workbench.run.printed_below import left_in
from neuron_workbench.run.slot_executor import SlotExecutor
from neuron_workbench.run.slots import AnswerNotLoaded, SlotPool, WorkerDied, WorkerRow
from neuron_workbench.run.target_requests import (
    START_TIMEOUT_S,
    first_line,
    read_last_op,
    where_it_was,
)
from neuron_workbench.run.transport import (
    Loaded,
    Packed,
    kept_arenas_size,
    loads_leniently,
    receive,
    send,
)
from neuron_workbench.worker_launch import (
    LAST_OP_BYTES,
    REQUEST_IDS,
    launch_worker,
    take_launched,
    worker_environment,
)


def _signal_name(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-returncode).name
        return f"signal {-returncode}"
    return f"exit status {returncode}"


class WorkerSlot:
    """One worker process that owns ``target``'s device; started lazily, restarted after a death.

    A :class:`~neuron_workbench.run.slots.TargetSlot`: a submitted request runs at once, while the
    kernel goes on (runs the reference).
    """

    def __init__(self, target: str) -> None:
        self.target = target
        self.cells_run = 0
        self.info: BackendInfo | None = None
        self.availability: Availability | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._folder: str | None = None
        #: The id of the hello a launched process has not been waited for yet (see :meth:`launch`)
        self._hello: int | None = None
        self._launched = 0.0
        self._launched_environment: dict[str, str] = {}
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
        self.launch()
        self._await_hello()

    def launch(self) -> None:
        """Spawn the process without waiting for it (ending any running one).

        It imports torch and installs its device while this process goes on: a notebook's worker
        is launched as the extension loads, and its first cell finds it ready. A worker a command
        launched ahead for this target (:func:`~neuron_workbench.worker_launch.launch_ahead`)
        is taken instead. :meth:`ensure_started` waits for what is left of its start.
        """
        self.stop()
        launched = take_launched(self.target) or launch_worker(self.target)
        self._process, self._conn, self._folder = launched.process, launched.conn, launched.folder
        self._hello, self._launched = launched.hello, launched.launched
        self._launched_environment = launched.environment

    def _await_hello(self) -> None:
        """Wait for the launched process's hello: its device's availability and info."""
        assert self._hello is not None
        request_id = self._hello
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
        self._hello = None
        self.availability = hello["availability"]
        self.info = hello["info"]
        self.cells_run = 0
        self.started_s = time.perf_counter() - self._launched

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
        self._hello = None
        self.availability = None
        self.info = None

    def ensure_started(self) -> None:
        """Start the worker unless it is running; wait for the rest of a launched one's start."""
        # a variable set since the launch (os.environ["NEURON_RT_VISIBLE_CORES"] in a cell) is one
        # the device's SDK may read as it loads: a start where the process has it
        if (
            self._hello is not None
            and self.alive
            and worker_environment(self.target) == self._launched_environment
        ):
            self._await_hello()
        elif (
            self._hello is not None
            or not self.alive
            or self._conn is None
            or self.availability is None
        ):
            self.start()  # a launched process that died while nobody waited is started afresh

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
                    raise AnswerNotLoaded(
                        f"the {self.target} worker's answer could not be loaded in the kernel "
                        f"({first_line(exc)})"
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
        request_id = next(REQUEST_IDS)
        where = {
            "sys_path": list(sys.path),
            "cwd": os.getcwd(),
            "threads": torch.get_num_threads(),
            "environ": dict(os.environ),
            # the notebook's own modules as loaded here: the worker loads again what the kernel did
            "modules": loaded_versions(),
        }
        try:
            send(self._conn, message, {"id": request_id, "where": where})
        except BaseException:
            message.discard()
            self.stop()
            raise
        return request_id

    def collect(
        self,
        request_id: int,
        *,
        timeout: float | None,
        cell_filename: str,
        sent: float,
        cell: bool = True,
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
            where, printed = self._where(cell_filename), self._printed()
            self.stop()
            raise WorkerDied(
                f"target process timed out after {timeout:g} s{where}; it was ended", printed
            ) from None
        except AnswerNotLoaded:
            raise  # the worker ran the cell and serves on
        except WorkerDied as exc:
            where, printed = self._where(cell_filename), self._printed()
            self.stop()
            raise WorkerDied(f"{exc}{where}", printed) from None
        except BaseException:  # KeyboardInterrupt: the worker's state is unknown; start afresh
            self.stop()
            raise
        if cell:
            self.cells_run += 1
        return answer

    def cancel(self, request_id: int) -> None:
        """End the worker running ``request_id``.

        The cell may never finish, and its side effects and answer must not reach the next cell,
        which starts a fresh worker.
        """
        self.stop()

    def row(self) -> WorkerRow:
        """Its line of ``%neuron_workers``."""
        pid = self.pid if self.alive else None
        kept = kept_arenas_size(self._folder) if self.alive and self._folder else None
        return WorkerRow(self.target, pid, self.alive, self.memory_bytes(), self.cells_run, kept)

    def _dump_stacks(self) -> None:
        # faulthandler in the worker writes every thread's stack on SIGUSR1, even mid C call.
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(OSError):
                self._process.send_signal(signal.SIGUSR1)
            time.sleep(0.3)

    def _printed(self) -> tuple[str, str]:
        """What the run of a worker that died or was ended had written to its fds 1 and 2."""
        if self._folder is None:
            return "", ""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()  # ended before its files are read: nothing more comes
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=10)
        return left_in(self._folder)

    def _where(self, cell_filename: str) -> str:
        """`` while running aten::op at cell line N`` from the files the worker left.

        The op is the one the worker's device was running, or, when it had ended, the last one it
        ran: `` at cell line N, after running aten::op`` (an emulated device records its own ops
        and custom ops, so a crash in host code names the device op before it). A script's
        program is compiled under its own path: its line reads `` at train.py, line N``.
        """
        if self._folder is None:
            return ""
        op, ended, line = "", False, None
        with contextlib.suppress(OSError):
            with open(os.path.join(self._folder, "lastop"), "rb") as handle:
                op, ended = read_last_op(handle.read(LAST_OP_BYTES))
        with contextlib.suppress(OSError):
            with open(os.path.join(self._folder, "faults.log"), errors="replace") as handle:
                dump = handle.read()[-200_000:]
            # a cell's own faulthandler.enable() dumps to its stderr, which is a file of the folder
            dump += left_in(self._folder)[1][-200_000:]
            # The cell's top-level frame; faulthandler may print exec'd code as <dynamic-code>.
            names = f"(?:{re.escape(cell_filename)}|<dynamic-code>)"
            pattern = re.compile(r'File "' + names + r'", line (\d+) in <module>')
            match = pattern.search(dump)
            if match:
                line = int(match.group(1))
        return where_it_was(op, ended, line, cell_filename)


class WorkerPool(SlotPool[WorkerSlot]):
    """The worker processes of one session, one per target, started on first use."""

    def __init__(self) -> None:
        super().__init__(WorkerSlot)


class WorkerExecutor(SlotExecutor):
    """Executes the target run of a cell in the pool's worker process for that target."""

    name = "worker"
    #: A started run goes on in the worker while the caller runs the reference (see :meth:`start`).
    concurrent = True

    def __init__(self, pool: WorkerPool | None = None, timeout: float | None = None) -> None:
        super().__init__(pool if pool is not None else WorkerPool(), timeout=timeout)
