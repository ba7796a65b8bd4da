"""Emulated ``neuron`` (Trainium, TorchNeuron) and ``tpu`` (TorchTPU) devices on the host CPU.

``emulate("neuron")`` makes unmodified CUDA-style code run with ``device="neuron"``: tensors live in
host RAM, every op runs on CPU kernels, and the profile decides which ops count as native, which
fall back to CPU (recorded as fallback events; on ``tpu`` an error unless CPU fallback is enabled),
as does every op of another library (``torchvision::nms``, a ``torch.library`` op) without a kernel
for the device, and how numbers are rounded (fp64 as fp32 and int64 as int32 on neuron; bf16-pass
matmuls on tpu).

One PrivateUse1 backend exists per process: a process emulates ``neuron`` or ``tpu``, never both,
and never next to a real torch_neuronx / torch_tpu (which always wins). Installation cannot be
undone; restart the kernel.

Limits (raise a clear error): per-device ``torch.Generator``, growing a tensor in place, device
indices other than 0, sparse and other non-strided layouts. Pinned memory is emulated: a CPU copy
that reports ``is_pinned()``. Emulated timings are host CPU time.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from neuron_workbench.emulator.profiles import DEVICES, Profile, load_profile
from neuron_workbench.errors import BackendUnavailable, WorkbenchUsageError

if TYPE_CHECKING:  # imported lazily at run time (they need torch)
    from neuron_workbench.emulator.events import (
        FallbackEvent,
        FallbackLog,
        SourceSite,
        process_log,
        record_fallbacks,
    )

__all__ = [
    "EmulatorStatus",
    "FallbackEvent",
    "FallbackLog",
    "SourceSite",
    "can_emulate",
    "configure",
    "emulate",
    "memory_stats",
    "process_log",
    "record_fallbacks",
    "read_rule_ops",
    "record_last_op",
    "reset_rule_ops",
    "status",
]


def __getattr__(name: str) -> Any:
    # The event types import torch; keep `import neuron_workbench.emulator` light until used.
    if name in ("FallbackEvent", "FallbackLog", "SourceSite", "record_fallbacks", "process_log"):
        from neuron_workbench.emulator import events

        return getattr(events, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class EmulatorStatus:
    """What is emulated in this process, from which profile, with which policies.

    Attributes
    ----------
    device
        ``"neuron"`` or ``"tpu"``.
    profile
        Profile name (coverage file stem), e.g. ``"neuron-2026-04"``.
    provenance
        One line: where the coverage list comes from.
    native_ops
        Number of ATen base ops in the coverage list.
    cpu_fallback
        Whether ops outside the list run on CPU (else they raise, as TorchTPU does by default).
    numerics
        The active numerics policies.
    capacity_bytes
        Emulated memory capacity, None for unlimited.
    emulated
        Always True.
    core
        ``"native"`` (the compiled core: real device storage, ~1 µs per op) or ``"python"`` (the
        pure-Python core, used where the native one cannot be built).
    core_note
        Why the Python core runs (one line), else ``""``.
    """

    device: str
    profile: str
    provenance: str
    native_ops: int
    cpu_fallback: bool
    numerics: dict[str, Any] = field(default_factory=dict)
    capacity_bytes: int | None = None
    emulated: bool = True
    core: str = "native"
    core_note: str = ""

    def describe(self) -> str:
        """Short label for reports."""
        return f"emulated {self.device} (profile {self.profile}; timings are host CPU time)"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "device": self.device,
            "profile": self.profile,
            "provenance": self.provenance,
            "native_ops": self.native_ops,
            "cpu_fallback": self.cpu_fallback,
            "numerics": dict(self.numerics),
            "capacity_bytes": self.capacity_bytes,
            "emulated": True,
            "core": self.core,
            "core_note": self.core_note,
        }


_lock = threading.RLock()
_installed: str | None = None
_profile: Profile | None = None
_options: dict[str, Any] = {}


def _real_backend_reason(device: str) -> str:
    import torch

    name = torch._C._get_privateuse1_backend_name()
    for mod in ("torch_neuronx", "torch_tpu"):
        module = sys.modules.get(mod)
        # the emulated tpu's own torch_tpu stand-in (the CPU-fallback switch) is not a real backend
        if module is not None and not getattr(module, "__neuron_workbench_emulated__", False):
            return (
                f"emulated {device} is not available: the real backend {mod} is loaded in this "
                "process (it owns PrivateUse1 and always wins)"
            )
    if _installed is not None and _installed != device:
        return (
            f"emulated {device} is not available: this process already emulates {_installed} "
            "(one PrivateUse1 backend per process); restart the kernel"
        )
    if _installed is None and name != "privateuseone":
        return (
            f"emulated {device} is not available: PrivateUse1 is already taken by '{name}' "
            "(a real or other out-of-tree backend); restart without it"
        )
    return ""


def can_emulate(device: str) -> tuple[bool, str]:
    """Whether :func:`emulate` would succeed for ``device``, without installing anything.

    Parameters
    ----------
    device
        ``"neuron"`` or ``"tpu"``.

    Returns
    -------
    tuple
        ``(True, "")`` or ``(False, reason)``.
    """
    if device not in DEVICES:
        return False, f"unknown device {device!r}; expected one of {', '.join(DEVICES)}"
    with _lock:
        reason = _real_backend_reason(device)
    return (not reason), reason


def status() -> EmulatorStatus | None:
    """The emulator's status, or None when nothing is installed in this process."""
    if _installed is None or _profile is None:
        return None
    from neuron_workbench.emulator import _core

    p = _profile
    if p.device == "neuron":
        numerics: dict[str, Any] = {
            "float64": "computed as float32" if _core.NARROW_64BIT else "float64",
            "int64": "computed as int32" if _core.NARROW_64BIT else "int64",
            "autocast_default": "float16",
            "bf16_matmul": _core.MATMUL_PASSES == 1,
        }
    else:
        names = {1: "DEFAULT (1-pass bf16)", 3: "HIGH (3-pass bf16)", 6: "HIGHEST (6-pass bf16)"}
        numerics = {
            "matmul_precision": names.get(_core.MATMUL_PASSES, "exact fp32"),
            "float64": "computed as float32" if _core.NARROW_64BIT else "float64",
            "int64": "computed as int32" if _core.NARROW_64BIT else "int64",
            "autocast_default": "bfloat16",  # TorchTPU's device module's (updates-2026-12.md)
        }
    return EmulatorStatus(
        device=p.device,
        profile=p.name,
        provenance=p.provenance,
        native_ops=len(p.native_ops),
        cpu_fallback=_core.CPU_FALLBACK,
        numerics=numerics,
        capacity_bytes=_core.MEM.capacity,
        core="native" if _core.NATIVE_CORE is not None else "python",
        core_note="" if _core.NATIVE_CORE is not None else _native_reason(),
    )


def _native_reason() -> str:
    from neuron_workbench.emulator import native

    return native.unavailable_reason() or ""


_UNSET: Any = object()


def configure(
    *,
    cpu_fallback: bool | None = None,
    bf16_matmul: bool | None = None,
    capacity_bytes: int | None = _UNSET,
    narrow_64bit: bool | None = None,
    matmul_precision: str | None = None,
    fallback_warnings: bool | None = None,
) -> EmulatorStatus:
    """Change runtime policies of the installed emulator.

    Parameters
    ----------
    cpu_fallback
        Run ops outside the coverage on CPU (True) or raise TorchTPU's error (False).
    bf16_matmul
        neuron "what-if" policy: round fp32 matmul/conv inputs to bf16, accumulate in fp32.
        TorchNeuron does not auto-cast by default, so this is off by default.
    capacity_bytes
        Emulated device memory; allocations beyond it raise ``torch.OutOfMemoryError``.
        None removes the limit.
    narrow_64bit
        Compute float64 as float32 and int64 arithmetic as int32 (neuron default; off for tpu,
        whose 64-bit behaviour is not documented).
    matmul_precision
        tpu: ``"DEFAULT"``, ``"HIGH"`` or ``"HIGHEST"`` (1/3/6-pass bf16).
    fallback_warnings
        tpu with CPU fallback: print TorchTPU's per-call fallback warning on stderr (default True).

    Returns
    -------
    EmulatorStatus
        The new status.
    """
    from neuron_workbench.emulator import _core

    if _installed is None:
        raise WorkbenchUsageError("the emulator is not installed; call emulate(device) first")
    with _lock:
        if cpu_fallback is not None:
            _core.CPU_FALLBACK = bool(cpu_fallback)
        if bf16_matmul is not None:
            if _installed == "tpu":
                raise WorkbenchUsageError(
                    "bf16_matmul is the neuron what-if policy; on tpu use matmul_precision"
                )
            _core.MATMUL_PASSES = 1 if bf16_matmul else 0
        if matmul_precision is not None:
            if _installed != "tpu":
                raise WorkbenchUsageError("matmul_precision applies to the emulated tpu only")
            key = matmul_precision.upper()
            if key not in ("DEFAULT", "HIGH", "HIGHEST"):
                raise WorkbenchUsageError(
                    f"matmul_precision must be DEFAULT, HIGH or HIGHEST, not {matmul_precision!r}"
                )
            _core.MATMUL_PASSES = {"DEFAULT": 1, "HIGH": 3, "HIGHEST": 6}[key]
        if capacity_bytes is not _UNSET:
            if capacity_bytes is not None and capacity_bytes < 0:
                raise WorkbenchUsageError("capacity_bytes must be >= 0 or None")
            _core.MEM.capacity = capacity_bytes
        if narrow_64bit is not None:
            _core.NARROW_64BIT = bool(narrow_64bit)
        if fallback_warnings is not None:
            _core.TPU_WARN_EVERY_CALL = bool(fallback_warnings)
        _core.reset_plans()
    st = status()
    assert st is not None
    return st


def emulate(
    device: str = "neuron",
    *,
    coverage: str | os.PathLike | None = None,
    cpu_fallback: bool | None = None,
    bf16_matmul: bool | None = None,
    capacity_bytes: int | None = _UNSET,
) -> EmulatorStatus:
    """Install the emulated device in this process (idempotent for the same device).

    A repeated call for the installed device changes only the options it passes explicitly (so
    callers that "make sure it is installed" do not reset a user's policies).

    Parameters
    ----------
    device
        ``"neuron"`` or ``"tpu"``.
    coverage
        A coverage file to use instead of the packaged profile (only at first install).
    cpu_fallback
        Default: True for neuron (as TorchNeuron), False for tpu (as TorchTPU).
    bf16_matmul
        neuron what-if numerics: bf16 matmul/conv inputs with fp32 accumulation (default off).
    capacity_bytes
        Optional emulated memory capacity in bytes (default unlimited).

    Returns
    -------
    EmulatorStatus
        What is installed.

    Raises
    ------
    BackendUnavailable
        Another PrivateUse1 backend owns the process (a real backend or the other emulated
        device).
    """
    global _installed, _profile
    if device not in DEVICES:
        raise WorkbenchUsageError(
            f"unknown device {device!r} for emulation; expected one of {', '.join(DEVICES)}"
        )
    with _lock:
        reason = _real_backend_reason(device)
        if reason:
            raise BackendUnavailable(reason)
        if _installed == device:
            return configure(
                cpu_fallback=cpu_fallback,
                bf16_matmul=bf16_matmul if device == "neuron" else None,
                capacity_bytes=capacity_bytes,
            )
        if coverage is not None and not os.path.isfile(coverage):
            raise WorkbenchUsageError(f"coverage file not found: {coverage}")
        profile = load_profile(device, coverage)
        from neuron_workbench.emulator import _install

        _install.install(device, profile, status)
        _installed = device
        _profile = profile
        from neuron_workbench.emulator import _core

        _core.CPU_FALLBACK = profile.fallback_default if cpu_fallback is None else cpu_fallback
        _core.NARROW_64BIT = device == "neuron"
        if device == "neuron":
            _core.MATMUL_PASSES = 1 if bf16_matmul else 0
        else:
            if bf16_matmul:
                raise WorkbenchUsageError(
                    "bf16_matmul is the neuron what-if policy; the tpu uses bf16 passes already"
                )
            _core.MATMUL_PASSES = 1
        _core.MEM.capacity = None if capacity_bytes is _UNSET else capacity_bytes
        _core.reset_plans()
    st = status()
    assert st is not None
    return st


def memory_stats() -> dict[str, int]:
    """Live emulated-device bytes: ``{"current_bytes", "peak_bytes"}`` (zeros if not installed)."""
    if _installed is None:
        return {"current_bytes": 0, "peak_bytes": 0}
    from neuron_workbench.emulator import _core

    return {"current_bytes": _core.MEM.current, "peak_bytes": _core.MEM.peak}


#: The numeric rules :func:`read_rule_ops` counts: float32 matmul-like ops (matmuls,
#: convolutions, attention) computed with bf16 passes (tpu DEFAULT/HIGH/HIGHEST, the neuron bf16
#: what-if), those of them computed with a single pass (``"tpu-matmul-1pass"``: tpu DEFAULT, the
#: what-if), ops whose float64 inputs were computed as float32, ops whose int64 inputs were
#: computed as int32 (neuron), and those of them in which int32 changed a value
#: (``"int64-wrapped"``: an input or a result beyond int32's range wrapped around), and the float64
#: ops in which float32 changed a value (``"fp64-rounded"``: a value float32 cannot hold was
#: rounded, where float64 would have kept it).
RULES = ("tpu-matmul", "tpu-matmul-1pass", "fp64", "int64", "int64-wrapped", "fp64-rounded")


def read_rule_ops() -> dict[str, int]:
    """How many ops each numeric rule has touched in this process since :func:`reset_rule_ops`.

    Evidence for hints: a rule can explain a difference only if it ran. Counted by both cores
    (one increment per op; the native core counts the 64-bit narrowing in C++).

    Returns
    -------
    dict of str to int
        Keys :data:`RULES`; all zero when nothing is emulated here.
    """
    if _installed is None:
        return dict.fromkeys(RULES, 0)
    from neuron_workbench.emulator import _core

    return _core.rule_ops()


def reset_rule_ops() -> None:
    """Zero the counters :func:`read_rule_ops` reads (nothing happens when nothing is emulated)."""
    if _installed is None:
        return
    from neuron_workbench.emulator import _core

    with _lock:
        _core.reset_rule_ops()


def record_last_op(slot: object | None) -> bool:
    """Have the native core write the name of each op the device runs into ``slot``.

    From this call on, every op the emulated device runs, from any thread, writes its name,
    ``namespace::name[.overload]`` (e.g. ``aten::add.Tensor``, ``aten::cos``), into the start of
    ``slot``: truncated to ``len(slot) - 2`` bytes and NUL-padded, so splitting the buffer at the
    first NUL gives the name. The last byte is 0 while the named op runs and 1 once it has ended
    (a top-level op returned), so a crash in host code after it is not taken for one inside it.
    Ops registered outside aten (``mylib::myop``, custom ops) write theirs too when called from
    Python, on any device: their kernels are not the device's (while recording, ``torch.ops``
    calls pass through a small Python wrapper for this; the profiler's ``record_function`` markers
    are not written). When an op ends inside another (a custom op's body, a kernel's own device
    ops), the slot names the enclosing op again, so it holds the innermost op running, or the last
    top-level op once none is. Host ops (on CPU tensors) are not the device's and leave the slot as
    it is. The device's kernels do the writes themselves, only while recording is on (a few
    nanoseconds per op, no Python), so a process that may die (a worker) can leave in a
    memory-mapped file the op it died in.

    Parameters
    ----------
    slot
        A writable buffer of at least two bytes (an ``mmap.mmap``, a ``bytearray``). It is kept
        alive, and cannot be closed or resized, until recording is turned off or pointed
        elsewhere. None turns recording off.

    Returns
    -------
    bool
        True when the native core records (or, for None, stopped recording) in this process;
        False when it cannot: nothing emulated here (a real device, or the emulator not
        installed) or the pure-Python core runs. The caller then records ops its own way.

    Raises
    ------
    TypeError
        ``slot`` is not a writable buffer.
    ValueError
        ``slot`` is empty.
    """
    with _lock:
        if _installed is None:
            return False
        from neuron_workbench.emulator import _core, _native_core

        module = _core.NATIVE_CORE
        if module is None:
            return False
        _native_core.record_last_op(module, slot)
        return True
