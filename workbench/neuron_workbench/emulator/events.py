"""Fallback events: which ops ran on the host CPU, how often, from where.

Events are deduplicated per (op, site, phase, module) so a training loop adds counts, not rows. Every
event goes to the process-wide log (read by the ``emulate`` command's summary) and to each active
:func:`record_fallbacks` log, from any thread (backward runs on the autograd device thread).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from neuron_workbench.sites import SourceSite, find_site_and_module

__all__ = [
    "FallbackEvent",
    "FallbackLog",
    "SourceSite",
    "process_log",
    "record_fallbacks",
]


@dataclass
class FallbackEvent:
    """One op that ran on the host CPU instead of the (emulated) device, with its count.

    Attributes
    ----------
    op
        Base op name, e.g. ``"aten::max_pool2d_with_indices"``.
    overload
        Full name with overload, e.g. ``"aten::add.Tensor"`` (no suffix for the default overload).
    count
        Number of calls merged into this event.
    shapes, dtypes
        Input tensor shapes and dtypes of the first call.
    cpu_time_s
        Total host time spent running the op, in seconds (host CPU time, not device time).
    phase
        ``"forward"`` or ``"backward"``.
    site
        The user's source line, or None when unknown. Backward events carry the forward site when the
        forward op also fell back (matched through the autograd sequence number), else None.
    module
        Qualified ``nn.Module`` path that was running (``"features.3"``); ``""`` for none or the root.
    module_type
        Class name of that module (``"MaxPool2d"``), ``""`` when none.
    autograd_node
        Backward only: the autograd node name, e.g. ``"MaxPool2DWithIndicesBackward0"``.
    """

    op: str
    overload: str
    count: int
    shapes: list[list[int]]
    dtypes: list[str]
    cpu_time_s: float
    phase: str
    site: SourceSite | None
    module: str = ""
    module_type: str = ""
    autograd_node: str = ""

    @classmethod
    def first_call(
        cls,
        op: str,
        overload: str,
        args: Any,
        cpu_time_s: float,
        *,
        phase: str,
        site: SourceSite | None,
        module: str = "",
        module_type: str = "",
        autograd_node: str = "",
    ) -> FallbackEvent:
        """The event of an op's first fallback call, with the shapes and dtypes of its ``args``."""
        shapes, dtypes = _shape_dtype(args)
        return cls(
            op=op,
            overload=overload,
            count=1,
            shapes=shapes,
            dtypes=dtypes,
            cpu_time_s=cpu_time_s,
            phase=phase,
            site=site,
            module=module,
            module_type=module_type,
            autograd_node=autograd_node,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of this event."""
        d = asdict(self)
        d["site"] = asdict(self.site) if self.site is not None else None
        return d


class FallbackLog:
    """Deduplicated fallback events (thread-safe).

    Attributes
    ----------
    events
        A snapshot list of :class:`FallbackEvent`, in first-seen order.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[tuple, FallbackEvent] = {}

    def _add(self, key: tuple, make: Any, seconds: float) -> None:
        with self._lock:
            ev = self._events.get(key)
            if ev is None:
                self._events[key] = make()
            else:
                ev.count += 1
                ev.cpu_time_s += seconds

    @property
    def events(self) -> list[FallbackEvent]:
        """Snapshot of the events."""
        with self._lock:
            return list(self._events.values())

    def ops(self) -> list[str]:
        """Sorted unique op names (``"aten::sort"``...)."""
        with self._lock:
            return sorted({e.op for e in self._events.values()})

    def clear(self) -> None:
        """Forget all events."""
        with self._lock:
            self._events.clear()

    def summary_lines(self) -> list[str]:
        """One line per op: name, total count, first user site."""
        by_op: dict[str, list[FallbackEvent]] = {}
        for ev in self.events:
            by_op.setdefault(ev.op, []).append(ev)
        lines = []
        for op in sorted(by_op):
            evs = by_op[op]
            count = sum(e.count for e in evs)
            site = next((e.site for e in evs if e.site is not None), None)
            where = str(site) if site else f"backward ({evs[0].autograd_node})"
            lines.append(f"{op}  x{count}  first at {where}")
        return lines

    def to_list(self) -> list[dict[str, Any]]:
        """Events grouped per op, in the ``--json`` format of the ``emulate`` command."""
        by_op: dict[str, dict[str, Any]] = {}
        for ev in self.events:
            entry = by_op.setdefault(
                ev.op,
                {"op": ev.op, "count": 0, "cpu_time_s": 0.0, "phases": [], "sites": []},
            )
            entry["count"] += ev.count
            entry["cpu_time_s"] += ev.cpu_time_s
            if ev.phase not in entry["phases"]:
                entry["phases"].append(ev.phase)
            if ev.site is not None:
                site = {"file": ev.site.file, "line": ev.site.line, "module": ev.module}
                if site not in entry["sites"]:
                    entry["sites"].append(site)
        return [by_op[k] for k in sorted(by_op)]

    def __len__(self) -> int:
        with self._lock:
            return len(self._events)

    def __repr__(self) -> str:
        return f"FallbackLog({len(self)} events, ops={self.ops()})"


_PROCESS_LOG = FallbackLog()
_active: list[FallbackLog] = []  # replaced, never mutated, so readers need no lock
_active_lock = threading.Lock()


def process_log() -> FallbackLog:
    """The process-wide fallback log (everything since the emulator was installed)."""
    return _PROCESS_LOG


@contextlib.contextmanager
def record_fallbacks() -> Iterator[FallbackLog]:
    """Collect fallback events while the block runs, from every thread.

    Yields
    ------
    FallbackLog
        Filled while the block runs; nested and parallel recordings each see every event.
    """
    global _active
    log = FallbackLog()
    with _active_lock:
        _active = [*_active, log]
    try:
        yield log
    finally:
        with _active_lock:
            _active = [x for x in _active if x is not log]


# ---- attribution (the stack walk itself: neuron_workbench.sites) ----------------------------

# Forward attribution of fallback ops, keyed by the autograd sequence number of the node created
# for them, so the backward op of a forward fallback can name the same site and module.
_forward_by_seq: dict[int, tuple[SourceSite | None, str, str]] = {}
_FORWARD_MAX = 100_000


def _shape_dtype(args: Any) -> tuple[list[list[int]], list[str]]:
    shapes: list[list[int]] = []
    dtypes: list[str] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            shapes.append(list(a.shape))
            dtypes.append(str(a.dtype))
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    shapes.append(list(b.shape))
                    dtypes.append(str(b.dtype))
    return shapes, dtypes


_tls = threading.local()


def begin_tentative() -> None:
    """Hold back events until :func:`end_tentative` (a decomposition that may be abandoned)."""
    stack = getattr(_tls, "pending", None)
    if stack is None:
        stack = _tls.pending = []
    stack.append([])


def end_tentative(commit: bool) -> None:
    """Emit (or drop) the events held since the matching :func:`begin_tentative`."""
    stack = _tls.pending
    held = stack.pop()
    if not commit:
        return
    if stack:
        stack[-1].extend(held)
    else:
        for emit in held:
            emit()


#: Set by ``emulator.compile``: whether an op (``aten::name``) runs inside a graph the device's
#: compiler took, where it is not a CPU fallback.
COMPILED_HERE: Any = None


def record_event(
    op: str, overload: str, args: Any, seconds: float, warning: str | None = None
) -> None:
    """Record one fallback call (called from the dispatch hot path only for fallbacks)."""
    if COMPILED_HERE is not None and COMPILED_HERE(op):
        return  # inside a compiled graph whose compiler takes this op: it runs on the device
    node = torch._C._current_autograd_node()
    if node is not None:
        phase = "backward"
        node_name = node.name()
        fwd = _forward_by_seq.get(node._sequence_nr())
        site, module, module_type = fwd if fwd is not None else (None, "", "")
    else:
        phase = "forward"
        node_name = ""
        site, module, module_type = find_site_and_module(3)
        if torch.is_grad_enabled() and any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in args
        ):
            # The node for this op (if any) was created just before dispatch reached us.
            seq = torch._C._autograd._get_sequence_nr() - 1
            if len(_forward_by_seq) > _FORWARD_MAX:
                _forward_by_seq.clear()
            _forward_by_seq[seq] = (site, module, module_type)
    key = (overload, site, phase, module, node_name)

    def make() -> FallbackEvent:
        return FallbackEvent.first_call(
            op,
            overload,
            args,
            seconds,
            phase=phase,
            site=site,
            module=module,
            module_type=module_type,
            autograd_node=node_name,
        )

    def emit() -> None:
        if warning:
            sys.stderr.write(warning)
        _PROCESS_LOG._add(key, make, seconds)
        for log in _active:
            log._add(key, make, seconds)

    pending = getattr(_tls, "pending", None)
    if pending:
        pending[-1].append(emit)
    else:
        emit()
