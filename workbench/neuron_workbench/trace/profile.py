"""Per-op profile of one run: calls, time, input shapes, bytes allocated, peak memory.

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

Use it as an executor instrument::

    execute(RunSpec(program, ns, instruments={"profile": op_profiler}), backend).extras["profile"]
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from neuron_workbench.trace.fallback import normalize_op as base_op_name

if TYPE_CHECKING:
    import pandas

    from neuron_workbench.backends.base import Backend

__all__ = [
    "HOST_CPU_TIME",
    "OpProfile",
    "OpProfileRecorder",
    "OpStat",
    "combined_chrome_trace",
    "op_profiler",
    "profile_diff",
    "top_ops",
    "write_chrome_trace",
]

#: ``time_kind`` of emulated devices: the numbers are host CPU time, not device time.
HOST_CPU_TIME = "host CPU time"
#: ``time_kind`` of asynchronous devices timed with a synchronize after each op.
SYNCED_WALL_TIME = "device-synchronized wall time"
#: ``time_kind`` of the CPU (synchronous, nothing to wait for).
WALL_TIME = "wall time"

#: Per-call events kept for the Chrome trace; later calls still count in the table.
MAX_TRACE_EVENTS = 20_000
#: Distinct input signatures remembered per op for the shape summary.
_MAX_SIGNATURES = 16


@dataclass
class OpStat:
    """One ATen op's totals in one run (all overloads of the op together).

    Attributes
    ----------
    op : str
        Base op name, e.g. ``aten::addmm``.
    calls : int
        Number of calls.
    total_time_s : float
        Time spent in the op, in seconds (see the profile's ``time_kind``).
    self_time_s : float
        Time in the op excluding nested recorded ops (equal to ``total_time_s`` for dispatch-level
        profiles, whose ops do not nest).
    shapes : str
        The most common input signature, ``"[32, 3, 32, 32] f32, [16, 3, 3, 3] f32"``, plus how
        many other signatures occurred.
    bytes_allocated : int
        Bytes of the fresh (non-view, non-in-place) tensors the op returned, summed over calls.
    fallback : bool or None
        Whether the op ran on the CPU instead of the device; None when unknown.
    overloads : list of str
        Overloads seen, e.g. ``["aten::add.Tensor"]``.
    site : dict or None
        First user source line that called the op (``file``, ``line``, ``function``); None when it
        was only called from backward or library code.
    module : str
        Qualified ``nn.Module`` path running at that first call (``""`` for none or the root).
    """

    op: str
    calls: int
    total_time_s: float
    self_time_s: float
    shapes: str = ""
    bytes_allocated: int = 0
    fallback: bool | None = None
    overloads: list[str] = field(default_factory=list)
    site: dict[str, Any] | None = None
    module: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "op": self.op,
            "calls": self.calls,
            "total_time_s": self.total_time_s,
            "self_time_s": self.self_time_s,
            "shapes": self.shapes,
            "bytes_allocated": self.bytes_allocated,
            "fallback": self.fallback,
            "overloads": list(self.overloads),
            "site": dict(self.site) if self.site else None,
            "module": self.module,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OpStat:
        """Inverse of :meth:`to_dict`."""
        fallback = data.get("fallback")
        return cls(
            op=str(data["op"]),
            calls=int(data.get("calls", 0)),
            total_time_s=float(data.get("total_time_s", 0.0)),
            self_time_s=float(data.get("self_time_s", data.get("total_time_s", 0.0))),
            shapes=str(data.get("shapes", "")),
            bytes_allocated=int(data.get("bytes_allocated", 0)),
            fallback=None if fallback is None else bool(fallback),
            overloads=[str(o) for o in data.get("overloads", [])],
            site=dict(data["site"]) if data.get("site") else None,
            module=str(data.get("module", "")),
        )


def _rows_to_dicts(rows: list[OpStat] | None) -> list[dict[str, Any]] | None:
    return None if rows is None else [row.to_dict() for row in rows]


def _rows_from_dicts(rows: list[dict[str, Any]] | None) -> list[OpStat] | None:
    return None if rows is None else [OpStat.from_dict(row) for row in rows]


@dataclass
class OpProfile:
    """The op profile of one run on one backend.

    Attributes
    ----------
    backend : str
        Backend name (``cpu``, ``cuda``, ``neuron``, ``tpu``).
    time_kind : str
        What the times measure: ``"host CPU time"`` on emulated devices, ``"wall time"`` on the
        CPU, ``"device-synchronized wall time"`` on asynchronous devices.
    rows : list of OpStat
        Every op of the run (all iterations), slowest first.
    first_call : list of OpStat or None
        With ``--repeat N``: the ops of the first iteration (compile and warm-up). None otherwise.
    steady : list of OpStat or None
        With ``--repeat N``: the ops of iterations 2..N together (steady state). None otherwise.
    iterations : int
        How many times the cell ran under the recorder.
    iteration_times_s : list of float
        Time of each iteration as seen by the recorder (same ``time_kind``).
    peak_memory_bytes : int or None
        The run's peak device memory (CUDA's or TorchNeuron's allocator statistics, or the
        emulator's accounting); None where the backend keeps none (the CPU).
    peak_memory_unavailable : str
        Why reading the peak failed (the backend's error), empty when it did not.
    emulated : bool
        True when the backend is the workbench's emulation.
    synchronized : bool
        True when each op was followed by a device synchronize.
    trace : dict
        Compact per-call events for :meth:`to_chrome_trace`: ``ops`` (names), ``events``
        (``[op_index, ts_us, dur_us, thread, iteration]``), ``threads`` and ``dropped``.
    """

    backend: str
    time_kind: str
    rows: list[OpStat] = field(default_factory=list)
    first_call: list[OpStat] | None = None
    steady: list[OpStat] | None = None
    iterations: int = 1
    iteration_times_s: list[float] = field(default_factory=list)
    peak_memory_bytes: int | None = None
    peak_memory_unavailable: str = ""
    emulated: bool = False
    synchronized: bool = False
    trace: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def total_time_s(self) -> float:
        """Sum of the ops' self times."""
        return sum(row.self_time_s for row in self.rows)

    @property
    def bytes_allocated(self) -> int:
        """Sum of the bytes the ops allocated."""
        return sum(row.bytes_allocated for row in self.rows)

    def row(self, op: str) -> OpStat | None:
        """The row of ``op`` (``aten::sort`` or ``sort``), or None."""
        name = base_op_name(op)
        return next((row for row in self.rows if row.op == name), None)

    def mark_fallbacks(self, ops: Iterable[str]) -> OpProfile:
        """Set every row's ``fallback`` flag from the ops that fell back; returns ``self``."""
        fell_back = {base_op_name(op) for op in ops}
        for rows in (self.rows, self.first_call or [], self.steady or []):
            for row in rows:
                row.fallback = row.op in fell_back
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (embedded in the report as ``ref.profile`` / ``target.profile``)."""
        return {
            "backend": self.backend,
            "time_kind": self.time_kind,
            "emulated": self.emulated,
            "synchronized": self.synchronized,
            "iterations": self.iterations,
            "iteration_times_s": list(self.iteration_times_s),
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_memory_unavailable": self.peak_memory_unavailable,
            "total_time_s": self.total_time_s,
            "bytes_allocated": self.bytes_allocated,
            "rows": _rows_to_dicts(self.rows),
            "first_call": _rows_to_dicts(self.first_call),
            "steady": _rows_to_dicts(self.steady),
            "trace": dict(self.trace),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OpProfile:
        """Inverse of :meth:`to_dict`."""
        peak = data.get("peak_memory_bytes")
        return cls(
            backend=str(data.get("backend", "")),
            time_kind=str(data.get("time_kind", WALL_TIME)),
            rows=_rows_from_dicts(data.get("rows") or []) or [],
            first_call=_rows_from_dicts(data.get("first_call")),
            steady=_rows_from_dicts(data.get("steady")),
            iterations=int(data.get("iterations", 1)),
            iteration_times_s=[float(t) for t in data.get("iteration_times_s", [])],
            peak_memory_bytes=None if peak is None else int(peak),
            peak_memory_unavailable=str(data.get("peak_memory_unavailable", "")),
            emulated=bool(data.get("emulated", False)),
            synchronized=bool(data.get("synchronized", False)),
            trace=dict(data.get("trace") or {}),
        )

    def chrome_events(self, pid: int = 1) -> list[dict[str, Any]]:
        """The run's calls as Chrome trace events (``ph: "X"``) plus process/thread names."""
        label = f"{self.backend}{' (emulated)' if self.emulated else ''} — {self.time_kind}"
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}}
        ]
        threads = self.trace.get("threads", {})
        for tid, name in threads.items():
            events.append(
                {"name": "thread_name", "ph": "M", "pid": pid, "tid": int(tid),
                 "args": {"name": name}}
            )  # fmt: skip
        ops = self.trace.get("ops", [])
        for index, ts, dur, tid, iteration in self.trace.get("events", []):
            events.append(
                {
                    "name": base_op_name(ops[index]),
                    "cat": "op",
                    "ph": "X",
                    "ts": ts,
                    "dur": dur,
                    "pid": pid,
                    "tid": int(tid),
                    "args": {
                        "overload": ops[index],
                        "iteration": iteration,
                        "time_kind": self.time_kind,
                    },
                }
            )
        return events

    def to_chrome_trace(self) -> dict[str, Any]:
        """The run's calls in Chrome trace event format (opens in Perfetto and chrome://tracing)."""
        return {
            "traceEvents": self.chrome_events(pid=1),
            "displayTimeUnit": "ms",
            "otherData": {
                "backend": self.backend,
                "time_kind": self.time_kind,
                "dropped_events": int(self.trace.get("dropped", 0)),
            },
        }

    def dataframe(self, which: str = "rows") -> pandas.DataFrame:
        """The rows (or ``first_call`` / ``steady``) as a pandas DataFrame, slowest first."""
        import pandas as pd

        rows = getattr(self, which) or []
        columns = ["op", "calls", "total_time_s", "self_time_s", "shapes", "bytes_allocated",
                   "fallback"]  # fmt: skip
        return pd.DataFrame([{c: getattr(r, c) for c in columns} for r in rows], columns=columns)


def combined_chrome_trace(*profiles: OpProfile | dict[str, Any]) -> dict[str, Any]:
    """Several runs (e.g. reference and target) in one Chrome trace, one process each."""
    events: list[dict[str, Any]] = []
    for pid, profile in enumerate(profiles, start=1):
        events.extend(_as_profile(profile).chrome_events(pid=pid))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


# ---- the recorder ----------------------------------------------------------------------------


class _Acc:
    """Running totals of one op overload in one iteration."""

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
    from neuron_workbench.emulator.events import find_site_and_module

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
        out = func(*args, **(kwargs or {}))
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
            events.append((acc.index, t0, dt, threading.get_ident(), rec._iteration))
        else:
            rec._dropped += 1
        return out


class OpProfileRecorder:
    """Records every ATen op of one run; :meth:`result` gives the :class:`OpProfile`.

    Made by :func:`op_profiler`. The executor calls :meth:`next_iteration` between repetitions of
    ``--repeat N``: iteration 0 is the first call (compile, warm-up), the rest steady state.
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
        self._iterations: list[dict[Any, _Acc]] = [{}]
        self._current = self._iterations[0]
        self._iteration = 0
        self._names: list[str] = []
        self._index: dict[Any, int] = {}
        self._fresh: dict[Any, tuple[bool, ...]] = {}
        self._events: list[tuple[int, int, int, int, int]] = []
        self._dropped = 0
        self._start_ns = 0
        self._iteration_start_ns = 0
        self._iteration_ns: list[int] = []
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
        self._start_ns = self._iteration_start_ns = time.perf_counter_ns()

    def next_iteration(self) -> None:
        """Start the next repetition; what follows counts as steady state."""
        if self._sync is not None:
            self._sync()
        now = time.perf_counter_ns()
        self._iteration_ns.append(now - self._iteration_start_ns)
        self._iteration_start_ns = now
        self._iteration += 1
        self._current = {}
        self._iterations.append(self._current)

    def stop(self) -> None:
        """Finish recording: synchronize and read the peak memory."""
        if self._sync is not None:
            self._sync()
        self._iteration_ns.append(time.perf_counter_ns() - self._iteration_start_ns)
        try:
            self._peak = self._backend.memory_stats().peak_bytes
        except Exception as exc:  # a device runtime's own error: reported with the profile
            self._peak_unavailable = f"peak memory unavailable: {type(exc).__name__}: {exc}"

    # -- results -------------------------------------------------------------------------------
    def _rows(self, iterations: list[dict[Any, _Acc]]) -> list[OpStat]:
        merged: dict[str, dict[str, Any]] = {}
        for accs in iterations:
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
        repeated = len(self._iterations) > 1
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
            rows=self._rows(self._iterations),
            first_call=self._rows(self._iterations[:1]) if repeated else None,
            steady=self._rows(self._iterations[1:]) if repeated else None,
            iterations=len(self._iterations),
            iteration_times_s=[ns / 1e9 for ns in self._iteration_ns],
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


# ---- comparing two profiles ------------------------------------------------------------------


def _as_profile(value: OpProfile | dict[str, Any]) -> OpProfile:
    return value if isinstance(value, OpProfile) else OpProfile.from_dict(value)


def _phase_rows(profile: OpProfile, phase: str) -> list[OpStat]:
    if phase == "all":
        return profile.rows
    if phase == "first":
        return profile.first_call if profile.first_call is not None else profile.rows
    if phase == "steady":
        return profile.steady if profile.steady is not None else profile.rows
    raise ValueError(f"phase must be 'steady', 'first' or 'all', not {phase!r}")


DIFF_COLUMNS = [
    "op", "ref_time_s", "target_time_s", "ratio", "ref_calls", "target_calls", "ref_bytes",
    "target_bytes", "fallback", "ref_shapes", "target_shapes",
]  # fmt: skip


def profile_diff(
    ref: OpProfile | dict[str, Any],
    target: OpProfile | dict[str, Any],
    fallback_ops: Iterable[str] = (),
    *,
    phase: str = "steady",
) -> pandas.DataFrame:
    """Join two runs' op profiles by op: times, ratio, calls, bytes, fallback flag.

    Parameters
    ----------
    ref, target : OpProfile or dict
        The reference and target profiles (objects or their ``to_dict()`` form).
    fallback_ops : iterable of str
        Ops that fell back to the CPU on the target (``aten::sort`` or ``sort``); rows whose
        target ``fallback`` flag is set count too.
    phase : {"steady", "first", "all"}
        Which rows of repeated runs to join; profiles without repetitions use all rows.

    Returns
    -------
    pandas.DataFrame
        One row per op seen in either run, target time descending. ``ratio`` is target time over
        reference time (NaN where either is missing or zero). ``df.attrs["time_kind"]`` names what
        each side's times measure (``host CPU time`` for emulated devices).
    """
    import pandas as pd

    ref_p, target_p = _as_profile(ref), _as_profile(target)
    fell_back = {base_op_name(op) for op in fallback_ops}
    fell_back |= {row.op for row in _phase_rows(target_p, phase) if row.fallback}
    ref_rows = {row.op: row for row in _phase_rows(ref_p, phase)}
    target_rows = {row.op: row for row in _phase_rows(target_p, phase)}
    records = []
    for op in sorted(set(ref_rows) | set(target_rows)):
        r, t = ref_rows.get(op), target_rows.get(op)
        ref_time = r.self_time_s if r else 0.0
        target_time = t.self_time_s if t else 0.0
        ratio = target_time / ref_time if (r and t and ref_time > 0) else math.nan
        records.append(
            {
                "op": op,
                "ref_time_s": ref_time,
                "target_time_s": target_time,
                "ratio": ratio,
                "ref_calls": r.calls if r else 0,
                "target_calls": t.calls if t else 0,
                "ref_bytes": r.bytes_allocated if r else 0,
                "target_bytes": t.bytes_allocated if t else 0,
                "fallback": op in fell_back,
                "ref_shapes": r.shapes if r else "",
                "target_shapes": t.shapes if t else "",
            }
        )
    df = pd.DataFrame.from_records(records, columns=DIFF_COLUMNS)
    df = df.sort_values(["target_time_s", "op"], ascending=[False, True], ignore_index=True)
    df.attrs["time_kind"] = {"ref": ref_p.time_kind, "target": target_p.time_kind}
    df.attrs["backends"] = {"ref": ref_p.backend, "target": target_p.backend}
    return df


def top_ops(df: pandas.DataFrame, n: int = 10, by: str = "target_time_s") -> pandas.DataFrame:
    """The ``n`` rows of a :func:`profile_diff` frame with the largest ``by`` (NaN last)."""
    out = df.sort_values([by, "op"], ascending=[False, True], na_position="last").head(n)
    out = out.reset_index(drop=True)
    out.attrs.update(df.attrs)
    return out


def write_chrome_trace(path: str | os.PathLike[str], *profiles: OpProfile | dict[str, Any]) -> str:
    """Write one or more profiles as a Chrome trace JSON file; returns the path."""
    import json

    data = (
        _as_profile(profiles[0]).to_chrome_trace()
        if len(profiles) == 1
        else combined_chrome_trace(*profiles)
    )
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    return os.fspath(path)
