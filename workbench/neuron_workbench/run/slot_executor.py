"""The executor that runs a cell's target side in a target slot (a worker process or a Ray actor).

:class:`SlotExecutor` packs what the cell reads into a run request
(:func:`~neuron_workbench.run.target_requests.pack_request`), hands it to the pool's
:class:`~neuron_workbench.run.slots.TargetSlot` for the target, and turns the answer into the
:class:`~.records.Run` the comparison reads; a slot that died or timed out gives an ERROR run
naming the cause. Results the kernel cannot rebuild are marked not compared. The worker and Ray
executors (:class:`~neuron_workbench.run.worker_process.WorkerExecutor`,
:class:`~neuron_workbench.run.ray_executor.RayExecutor`) are this executor over their own pools.
"""

from __future__ import annotations

import functools
import linecache
import sys
import time
from typing import Any

from neuron_workbench.backends.base import Availability, Backend, BackendInfo
from neuron_workbench.errors import BackendUnavailable, WorkbenchUsageError, note_interrupted
from neuron_workbench.run.custom_ops import notebook_custom_ops
from neuron_workbench.run.library_state import notebook_module_hooks, notebook_registrations
from neuron_workbench.run.module_versions import assigned_values, reached_submodules
from neuron_workbench.run.namespace import mixed_on_device
from neuron_workbench.run.records import Run, RunError
from neuron_workbench.run.slots import AnswerNotLoaded, SlotPool, TargetSlot, WorkerDied
from neuron_workbench.run.target_requests import not_compared, pack_request
from neuron_workbench.run.transport import Loaded, Packed, dumps, sending_error, unloadable_in

_ATOMS = (str, int, float, bool, bytes, complex, type(None))


class SlotExecutor:
    """Executes the target run of a cell in the pool's slot for that target.

    Attributes
    ----------
    name : str
        The executor's name, as reports and ``--executor`` spell it.
    concurrent : bool
        Whether a started run goes on in the slot while the caller runs the reference.
    """

    name = "slot"
    concurrent = False

    def __init__(self, pool: SlotPool[Any], timeout: float | None = None) -> None:
        self.pool = pool
        self.timeout = timeout

    def availability(self, backend: Backend) -> Availability:
        """Whether ``backend`` can run in its slot (starts the slot)."""
        worker = self.pool.get(backend.name)
        try:
            worker.ensure_started()
        except BackendUnavailable as exc:
            return Availability(False, str(exc))
        assert worker.availability is not None
        return worker.availability

    def run(self, spec: Any, backend: Backend, *, run_id: str, what_if: str | None = None) -> Run:
        """Run ``spec`` on ``backend`` in its slot and return the :class:`Run` it sent back."""
        return self.start(spec, backend, run_id=run_id, what_if=what_if).result()

    def start(
        self, spec: Any, backend: Backend, *, run_id: str, what_if: str | None = None
    ) -> PendingRun:
        """Send ``spec`` to ``backend``'s slot, which may start running it; the run comes later.

        What the cell reads is packed now, so the caller may go on (run the reference in this
        process) while a :attr:`concurrent` slot runs; :meth:`PendingRun.result` waits for the
        answer.
        """
        from neuron_workbench.run import (
            logging_setup,
            numpy_settings,
            pandas_settings,
            torch_settings,
            warning_filters,
        )

        worker = self.pool.get(backend.name)
        worker.ensure_started()
        namespace = spec.namespace
        module_values = getattr(spec, "module_values", None)
        read, names = spec.inputs()
        along = names - read  # names that only share state with the cell's: sent when they can be
        # Plain values the cell may rebind without reading: in this process a run finds its outputs
        # by identity against the whole namespace, so `device = "cuda"` twice is no new binding.
        names |= {
            name for name in spec.program.body.co_names if type(namespace.get(name)) in _ATOMS
        }
        names = sorted(n for n in names if n in namespace)
        values = {name: namespace[name] for name in names}
        # (a container holding CPU tensors beside marked ones: only the marked ones move)
        force = [
            name
            for name, value in values.items()
            if value in spec.resident
            or (spec.resident.on_device(value) and not mixed_on_device(value))
        ]
        request = {
            # the notebook's torch.library ops, defined again there before the values that may
            # name them (torch.ops.nbops.scale_add) are rebuilt
            "custom_ops": notebook_custom_ops(),
            # the notebook's classes it registered with transformers' Auto classes
            # (AutoModel.register), for from_pretrained of its checkpoints there
            "library_registrations": notebook_registrations(),
            # the hooks it registered for every module (register_module_forward_hook)
            "module_hooks": notebook_module_hooks(),
            "program": spec.program,
            "seed": spec.seed,
            "random_state": getattr(spec, "random_state", None),
            # the reference's: both runs draw the same uuid4s
            "entropy": getattr(spec, "entropy", None),
            "hidden": frozenset(spec.hidden) & (set(names) | set(spec.program.body.co_names)),
            "force": force,
            "instruments": spec.instruments,
            "rng_on_cpu": spec.rng_on_cpu,
            "steps": spec.steps,
            "what_if": what_if,
            "ref_precision": getattr(spec, "ref_precision", "cuda"),
            # the worker runs it as the kernel named it: whether its file writes are kept apart
            "run_id": run_id,
            "kept_run": getattr(spec, "kept_run", None),
            "backend_options": backend.options(),
            "lines": linecache.getlines(spec.program.filename),
            # what earlier cells set in this process's torch (default dtype, grad mode, flags),
            # as before the reference ran (--profile runs it first, and the cell may change them)
            "torch_settings": getattr(spec, "torch_settings", None) or torch_settings.current(),
            "default_device": getattr(spec, "default_device", None),
            # logging.basicConfig in a plain cell: the message a run logs is formatted there too
            "logging": logging_setup.current(),
            # warnings.filterwarnings("error") in a plain cell: a warning raises there too
            "warnings": warning_filters.current(),
            # np.seterr(all="raise"), np.set_printoptions(precision=2) in a plain cell
            "numpy_settings": numpy_settings.current(),
            # pd.set_option("display.precision", 2)
            "pandas_options": pandas_settings.current(),
            # config.LR = 0.5 in a plain cell, on a module of the notebook's own
            "module_values": assigned_values() if module_values is None else module_values,
            # nwpkg.train.lr() where the kernel imported nwpkg.train: nwpkg travels by name, and
            # its submodule is imported there too
            "submodules": reached_submodules(spec.program, values),
            "notebook_temp": getattr(spec, "notebook_temp", None),
            "originals": getattr(spec, "originals", None),
        }
        # the cell's cuda device where a container or an object holds it (cfg["device"])
        cuda_devices = frozenset(id(device) for device in spec.resident.devices())
        try:
            message = pack_request(
                request, values, namespace, backend.name, worker.arena, cuda_devices
            )
        except WorkbenchUsageError:
            # one of the names along cannot be sent (a DataLoader iterator over a dataset the cell
            # reads): it stays behind, as it would had it shared nothing
            sendable = {
                n: v for n, v in values.items() if n not in along or sending_error(v) is None
            }
            if len(sendable) == len(values):
                raise
            message = pack_request(
                request, sendable, namespace, backend.name, worker.arena, cuda_devices
            )
        info = worker.info or backend.info()
        return PendingRun(self, worker, message, spec, run_id, info)

    def _finish(self, answer: Loaded, spec: Any, run_id: str, target: str, slot: TargetSlot) -> Run:
        value = answer.value
        if "interrupted" in value:
            raise KeyboardInterrupt
        if "usage_error" in value:
            raise WorkbenchUsageError(value["usage_error"])
        run: Run = value["run"]
        if answer.stood_in:
            _not_loadable_here(run, target)
        spec.captured[run_id] = _Printed(run.stdout, run.stderr, run.printed_order)
        for record in run.extras.values():
            if getattr(record, "held", ""):  # evidence the slot kept: fetched if a failure asks
                record.fetch_copies_with(
                    functools.partial(self._held_copies, slot, spec.program.filename)
                )
        return run

    def _held_copies(self, slot: TargetSlot, cell_filename: str, token: str) -> Any:
        """What ``slot``'s last run kept under ``token`` (empty once it has run something else)."""
        request_id = slot.submit(dumps({"held_copies": token}, slot.arena))
        answer = slot.collect(
            request_id,
            timeout=self.timeout,
            cell_filename=cell_filename,
            sent=time.monotonic(),
            cell=False,
        )
        return answer.value.get("copies", {})


class PendingRun:
    """A target run handed to a slot: :meth:`result` waits for it, :meth:`cancel` abandons it."""

    def __init__(
        self,
        executor: SlotExecutor,
        slot: TargetSlot,
        message: Packed,
        spec: Any,
        run_id: str,
        info: BackendInfo,
    ) -> None:
        self._executor = executor
        self._slot = slot
        self._spec = spec
        self._run_id = run_id
        self._info = info
        self._sent = time.monotonic()
        self._request_id = slot.submit(message)

    def result(self) -> Run:
        """The finished run (an ERROR run naming the cause when the slot died or timed out)."""
        executor = self._executor
        try:
            answer = self._slot.collect(
                self._request_id,
                timeout=executor.timeout,
                cell_filename=self._spec.program.filename,
                sent=self._sent,
            )
        except AnswerNotLoaded as exc:
            return Run(backend=self._info, error=RunError("AnswerNotLoaded", str(exc)))
        except WorkerDied as exc:
            # The message names the cell line itself; no lineno, so reports do not repeat it.
            run = Run(backend=self._info, error=RunError("TargetProcessDied", str(exc)))
            # what it wrote below Python before it ended (a C++ abort's message) is its record
            run.stdout, run.stderr = exc.printed
            self._spec.captured[self._run_id] = _Printed(run.stdout, run.stderr)
            return run
        except KeyboardInterrupt as interrupt:  # here, while the worker ran the cell
            note_interrupted(interrupt, f"while the target ran in its worker ({self._info.label})")
            raise
        try:
            return executor._finish(answer, self._spec, self._run_id, self._info.name, self._slot)
        except KeyboardInterrupt as interrupt:  # in the worker: the cell's run stopped there
            note_interrupted(interrupt, f"during the target run ({self._info.label})")
            raise

    def cancel(self) -> None:
        """Abandon the run (a worker running it is ended): nothing of it reaches the next cell."""
        self._slot.cancel(self._request_id)


def _not_loadable_here(run: Run, target: str) -> None:
    """Results holding something this process cannot rebuild are not compared, nor committed."""

    def why(value: Any) -> str | None:
        stand_in = unloadable_in(value)
        if stand_in is None:
            return None
        return f"could not be loaded from the {target} worker process: {stand_in.reason}"

    not_compared(run, why)


class _Printed:
    """What a worker run printed, replayable in the kernel.

    ``order`` (:attr:`~.records.Run.printed_order`) interleaves the two streams as they came: a
    warning between two prints, a progress bar's lines among the epochs' (``--keep target``).
    Without it (a worker that died) the standard output comes first.
    """

    def __init__(self, stdout: str, stderr: str, order: list[tuple[str, int]] = ()) -> None:
        self.stdout = stdout
        self.stderr = stderr
        texts = {"stdout": stdout, "stderr": stderr}
        counted = {name: sum(n for each, n in order if each == name) for name in texts}
        # pieces that do not add up to the texts (bytes of another encoding) are not used
        self.order = list(order) if counted == {n: len(t) for n, t in texts.items()} else []

    def show(self) -> None:
        if not self.order:
            sys.stdout.write(self.stdout)
            sys.stderr.write(self.stderr)
            return
        shown = {"stdout": 0, "stderr": 0}
        for name, count in self.order:
            stream = getattr(sys, name)
            stream.write(getattr(self, name)[shown[name] : shown[name] + count])
            stream.flush()  # (a kernel's streams each send on their own: the order would go)
            shown[name] += count
