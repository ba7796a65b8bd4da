"""The op recorder: per-op calls, time, input shapes, bytes allocated and peak memory of a run.

The recorder is a ``TorchDispatchMode`` (``shared/notes/emulator.md`` §5.1) rather than
``torch.profiler``: it is cheaper, needs no Kineto start-up, sees every ATen op exactly once even on
the emulated device (where ``torch.profiler`` sees each op twice, wrapper and inner CPU op), and
sees backward ops on the autograd device thread. It times each op with ``perf_counter_ns``; on
asynchronous devices (CUDA, real Trainium) it synchronizes after every op, so times are
device-synchronized wall time. On emulated devices every time is **host CPU time**, never device
performance, and every profile says so in ``time_kind``.

Ops seen at dispatch level are leaves (composite ops such as ``aten::linear`` have already been
decomposed into ``aten::t`` and ``aten::addmm``), so ``self_time_s`` equals ``total_time_s``; the
field is kept for profiles from other sources, where ops nest.

The profile itself (:class:`~neuron_workbench.trace.profile_data.OpProfile`, its JSON form and
Chrome trace) is in :mod:`neuron_workbench.trace.profile_data`; comparing two profiles is
:func:`neuron_workbench.compare.profile_diff.profile_diff`.

Use it as an executor instrument::

    execute(RunSpec(program, ns, instruments={"profile": op_profiler}), backend).extras["profile"]
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from neuron_workbench.dispatch_calls import call_op
from neuron_workbench.opnames import normalize_op as base_op_name
from neuron_workbench.sites import find_site_and_module
from neuron_workbench.trace.profile_data import (
    HOST_CPU_TIME,
    SYNCED_WALL_TIME,
    WALL_TIME,
    OpProfile,
    OpStat,
)

if TYPE_CHECKING:
    from neuron_workbench.backends.base import Backend

__all__ = ["MAX_TRACE_EVENTS", "OpProfileRecorder", "op_profiler"]

#: Per-call events kept for the Chrome trace; later calls still count in the table.
MAX_TRACE_EVENTS = 20_000
#: Distinct input signatures remembered per op for the shape summary.
_MAX_SIGNATURES = 16


class _Acc:
    """Running totals of one op overload in one step."""

    __slots__ = ("index", "calls", "ns", "nbytes", "signatures", "other", "site", "module")

    def __init__(self, index: int) -> None:
        self.index = index
        self.calls = 0
        self.ns = 0
        self.nbytes = 0
        self.signatures: dict[tuple, int] = {}
        self.other = 0
        self.site: dict[str, Any] | None = None
        self.module = ""


_DTYPE_SHORT = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "bool", torch.complex64: "c64",
}  # fmt: skip


def _signature(args: tuple) -> tuple:
    sig = []
    for a in args:
        if isinstance(a, torch.Tensor):
            sig.append((tuple(a.shape), a.dtype))
        elif type(a) is list or type(a) is tuple:
            for b in a:
                if isinstance(b, torch.Tensor):
                    sig.append((tuple(b.shape), b.dtype))
    return tuple(sig)


def _format_signature(sig: tuple) -> str:
    return ", ".join(
        f"{list(shape)} {_DTYPE_SHORT.get(dtype, str(dtype).replace('torch.', ''))}"
        for shape, dtype in sig
    )


def _fresh_returns(func: Any) -> tuple[bool, ...]:
    """Per return: True when it is a new tensor (no alias annotation: not a view, not in-place)."""
    return tuple(r.alias_info is None for r in func._schema.returns)


def _out_bytes(out: Any, fresh: tuple[bool, ...]) -> int:
    if isinstance(out, torch.Tensor):
        return out.numel() * out.element_size() if fresh and fresh[0] else 0
    total = 0
    if type(out) is tuple or type(out) is list:
        if len(fresh) == len(out):
            for is_fresh, t in zip(fresh, out):
                if is_fresh and isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        elif fresh and all(fresh):
            for t in out:
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
    return total


def _first_site() -> tuple[dict[str, Any] | None, str]:
    site, module, _ = find_site_and_module(2)
    if site is None:
        return None, module
    return {"file": site.file, "line": site.line, "function": site.function}, module


class _RecorderMode(TorchDispatchMode):
    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Without this, Dynamo sees an active mode and runs torch.compile'd code eagerly.
        return True

    def __init__(self, recorder: OpProfileRecorder) -> None:
        super().__init__()
        self._rec = recorder

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        rec = self._rec
        t0 = time.perf_counter_ns()
        out = call_op(func, args, kwargs)
        if rec._sync is not None:
            rec._sync()
        t1 = time.perf_counter_ns()
        accs = rec._current
        acc = accs.get(func)
        if acc is None:
            acc = rec._new_acc(func)
        dt = t1 - t0
        acc.calls += 1
        acc.ns += dt
        fresh = rec._fresh.get(func)
        if fresh is None:
            fresh = rec._fresh[func] = _fresh_returns(func)
        acc.nbytes += _out_bytes(out, fresh)
        sig = _signature(args)
        sigs = acc.signatures
        if sig in sigs:
            sigs[sig] += 1
        elif len(sigs) < _MAX_SIGNATURES:
            sigs[sig] = 1
        else:
            acc.other += 1
        events = rec._events
        if len(events) < MAX_TRACE_EVENTS:
            events.append((acc.index, t0, dt, threading.get_ident(), rec._step))
        else:
            rec._dropped += 1
        return out


class OpProfileRecorder:
    """Records every ATen op of one run; :meth:`result` gives the :class:`OpProfile`.

    Made by :func:`op_profiler`. The executor calls :meth:`next_step` between the steps of
    ``--steps N``: step 0 is the first call (compile, warm-up), the rest steady state.
    """

    def __init__(self, backend: Backend) -> None:
        info = backend.info()
        self.backend_name = info.name
        self.emulated = bool(info.emulated)
        is_async = not self.emulated and backend.device_type != "cpu"
        self._backend = backend
        self._sync = backend.synchronize if is_async else None
        if self.emulated:
            self.time_kind = HOST_CPU_TIME
        elif is_async:
            self.time_kind = SYNCED_WALL_TIME
        else:
            self.time_kind = WALL_TIME
        self._steps: list[dict[Any, _Acc]] = [{}]
        self._current = self._steps[0]
        self._step = 0
        self._names: list[str] = []
        self._index: dict[Any, int] = {}
        self._fresh: dict[Any, tuple[bool, ...]] = {}
        self._events: list[tuple[int, int, int, int, int]] = []
        self._dropped = 0
        self._start_ns = 0
        self._step_start_ns = 0
        self._step_ns: list[int] = []
        self._peak: int | None = None
        self._peak_unavailable = ""
        self._result: OpProfile | None = None

    def _new_acc(self, func: Any) -> _Acc:
        index = self._index.get(func)
        if index is None:
            index = self._index[func] = len(self._names)
            s = func._schema
            self._names.append(f"{s.name}.{s.overload_name}" if s.overload_name else s.name)
        acc = self._current[func] = _Acc(index)
        if torch._C._current_autograd_node() is None:
            acc.site, acc.module = _first_site()
        return acc

    # -- lifecycle (driven by op_profiler and the executor) -----------------------------------
    def start(self) -> None:
        """Begin recording (called on entering the instrument)."""
        if self._sync is not None:
            self._sync()
        self._start_ns = self._step_start_ns = time.perf_counter_ns()

    def next_step(self) -> None:
        """Start the next step; what follows counts as steady state."""
        if self._sync is not None:
            self._sync()
        now = time.perf_counter_ns()
        self._step_ns.append(now - self._step_start_ns)
        self._step_start_ns = now
        self._step += 1
        self._current = {}
        self._steps.append(self._current)

    def stop(self) -> None:
        """Finish recording: synchronize and read the peak memory."""
        if self._sync is not None:
            self._sync()
        self._step_ns.append(time.perf_counter_ns() - self._step_start_ns)
        try:
            self._peak = self._backend.memory_stats().peak_bytes
        except Exception as exc:  # a device runtime's own error: reported with the profile
            self._peak_unavailable = f"peak memory unavailable: {type(exc).__name__}: {exc}"

    # -- results -------------------------------------------------------------------------------
    def _rows(self, steps: list[dict[Any, _Acc]]) -> list[OpStat]:
        merged: dict[str, dict[str, Any]] = {}
        for accs in steps:
            for acc in accs.values():
                overload = self._names[acc.index]
                op = base_op_name(overload)
                m = merged.get(op)
                if m is None:
                    m = merged[op] = {"calls": 0, "ns": 0, "nbytes": 0, "sigs": {}, "other": 0,
                                      "overloads": [], "site": None, "module": ""}  # fmt: skip
                m["calls"] += acc.calls
                m["ns"] += acc.ns
                m["nbytes"] += acc.nbytes
                m["other"] += acc.other
                for sig, count in acc.signatures.items():
                    m["sigs"][sig] = m["sigs"].get(sig, 0) + count
                if overload not in m["overloads"]:
                    m["overloads"].append(overload)
                if m["site"] is None and acc.site is not None:
                    m["site"], m["module"] = acc.site, acc.module
        rows = []
        for op, m in merged.items():
            sigs = sorted(m["sigs"].items(), key=lambda item: -item[1])
            summary = _format_signature(sigs[0][0]) if sigs else ""
            others = len(sigs) - 1 + (1 if m["other"] else 0)
            if others > 0:
                summary += f" (+{others}{'+' if m['other'] else ''} other shapes)"
            seconds = m["ns"] / 1e9
            rows.append(
                OpStat(op=op, calls=m["calls"], total_time_s=seconds, self_time_s=seconds,
                       shapes=summary, bytes_allocated=m["nbytes"],
                       overloads=sorted(m["overloads"]), site=m["site"], module=m["module"])
            )  # fmt: skip
        rows.sort(key=lambda row: (-row.self_time_s, row.op))
        return rows

    def result(self) -> OpProfile:
        """The profile (valid after the instrument's context has exited)."""
        if self._result is not None:
            return self._result
        repeated = len(self._steps) > 1
        threads: dict[int, int] = {}
        main = threading.main_thread().ident
        ordered = sorted({e[3] for e in self._events}, key=lambda ident: ident != main)
        for ident in ordered:
            threads[ident] = len(threads) + 1
        names = {
            str(tid): ("main" if ident == main else f"thread {tid} (autograd / other)")
            for ident, tid in threads.items()
        }
        start = self._start_ns
        trace = {
            "ops": list(self._names),
            "events": [
                [index, round((t0 - start) / 1e3, 3), round(dt / 1e3, 3), threads[ident], it]
                for index, t0, dt, ident, it in self._events
            ],
            "threads": names,
            "dropped": self._dropped,
        }
        self._result = OpProfile(
            backend=self.backend_name,
            time_kind=self.time_kind,
            rows=self._rows(self._steps),
            first_call=self._rows(self._steps[:1]) if repeated else None,
            steady=self._rows(self._steps[1:]) if repeated else None,
            steps=len(self._steps),
            step_times_s=[ns / 1e9 for ns in self._step_ns],
            peak_memory_bytes=self._peak,
            peak_memory_unavailable=self._peak_unavailable,
            emulated=self.emulated,
            synchronized=self._sync is not None,
            trace=trace,
        )
        return self._result


@contextlib.contextmanager
def op_profiler(backend: Backend) -> Iterator[OpProfileRecorder]:
    """Executor instrument: record the per-op profile of the run on ``backend``.

    Parameters
    ----------
    backend : Backend
        The run's backend (used for its name, emulation flag, synchronize and memory statistics).

    Yields
    ------
    OpProfileRecorder
        Call ``.result()`` after the context has exited for the :class:`OpProfile`.
    """
    recorder = OpProfileRecorder(backend)
    recorder.start()
    try:
        with _RecorderMode(recorder):
            yield recorder
    finally:
        recorder.stop()
