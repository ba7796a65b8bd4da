"""Look up backends by name."""

from __future__ import annotations

from typing import Any

from neuron_workbench.backends.base import Availability, Backend
from neuron_workbench.backends.cpu import CpuBackend
from neuron_workbench.backends.cuda import CudaBackend
from neuron_workbench.backends.neuron import NeuronBackend
from neuron_workbench.backends.tpu import TpuBackend
from neuron_workbench.emulator.profiles import DEVICES
from neuron_workbench.errors import WorkbenchUsageError

_BACKENDS: dict[str, type[Backend]] = {
    "cpu": CpuBackend,
    "cuda": CudaBackend,
    "neuron": NeuronBackend,
    "tpu": TpuBackend,
}

#: Backend names in the order reports list them.
BACKEND_NAMES: tuple[str, ...] = tuple(_BACKENDS)


def get_backend(name: str, **options: Any) -> Backend:
    """Return the adapter for ``name`` (``cpu``, ``cuda``, ``neuron`` or ``tpu``).

    Parameters
    ----------
    name : str
        The backend name.
    **options
        Adapter options, e.g. ``list_fallbacks=True`` for ``tpu`` (run with the CPU fallback on
        and list every missing op).

    Raises
    ------
    WorkbenchUsageError
        For an unknown name (the message lists the known ones) or an option the backend lacks.
    """
    key = name.strip().lower()
    if key not in _BACKENDS:
        known = ", ".join(BACKEND_NAMES)
        raise WorkbenchUsageError(f"unknown backend {name!r}; choose one of: {known}")
    if not options:
        return _BACKENDS[key]()
    try:
        return _BACKENDS[key](**options)
    except TypeError:
        given = ", ".join(sorted(options))
        raise WorkbenchUsageError(f"backend {key!r} takes no option {given}") from None


def backend_table() -> list[tuple[str, Availability]]:
    """Every backend with its availability here, in :data:`BACKEND_NAMES` order."""
    return [(name, get_backend(name).availability()) for name in BACKEND_NAMES]


def default_reference() -> str:
    """``cuda`` when a GPU is usable, else ``cpu``."""
    return "cuda" if get_backend("cuda").availability() else "cpu"


class BackendStatusTable:
    """What ``%neuron_backends`` and ``neuron-workbench backends`` show: each backend and why not."""

    def __init__(self, rows: list[tuple[str, Availability]] | None = None) -> None:
        self.rows = rows if rows is not None else backend_table()

    def lines(self) -> list[str]:
        """One line per backend: name, status, and the reason when unavailable."""
        out = []
        for name, avail in self.rows:
            if avail:
                status = "available (emulated on the host CPU)" if avail.emulated else "available"
                fake = getattr(get_backend(name), "fake_description", lambda: "")()
                if fake and not avail.emulated:
                    status = f"available (FAKE: {fake})"
            else:
                status = avail.reason
            out.append(f"{name:<7} {status}")
        return out

    def to_dict(self) -> list[dict[str, object]]:
        """JSON-ready form."""
        return [
            {"name": n, "available": a.ok, "emulated": a.emulated, "reason": a.reason}
            for n, a in self.rows
        ]

    def __repr__(self) -> str:
        return "\n".join(self.lines())

    def _repr_html_(self) -> str:
        import html

        rows = "".join(
            f"<tr><td><code>{html.escape(n)}</code></td><td>{'yes' if a else 'no'}</td>"
            f"<td>{'emulated' if a.emulated else ('real' if a else '')}</td>"
            f"<td>{html.escape(a.reason)}</td></tr>"
            for n, a in self.rows
        )
        return (
            "<table><thead><tr><th>backend</th><th>available</th><th>kind</th><th>why not</th>"
            f"</tr></thead><tbody>{rows}</tbody></table>"
        )


#: Where a target run happens: ``auto`` (a worker for neuron/tpu targets, else this process),
#: ``inprocess`` (this process), or ``worker`` (a child process per target that owns the device).
EXECUTOR_CHOICES = ("auto", "inprocess", "worker")
#: Targets ``auto`` runs in workers: accelerators, emulated or real (one backend per process).
WORKER_TARGETS = DEVICES


def resolve_executor(name: str, targets: tuple[str, ...] | list[str]) -> str:
    """``inprocess`` or ``worker``: what ``name`` (possibly ``auto``) means for ``targets``.

    ``auto`` picks a worker for a neuron or tpu target unless this process already holds that
    device (its SDK, or the emulator, loaded at ``import torch``): then the device and the
    settings made on it in the notebook are here.
    """
    if name != "auto":
        return name
    return "worker" if any(_needs_worker(t) for t in targets) else "inprocess"


def _needs_worker(target: str) -> bool:
    if target not in WORKER_TARGETS:
        return False
    import torch

    return bool(torch._C._get_privateuse1_backend_name() != target)


def prepare_target(name: str, executor: str = "auto") -> None:
    """Install an emulated in-process target early (before the first backward pass).

    When the target runs in a worker (``worker``, or ``auto`` for neuron and tpu) nothing is
    installed here: this process keeps no accelerator backend.
    """
    if resolve_executor(executor, [name.strip().lower()]) != "inprocess":
        return
    from neuron_workbench.errors import WorkbenchError

    try:
        backend = get_backend(name)
        if backend.availability().emulated:
            with backend.activated():
                pass
    except WorkbenchError:
        pass
