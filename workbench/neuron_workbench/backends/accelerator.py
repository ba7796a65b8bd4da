"""Shared adapter for PrivateUse1 accelerators (``neuron``, ``tpu``): real SDK or the emulator.

With the vendor's backend loaded (``torch_neuronx`` / ``torch_tpu`` autoload at ``import torch`` on
hardware), the real device is used. Otherwise the workbench's emulated device is installed on first
use, and every report labels it as emulated.

On a real device the adapter calls only what ``shared/notes/`` documents for that SDK
(:attr:`AcceleratorBackend.documented_calls`); anything else goes through PyTorch's generic
``torch.accelerator`` API, guarded, or is reported as "not available" (:meth:`capabilities`).
An SDK package that marks itself as a test fake (``__neuron_workbench_fake__``) is treated as real
by every code path, and every report it produces says "fake".
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from neuron_workbench.backends.base import (
    Availability,
    Backend,
    BackendInfo,
    FallbackRecording,
    MemoryStats,
)
from neuron_workbench.dispatch_calls import call_op
from neuron_workbench.opnames import normalize_op

#: What :meth:`AcceleratorBackend.capabilities` says when neither the SDK's documented API nor
#: PyTorch's generic one can do something.
NOT_AVAILABLE = "not available"

#: The attribute a test fake of an SDK package sets (a one-line description of the fake).
FAKE_MARKER = "__neuron_workbench_fake__"

_BACKWARD_PROBED: dict[str, str] = {}


def _check_emulated_backward(device_type: str) -> None:
    """Fail clearly if autograd cannot reach the emulated device in this process.

    PyTorch's autograd engine sizes its per-device queues once, at the first backward pass of the
    process. If that happened before the emulator registered its device, every backward on it trips
    an internal assert; the only cure is a fresh process with the emulator installed first.
    """
    if device_type not in _BACKWARD_PROBED:
        import torch

        from neuron_workbench.errors import BackendUnavailable

        probe = torch.ones(1, device=device_type, requires_grad=True)
        try:
            (probe * 2).sum().backward()
            _BACKWARD_PROBED[device_type] = ""
        except RuntimeError as exc:
            if "device_ready_queues_" not in str(exc):
                raise
            _BACKWARD_PROBED[device_type] = (
                f"emulated {device_type} cannot run backward passes in this process: autograd "
                "started before the emulator was installed. Restart the kernel and run "
                "`%load_ext neuron_workbench` (or set NEURON_WORKBENCH_EMULATE) before any "
                "training code"
            )
            raise BackendUnavailable(_BACKWARD_PROBED[device_type]) from None
    if _BACKWARD_PROBED[device_type]:
        from neuron_workbench.errors import BackendUnavailable

        raise BackendUnavailable(_BACKWARD_PROBED[device_type])


# ---- counting op calls at dispatch level (counts and sites for name-only fallback signals) ------

# Host/device plumbing that is never reported as a fallback: skip the stack walk for it.
_PLUMBING = frozenset(
    {
        "_to_copy", "copy_", "_copy_from", "_copy_from_and_resize", "_local_scalar_dense", "empty",
        "empty_strided", "detach", "alias", "view", "as_strided", "_reshape_alias", "clone",
        "lift_fresh", "set_", "resize_", "_unsafe_view", "is_pinned", "record_stream",
    }
)  # fmt: skip


class DispatchCallRecorder:
    """Counts every ATen op call of a run, keyed as the emulator keys its fallback events.

    A real SDK names the ops that fell back (TorchNeuron's ``get_fallback_ops()``, TorchTPU's
    per-call warnings) but not how often or from which line. This recorder sits at the Python
    dispatch key (a ``TorchDispatchMode``, like TorchTPU's ``OpTracer``), so it sees each op as
    the backend receives it; :meth:`events_for` keeps the ops the SDK named. Attribution (user
    line, ``nn.Module``, forward/backward, autograd node) is the emulator's, so events from a
    real device and from the emulated one read the same.

    Parameters
    ----------
    skip : callable, optional
        ``skip(func) -> bool``: ops that can never be fallbacks (e.g. ones with a device kernel
        where a kernel rules a fallback out); they are counted without a stack walk.
    per_call : tuple of two callables, optional
        ``(reset, read)``: ``reset()`` runs before every op the recorder sees and ``read()``
        after it, returning the names of the ops that fell back meanwhile (e.g. TorchNeuron's
        ``clear_op_tracking`` and ``synchronize`` + ``get_fallback_ops``). Each such name is
        then counted at the line of that call, so ops that fall back inside another op's kernel
        (``normal_`` inside ``randn``) get counts and lines too. Without it, ops are counted
        by their own name only.
    """

    def __init__(
        self,
        skip: Callable[[Any], bool] | None = None,
        per_call: tuple[Callable[[], Any], Callable[[], Iterable[str]]] | None = None,
    ) -> None:
        self._skip = skip
        self._per_call = per_call
        self._skipped: dict[Any, bool] = {}
        self._events: dict[tuple, Any] = {}
        self._forward_by_seq: dict[int, tuple] = {}
        self.calls = 0
        #: Every name ``per_call``'s ``read()`` returned during the run.
        self.named: set[str] = set()

    def _attribution(self, seq: int | None) -> tuple[Any, str, str, str, str]:
        """(site, module, module type, phase, autograd node) of the op being recorded."""
        import torch

        from neuron_workbench.sites import find_site_and_module

        node = torch._C._current_autograd_node()
        if node is not None:
            site, module, module_type = self._forward_by_seq.get(
                node._sequence_nr(), (None, "", "")
            )
            return site, module, module_type, "backward", node.name()
        site, module, module_type = find_site_and_module(4)
        if seq is not None:
            self._forward_by_seq[seq] = (site, module, module_type)
        return site, module, module_type, "forward", ""

    def _note(
        self, func: Any, args: Any, seq: int | None, seconds: float, names: Any = None
    ) -> None:

        from neuron_workbench.emulator.events import FallbackEvent

        self.calls += 1
        if names is not None:
            names = [str(n) for n in names]
            if not names:
                return
            self.named.update(names)
        else:
            skipped = self._skipped.get(func)
            if skipped is None:
                base = func._schema.name.split("::", 1)[-1]
                skipped = base in _PLUMBING or bool(self._skip is not None and self._skip(func))
                self._skipped[func] = skipped
            if skipped:
                return
            s = func._schema
            names = [f"{s.name}.{s.overload_name}" if s.overload_name else s.name]
        site, module, module_type, phase, node_name = self._attribution(seq)
        for overload in names:
            key = (overload, site, phase, module, node_name)
            event = self._events.get(key)
            if event is not None:
                event.count += 1
                event.cpu_time_s += seconds
                continue
            self._events[key] = FallbackEvent.first_call(
                normalize_op(overload),
                overload,
                args,
                seconds,
                phase=phase,
                site=site,
                module=module,
                module_type=module_type,
                autograd_node=node_name,
            )

    @contextlib.contextmanager
    def recording(self) -> Iterator[DispatchCallRecorder]:
        """Record while the block runs (the mode reaches backward passes through autograd)."""
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        recorder = self
        per_call = self._per_call

        class _Mode(TorchDispatchMode):
            @classmethod
            def ignore_compile_internals(cls) -> bool:
                # Otherwise torch.compile skips every frame while the mode is on (the cell's
                # compiled code would run eagerly); a compiled graph's fallbacks are still
                # named by the SDK.
                return True

            def __torch_dispatch__(
                self, func: Any, types: Any, args: Any = (), kwargs: Any = None
            ) -> Any:
                seq = None
                if torch.is_grad_enabled() and any(
                    isinstance(a, torch.Tensor) and a.requires_grad for a in args
                ):
                    # The autograd node of this op (if any) was made just before dispatch got here.
                    seq = torch._C._autograd._get_sequence_nr() - 1
                if per_call is not None:
                    per_call[0]()
                t0 = time.perf_counter()
                out = call_op(func, args, kwargs)
                seconds = time.perf_counter() - t0
                names = per_call[1]() if per_call is not None else None
                recorder._note(func, args, seq, seconds, names)
                return out

        with _Mode():
            yield self

    def events_for(self, names: Iterable[str], source: str) -> list[dict[str, Any]]:
        """Event dicts of the calls to the ops in ``names`` (any overload spelling).

        Ops the SDK named but the recorder never saw (reached inside another op's kernel) get one
        event with ``count`` None and no site.
        """
        wanted = {normalize_op(n): str(n) for n in names}
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        for event in self._events.values():
            if event.op in wanted:
                seen.add(event.op)
                out.append({**event.to_dict(), "source": source})
        for op in sorted(set(wanted) - seen):
            out.append(
                {
                    "op": op,
                    "overload": wanted[op],
                    "count": None,
                    "site": None,
                    "phase": "",
                    "source": f"{source} (not seen at dispatch: no count or site)",
                }
            )
        return out


# ---- the adapter -------------------------------------------------------------------------------


class AcceleratorBackend(Backend):
    """A PrivateUse1 device that is either real (vendor SDK) or emulated (pure Python)."""

    #: Import name of the vendor's PyTorch backend package.
    sdk_module: str = ""
    #: Its distribution name on PyPI (for the version).
    sdk_distribution: str = ""
    #: ``torch.<device>`` functions the notes document for the real SDK; nothing else is called.
    documented_calls: frozenset[str] = frozenset()

    def _real_backend_loaded(self) -> bool:
        """True when the vendor backend, not our emulator, owns PrivateUse1 as this device."""
        import torch

        if torch._C._get_privateuse1_backend_name() != self.name:
            return False
        from neuron_workbench import emulator

        status = emulator.status()
        return status is None or status.device != self.name

    def is_emulated(self) -> bool:
        """Whether runs on this backend go to the emulated device."""
        return not self._real_backend_loaded()

    def memory_on_host(self) -> bool:
        """True for the emulated device on the native core (its storages are host memory)."""
        if not self.is_emulated():
            return False
        from neuron_workbench import emulator

        status = emulator.status()
        return status is not None and status.device == self.name and status.core == "native"

    def sdk(self) -> Any:
        """The vendor package (imported lazily), or None when it cannot be imported."""
        module = sys.modules.get(self.sdk_module)
        if module is not None:
            return module
        try:
            return importlib.import_module(self.sdk_module)
        except Exception:  # a broken SDK install is reported by availability(), not raised here
            return None

    def fake_description(self) -> str:
        """The test fake's description when the loaded SDK is a fake, else ``""``."""
        if self.is_emulated():
            return ""
        return str(getattr(self.sdk(), FAKE_MARKER, "") or "")

    def sdk_version(self) -> str:
        """The installed SDK's version (``""`` when not installed)."""
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as dist_version

        for name in (self.sdk_distribution, self.sdk_module):
            if name:
                with contextlib.suppress(PackageNotFoundError, ValueError):
                    return dist_version(name)
        return ""

    def kind(self) -> str:
        """``real``, ``fake`` (a test stand-in for the SDK) or ``emulated``."""
        if self.is_emulated():
            return "emulated"
        return "fake" if self.fake_description() else "real"

    # -- documented calls, guarded -------------------------------------------------------------
    def _documented(self, name: str) -> Callable[..., Any] | None:
        """``torch.<device>.<name>`` if the notes document it and it exists, else None."""
        if name not in self.documented_calls:
            return None
        fn = getattr(self._device_module(), name, None)
        return fn if callable(fn) else None

    @staticmethod
    def _generic(name: str) -> Callable[..., Any] | None:
        import sys

        import torch  # noqa: F401 - torch.accelerator is imported with it

        # the module itself: during a run the ``torch.accelerator`` attribute answers for CUDA
        accelerator = sys.modules.get("torch.accelerator")
        fn = getattr(accelerator, name, None)
        return fn if callable(fn) else None

    def _device_call(self, name: str, *args: Any) -> tuple[bool, Any]:
        """Call a documented ``torch.<device>`` function, else ``torch.accelerator``'s.

        Returns ``(True, value)`` or ``(False, None)`` when neither exists or works here.
        """
        for fn in (self._documented(name), self._generic(name)):
            if fn is None:
                continue
            try:
                return True, fn(*args)
            except (RuntimeError, NotImplementedError, AttributeError, TypeError, ValueError):
                continue
        return False, None

    def capabilities(self) -> dict[str, str]:
        """What this backend can do here, and through which call (or ``"not available"``).

        Keys: ``devices``, ``synchronize``, ``memory``, ``seed``, ``fallback tracking`` (and
        ``coverage``, the op-coverage profile, when emulated).
        """
        if self.is_emulated():
            from neuron_workbench.emulator import status
            from neuron_workbench.emulator.profiles import load_profile

            st = status()
            if st is not None and st.device == self.name:
                coverage = f"{st.profile} ({st.native_ops} native ops)"
            else:
                profile = load_profile(self.name, None)
                coverage = f"{profile.name} ({len(profile.native_ops)} native ops)"
            return {
                "devices": "1 (emulated)",
                "coverage": coverage,
                "synchronize": "emulated (synchronous)",
                "memory": "emulator accounting of live device tensors",
                "seed": "host generator (the emulated device draws from it)",
                "fallback tracking": "emulator events (counts, sites)",
            }
        caps: dict[str, str] = {}
        ok, count = self._device_call("device_count")
        caps["devices"] = str(count) if ok else NOT_AVAILABLE
        for key, call in (("synchronize", "synchronize"), ("memory", "memory_allocated")):
            if self._documented(call) is not None:
                caps[key] = f"torch.{self.name}.{call}"
            elif self._device_call(call)[0]:
                caps[key] = f"torch.accelerator.{call}"
            else:
                caps[key] = NOT_AVAILABLE
        caps["seed"] = (
            f"torch.{self.name}.manual_seed_all"
            if self._documented("manual_seed_all") is not None
            else f"{NOT_AVAILABLE} (host generator only)"
        )
        caps["fallback tracking"] = self._fallback_tracking_how()
        return caps

    def _fallback_tracking_how(self) -> str:
        """How the real SDK's fallbacks are found (subclasses say); base: not available."""
        return NOT_AVAILABLE

    def _not_available(self) -> list[str]:
        return sorted(k for k, v in self.capabilities().items() if v.startswith(NOT_AVAILABLE))

    # -- Backend hooks -------------------------------------------------------------------------
    def _availability_impl(self) -> Availability:
        if self._real_backend_loaded():
            documented = self._documented("is_available")
            if documented is not None:
                if documented():
                    return Availability(True)
                return Availability(
                    False,
                    f"{self.name} is not available: {self.sdk_module} is loaded but sees no device",
                )
            # Nothing documented to ask: the SDK renames PrivateUse1 only when it found hardware.
            return Availability(True)
        from neuron_workbench import emulator

        status = emulator.status()
        if status is not None and status.device == self.name:
            return Availability(True, emulated=True)
        ok, reason = emulator.can_emulate(self.name)
        if ok:
            return Availability(True, emulated=True)
        return Availability(False, reason)

    def _activate_impl(self) -> None:
        # One entry per activation (activations nest: a what-if run inside a run's activation).
        threads_before = self.__dict__.setdefault("_autograd_threads_before", [])
        if not self.is_emulated():
            threads_before.append(None)  # a real device keeps autograd's device threads
            return
        import torch

        from neuron_workbench import emulator

        status = emulator.status()
        if status is None or status.device != self.name:
            emulator.emulate(self.name)
        # Backward passes of the run go on the thread that calls backward, as on the CPU: a real
        # accelerator's autograd device thread is a host thread here, whose two wake-ups per
        # backward call cost the emulated run about 0.1 ms each call (a small GPT step: 15.3 ms
        # against 14.5 ms). Torch's thread-local state travels to that thread anyway; what differs
        # from a real device is Python's own: a hook reads the calling thread's threading.local
        # and context variables (as on CPU), where a device thread would not have them. CUDA code
        # cannot rely on them in hooks, since CUDA runs hooks on its device thread too.
        # It also keeps the run's backward passes off the engine's per-device queues, which are
        # sized at the process's first backward pass: with --executor inprocess the reference
        # has often run one on the CPU before the emulator was installed here (the cell's own,
        # or an earlier cell's), and a device thread's queue for the emulated device is missing.
        threads_before.append(torch._C._is_multithreading_enabled())
        torch._C._set_multithreading_enabled(False)
        try:
            _check_emulated_backward(self.name)
        except BaseException:
            torch._C._set_multithreading_enabled(bool(threads_before.pop()))
            raise

    def _deactivate_impl(self) -> None:
        threads_before = self.__dict__.get("_autograd_threads_before")
        if threads_before:
            before = threads_before.pop()
            if before is not None:
                import torch

                torch._C._set_multithreading_enabled(before)

    def _device_module(self) -> Any:
        import torch

        return getattr(torch, self.name)

    def _info_impl(self) -> BackendInfo:
        import torch

        if self.is_emulated():
            from neuron_workbench import emulator

            status = emulator.status()
            details: dict[str, Any] = {"torch": torch.__version__}
            if status is not None:
                details.update(
                    profile=status.profile,
                    provenance=status.provenance,
                    native_ops=status.native_ops,
                    cpu_fallback=status.cpu_fallback,
                    numerics=dict(status.numerics),
                    timings="host CPU time",
                )
            details.update(self._extra_details())
            return BackendInfo(
                name=self.name,
                device=f"{self.name}:0",
                device_name=f"emulated {self.name} (host CPU)",
                emulated=True,
                details=details,
            )
        name = self.real_device_name()
        details = {
            "torch": torch.__version__,
            self.sdk_module: self.sdk_version(),
            "kind": self.kind(),
            "not_available": self._not_available(),
        }
        fake = self.fake_description()
        if fake:
            details["fake"] = fake
            name = f"{name} (fake {self.sdk_module} {details[self.sdk_module]})".replace("  ", " ")
        details.update(self._extra_details())
        return BackendInfo(
            name=self.name, device=f"{self.name}:0", device_name=name, details=details
        )

    def real_device_name(self) -> str:
        """The real (or fake) device's name from documented calls, else ``<device>:0``."""
        props = self._documented("get_device_properties")
        if props is not None:
            with contextlib.suppress(Exception):
                return str(props(0).name)
        get_name = self._documented("get_device_name")
        if get_name is not None:
            with contextlib.suppress(Exception):
                return str(get_name(0))
        return f"{self.name}:0"

    def _extra_details(self) -> dict[str, Any]:
        """Backend-specific facts for :class:`BackendInfo` (subclasses add)."""
        return {}

    def _synchronize_impl(self) -> None:
        if self.is_emulated():
            self._device_module().synchronize()
            return
        self._device_call("synchronize")

    def _manual_seed_impl(self, seed: int) -> None:
        # The emulator shares the host generator; a real device has its own (if the SDK documents
        # how to seed it).
        if not self.is_emulated():
            fn = self._documented("manual_seed_all")
            if fn is not None:
                fn(seed)

    def _memory_stats_impl(self) -> MemoryStats:
        if self.is_emulated():
            module = self._device_module()
            return MemoryStats(int(module.memory_allocated()), int(module.max_memory_allocated()))
        ok, current = self._device_call("memory_allocated")
        ok_peak, peak = self._device_call("max_memory_allocated")
        return MemoryStats(int(current) if ok else None, int(peak) if ok_peak else None)

    def _reset_peak_memory_impl(self) -> None:
        if self.is_emulated():
            self._device_module().reset_peak_memory_stats()
            return
        self._device_call("reset_peak_memory_stats")

    @contextlib.contextmanager
    def fallback_recording(self) -> Iterator[FallbackRecording]:  # type: ignore[override]
        """Record CPU fallbacks: the emulator's events, or the vendor's signals plus counts."""
        recording = FallbackRecording()
        if self.is_emulated():
            from neuron_workbench import emulator

            before = emulator.read_rule_ops()
            with self._emulated_fallback_mode(), emulator.record_fallbacks() as log:
                try:
                    yield recording
                finally:
                    recording.events = [event.to_dict() for event in log.events]
                    # Differences, not a reset: another recording may be running.
                    after = emulator.read_rule_ops()
                    recording.rule_ops = {k: after[k] - before.get(k, 0) for k in after}
            return
        with self._real_fallback_tracking(recording):
            yield recording

    def _emulated_fallback_mode(self) -> contextlib.AbstractContextManager[None]:
        """Emulator policy for one recorded run (subclasses may switch the fallback on)."""
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def _real_fallback_tracking(self, recording: FallbackRecording) -> Iterator[None]:
        """Vendor op tracking; the base has none, so nothing is recorded."""
        yield
