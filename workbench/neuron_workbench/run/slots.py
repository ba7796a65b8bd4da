"""Target slots: what the executor needs from the place a target runs, and the pool that keeps them.

A *slot* owns one target's device outside the kernel: a worker process on this host
(:class:`~neuron_workbench.run.worker_process.WorkerSlot`) or a Ray actor on a cluster node
(:class:`~neuron_workbench.run.ray_executor.RayActorSlot`). Both implement :class:`TargetSlot`, so
:class:`~neuron_workbench.run.slot_executor.SlotExecutor` drives either unchanged, and both are kept
by a :class:`SlotPool`, one slot per target, started on first use.
"""

from __future__ import annotations

import atexit
import contextlib
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from neuron_workbench.backends.base import Availability, BackendInfo
from neuron_workbench.run.transport import Loaded, Packed


class WorkerDied(Exception):
    """The slot's process (a worker or an actor) ended, or was ended, while running a cell.

    Parameters
    ----------
    message : str
        The one-line cause.
    printed : tuple of str, optional
        ``(stdout, stderr)`` the run had written below Python before the end (a worker's fds 1 and
        2, which point at files while it runs): a C++ abort's message is the run's record.
    """

    def __init__(self, message: str = "", printed: tuple[str, str] = ("", "")) -> None:
        super().__init__(message)
        self.printed = printed


class AnswerNotLoaded(WorkerDied):
    """The slot's answer could not be rebuilt in this process; the process itself serves on."""


@dataclass
class WorkerRow:
    """One line of ``%neuron_workers``."""

    target: str
    pid: int | None
    alive: bool
    memory_bytes: int | None
    cells_run: int
    #: Shared memory the worker's folder keeps between cells for the next transfers (kept arenas).
    kept_bytes: int | None = None


@runtime_checkable
class TargetSlot(Protocol):
    """One target's device outside the kernel, started lazily and afresh after a death.

    Attributes
    ----------
    target : str
        The backend it runs (``neuron``, ``tpu``, ...).
    cells_run : int
        Cells answered since the slot (re)started.
    info, availability
        The target's :class:`BackendInfo` and :class:`Availability` as its process reported them
        when it started (None before).
    """

    target: str
    cells_run: int
    info: BackendInfo | None
    availability: Availability | None

    @property
    def alive(self) -> bool:
        """Whether the slot holds a started process."""
        ...

    @property
    def arena(self) -> str | None:
        """Shared-memory folder for the requests' tensors, or None (they travel in the message)."""
        ...

    def row(self) -> WorkerRow:
        """Its line of ``%neuron_workers``."""
        ...

    def start(self) -> None:
        """Start a fresh process (ending any running one) and wait until its device is ready.

        Raises :class:`~neuron_workbench.errors.BackendUnavailable` (one line) when it cannot.
        """
        ...

    def ensure_started(self) -> None:
        """Start the process unless a usable one runs."""
        ...

    def stop(self) -> None:
        """End the process (if any)."""
        ...

    def submit(self, message: Packed) -> int:
        """Hand over one packed run request; its id (a slot may start running it now or later)."""
        ...

    def collect(
        self,
        request_id: int,
        *,
        timeout: float | None,
        cell_filename: str,
        sent: float,
        cell: bool = True,
    ) -> Loaded:
        """The answer to ``request_id``.

        Raises :class:`WorkerDied` (one line) when the process died or overran ``timeout`` seconds
        (counted from ``sent``, or from when the slot starts running it); the slot starts afresh.
        ``cell`` says whether the answer is a cell's run (counted in ``cells_run``); a fetch of what
        a run kept in the process is not.
        """
        ...

    def cancel(self, request_id: int) -> None:
        """Abandon ``request_id``: nothing of it may reach the next cell."""
        ...


SlotT = TypeVar("SlotT", bound=TargetSlot)

_POOLS: weakref.WeakSet[SlotPool[Any]] = weakref.WeakSet()


@atexit.register
def _close_pools() -> None:
    for pool in list(_POOLS):
        with contextlib.suppress(Exception):  # at exit: a pool's runtime may already be gone
            pool.close()


class SlotPool(Generic[SlotT]):
    """The slots of one session, one per target, made by ``new_slot(target)`` on first use."""

    def __init__(self, new_slot: Callable[[str], SlotT]) -> None:
        self._new_slot = new_slot
        self._slots: dict[str, SlotT] = {}
        _POOLS.add(self)

    def get(self, target: str) -> SlotT:
        """The slot for ``target`` (created, not yet started, on first use)."""
        if target not in self._slots:
            self._slots[target] = self._new_slot(target)
        return self._slots[target]

    def launch(self, target: str) -> None:
        """Start ``target``'s slot without waiting for it, unless it runs or is starting.

        For a slot that can (a worker process: :meth:`WorkerSlot.launch
        <neuron_workbench.run.worker_process.WorkerSlot.launch>`); its first use waits for the
        rest of its start.
        """
        slot = self.get(target)
        launch = getattr(slot, "launch", None)
        if launch is not None and not slot.alive:
            launch()

    def rows(self) -> list[WorkerRow]:
        """Every slot with its state."""
        return [slot.row() for slot in self._slots.values()]

    def restart(self, target: str) -> SlotT:
        """Stop ``target``'s slot and start a fresh one."""
        slot = self.get(target)
        slot.start()
        return slot

    def close(self) -> None:
        """Stop every slot."""
        for slot in self._slots.values():
            slot.stop()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
