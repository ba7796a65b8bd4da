"""Google TPU through TorchTPU (device ``tpu``), or the emulated ``tpu`` device.

TorchTPU's CPU fallback is off by default: an op without a TPU kernel raises
``operator '<op>' is not implemented for TPU. Please file a feature request``
(``shared/notes/torchtpu.md`` §3). The emulated device does the same, so a run that reaches such an
op ends in an error naming it.

To list every missing op of a cell in one run, ask for the full list
(``get_backend("tpu", list_fallbacks=True)``, or ``NEURON_WORKBENCH_TPU_LIST_FALLBACKS=1``): the
adapter switches the CPU fallback on for the run
(``torch_tpu._internal.execution_mode.enable_cpu_fallback``), takes TorchTPU's per-call warning
(``operator '<op>' is not implemented for TPU. Falling back to CPU``, written by C++ on every call)
off the process's stderr, deduplicates it, and counts the calls with a dispatch recorder.

The notes document no ``torch.tpu`` device, memory, seed or synchronize functions, so none is
called: PyTorch's generic ``torch.accelerator`` API is tried instead, and what does not work is
reported as "not available".
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from neuron_workbench.backends.accelerator import (
    NOT_AVAILABLE,
    AcceleratorBackend,
    DispatchCallRecorder,
)
from neuron_workbench.backends.base import FallbackRecording
from neuron_workbench.opnames import normalize_op

#: Environment variable that asks for the full list of missing ops (CPU fallback on for runs).
LIST_FALLBACKS_ENV = "NEURON_WORKBENCH_TPU_LIST_FALLBACKS"

#: Where TorchTPU 0.2.0 keeps its CPU-fallback switch (torchtpu.md §3).
SWITCH_MODULE = "torch_tpu._internal.execution_mode"
SWITCH_NAME = "enable_cpu_fallback"

#: TorchTPU's error for an op without a TPU kernel while its CPU fallback is off (torchtpu.md §3).
UNIMPLEMENTED_ERROR = re.compile(
    r"operator '(?P<op>[^']+)' is not implemented for TPU\. Please file a feature request"
)
#: TorchTPU's per-call warning when the CPU fallback runs an op (torchtpu.md §3).
FALLBACK_WARNING = re.compile(
    r"operator '(?P<op>[^']+)' is not implemented for TPU\. Falling back to CPU"
)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class StderrWarnings:
    """Take TorchTPU's fallback warnings off file descriptor 2 while a block runs.

    The warnings come from C++ (``ABSL_LOG(WARNING)``), so they bypass ``sys.stderr``; the
    descriptor itself is redirected to a temporary file. Afterwards matching lines are counted
    per op (first text kept) and every other line is written back to the real stderr.

    Attributes
    ----------
    ops : dict
        Op name → ``[count, first warning line]``, in first-seen order.
    """

    def __init__(self) -> None:
        self.ops: dict[str, list[Any]] = {}
        self._saved: int | None = None
        self._file: Any = None

    def __enter__(self) -> StderrWarnings:
        try:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            self._file = tempfile.TemporaryFile()
            self._saved = os.dup(2)
            os.dup2(self._file.fileno(), 2)
        except OSError:  # no usable descriptor 2 (e.g. a detached process): capture nothing
            self._restore()
        return self

    def _restore(self) -> None:
        if self._saved is not None:
            os.dup2(self._saved, 2)
            os.close(self._saved)
            self._saved = None

    def __exit__(self, *exc: Any) -> None:
        if self._file is None:
            return
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        self._restore()
        self._file.seek(0)
        text = self._file.read().decode("utf-8", errors="replace")
        self._file.close()
        self._file = None
        others = []
        for line in text.splitlines(keepends=True):
            match = FALLBACK_WARNING.search(line)
            if match is None:
                others.append(line)
                continue
            entry = self.ops.setdefault(match.group("op"), [0, line.strip()])
            entry[0] += 1
        if others:
            with contextlib.suppress(OSError):
                os.write(2, "".join(others).encode("utf-8"))


class TpuBackend(AcceleratorBackend):
    """TorchTPU's ``tpu`` device; emulated when ``torch_tpu`` is not loaded.

    Parameters
    ----------
    list_fallbacks : bool, optional
        Run with the CPU fallback on and report every op that fell back (the full list of missing
        ops), instead of stopping at the first with TorchTPU's error. Default: the
        ``NEURON_WORKBENCH_TPU_LIST_FALLBACKS`` environment variable, else off (TorchTPU's default).
    """

    name = "tpu"
    sdk_module = "torch_tpu"
    sdk_distribution = "torch-tpu"
    documented_calls: frozenset[str] = frozenset()  # torchtpu.md documents no torch.tpu device API

    def __init__(self, list_fallbacks: bool | None = None) -> None:
        self.list_fallbacks = (
            _env_flag(LIST_FALLBACKS_ENV) if list_fallbacks is None else bool(list_fallbacks)
        )

    def options(self) -> dict[str, Any]:
        """``{"list_fallbacks": ...}`` (see :meth:`Backend.options`)."""
        return {"list_fallbacks": self.list_fallbacks}

    def _switch(self) -> Any:
        """The module holding ``enable_cpu_fallback``, or None when it is not there."""
        try:
            module = importlib.import_module(SWITCH_MODULE)
        except Exception:  # an SDK version without it: reported as not available
            return None
        return module if hasattr(module, SWITCH_NAME) else None

    def _fallback_tracking_how(self) -> str:
        if self._switch() is None:
            return f"{NOT_AVAILABLE} (no {SWITCH_MODULE}.{SWITCH_NAME})"
        return (
            f"{SWITCH_MODULE}.{SWITCH_NAME} + fallback warnings (names) + dispatch recorder "
            "(counts, sites)"
        )

    def _extra_details(self) -> dict[str, Any]:
        # Only the non-default mode is named, so default reports read as before.
        if not self.list_fallbacks:
            return {}
        return {"fallback_mode": "full list (CPU fallback on for the run)"}

    @contextlib.contextmanager
    def _emulated_fallback_mode(self) -> Iterator[None]:
        if not self.list_fallbacks:
            yield
            return
        from neuron_workbench import emulator

        status = emulator.status()
        previous = bool(status.cpu_fallback) if status is not None else False
        # Events carry the counts, so the per-call warnings would only flood the cell's output.
        emulator.configure(cpu_fallback=True, fallback_warnings=False)
        try:
            yield
        finally:
            emulator.configure(cpu_fallback=previous, fallback_warnings=True)

    @contextlib.contextmanager
    def _real_fallback_tracking(self, recording: FallbackRecording) -> Iterator[None]:
        from torch._C import DispatchKey

        switch = self._switch()
        previous = bool(getattr(switch, SWITCH_NAME)) if switch is not None else False
        if self.list_fallbacks and switch is not None:
            setattr(switch, SWITCH_NAME, True)

        def has_tpu_kernel(func: Any) -> bool:
            # TpuMissingOpFallback handles only ops without a TPU kernel of their own.
            return bool(func.has_kernel_for_dispatch_key(DispatchKey.PrivateUse1))

        recorder = DispatchCallRecorder(skip=has_tpu_kernel)
        warnings = StderrWarnings()
        # With the fallback off, a missing op raises and ends the run: nothing to count, so the
        # recorder stays out of the way (the warnings are still taken, should the cell turn the
        # fallback on itself; their ops are then listed without counts).
        fallback_on = self.list_fallbacks or previous
        try:
            with warnings, recorder.recording() if fallback_on else contextlib.nullcontext():
                yield
        finally:
            if self.list_fallbacks and switch is not None:
                setattr(switch, SWITCH_NAME, previous)
            by_op: dict[str, list[Any]] = {}
            for name, (count, line) in warnings.ops.items():
                entry = by_op.setdefault(normalize_op(name), [0, line])
                entry[0] += count
            events = recorder.events_for(
                list(warnings.ops), source="TorchTPU fallback warnings + dispatch recorder"
            )
            for event in events:
                count, line = by_op[str(event["op"])]
                event["warning"] = line
                event["warnings"] = count
            recording.events = events
