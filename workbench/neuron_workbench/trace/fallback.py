"""The CPU-fallback report: which ops ran on the host CPU, how often, from which lines; strict mode.

Input is a run's fallback events (``Run.fallbacks``, also ``report_dict["target"]["fallbacks"]``):

- on the emulated device, one dict per (op, site, phase, module) with ``op``, ``overload``,
  ``count``, ``shapes``, ``dtypes``, ``cpu_time_s``, ``phase``, ``site`` (``file``, ``line``,
  ``function``), ``module``, ``module_type`` and ``autograd_node``;
- on real TorchNeuron, ``torch_neuronx.get_fallback_ops()`` gives unique op names only (``count`` is
  None); :func:`cross_check` fills counts, times and a source line from the run's op profile.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from neuron_workbench.opnames import normalize_op

__all__ = [
    "FallbackRow",
    "cross_check",
    "fallback_table",
    "normalize_op",
    "strict_message",
    "strict_violations",
]


@dataclass
class FallbackRow:
    """One op that fell back to the CPU, over all its events.

    Attributes
    ----------
    op : str
        Base op name, e.g. ``aten::max_pool2d_with_indices``.
    count : int or None
        Total calls that ran on the CPU; None when the source gives no counts (real TorchNeuron's
        op tracking without a cross-check).
    cpu_time_s : float or None
        Host CPU time spent in those calls, in seconds; None when unknown.
    shapes : list of str
        Distinct input-shape lists, e.g. ``"[32, 16, 32, 32]"`` (first call of each event).
    dtypes : list of str
        Distinct input dtypes.
    sites : list of tuple
        Distinct user source lines as ``(file, line)``, in first-seen order.
    functions : list of str
        The functions of those lines (same order as ``sites``).
    modules : list of str
        Distinct ``nn.Module`` paths (``""`` is the root or no module).
    module_types : list of str
        Class names of those modules, e.g. ``MaxPool2d``.
    phases : list of str
        ``forward`` and/or ``backward``.
    autograd_nodes : list of str
        Backward nodes that ran the op, e.g. ``MaxPool2DWithIndicesBackward0``.
    overloads : list of str
        Overloads seen, e.g. ``aten::add.Tensor``.
    """

    op: str
    count: int | None
    cpu_time_s: float | None
    shapes: list[str] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    sites: list[tuple[str, int]] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    module_types: list[str] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)
    autograd_nodes: list[str] = field(default_factory=list)
    overloads: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``sites`` as ``[file, line]`` lists)."""
        return {
            "op": self.op,
            "count": self.count,
            "cpu_time_s": self.cpu_time_s,
            "shapes": list(self.shapes),
            "dtypes": list(self.dtypes),
            "sites": [[file, line] for file, line in self.sites],
            "functions": list(self.functions),
            "modules": list(self.modules),
            "module_types": list(self.module_types),
            "phases": list(self.phases),
            "autograd_nodes": list(self.autograd_nodes),
            "overloads": list(self.overloads),
        }


def _add_unique(items: list[Any], value: Any) -> None:
    if value not in items:
        items.append(value)


def fallback_table(events: list[dict[str, Any]]) -> list[FallbackRow]:
    """Aggregate fallback events per op, most frequent first.

    Parameters
    ----------
    events : list of dict
        A run's fallback events (see the module docstring).

    Returns
    -------
    list of FallbackRow
        One row per base op name, sorted by count (descending, unknown last), then op name.
    """
    rows: dict[str, FallbackRow] = {}
    for event in events:
        op = normalize_op(event["op"])
        row = rows.get(op)
        if row is None:
            row = rows[op] = FallbackRow(op=op, count=0, cpu_time_s=0.0)
        count = event.get("count")
        row.count = None if count is None or row.count is None else row.count + int(count)
        seconds = event.get("cpu_time_s")
        row.cpu_time_s = (
            None if seconds is None or row.cpu_time_s is None else row.cpu_time_s + float(seconds)
        )
        shapes = event.get("shapes")
        if shapes:
            _add_unique(row.shapes, ", ".join(str(list(s)) for s in shapes))
        for dtype in event.get("dtypes") or []:
            _add_unique(row.dtypes, str(dtype).replace("torch.", ""))
        site = event.get("site")
        if site:
            where = (str(site.get("file", "")), int(site.get("line") or 0))
            if where not in row.sites:
                row.sites.append(where)
                row.functions.append(str(site.get("function", "")))
        if "module" in event:
            _add_unique(row.modules, str(event.get("module") or ""))
        if event.get("module_type"):
            _add_unique(row.module_types, str(event["module_type"]))
        if event.get("phase"):
            _add_unique(row.phases, str(event["phase"]))
        if event.get("autograd_node"):
            _add_unique(row.autograd_nodes, str(event["autograd_node"]))
        _add_unique(row.overloads, str(event.get("overload") or event["op"]))
    return sorted(
        rows.values(),
        key=lambda r: (r.count is None, -(r.count or 0), r.op),
    )


def strict_violations(events: list[dict[str, Any]], allowed: Iterable[str] = ()) -> list[str]:
    """Sorted base names of the ops that fell back and are not in ``allowed``.

    ``allowed`` accepts ``aten::sort``, ``sort`` and overload spellings (``aten::add.Tensor``);
    an allowed name exempts every overload of that op.
    """
    exempt = {normalize_op(name) for name in allowed if str(name).strip()}
    return sorted({normalize_op(e["op"]) for e in events} - exempt)


def strict_message(ops: Iterable[str], backend: str = "neuron") -> str:
    """One line for ``--strict`` failures, naming the ops and how to allow them.

    Examples
    --------
    >>> strict_message(["aten::sort"])
    'strict mode: 1 op fell back to CPU on neuron: aten::sort (allow it with --allow-fallback aten::sort)'
    """
    names = list(ops)
    listed = ", ".join(names)
    joined = ",".join(names)
    noun, them = ("op", "it") if len(names) == 1 else ("ops", "them")
    return (
        f"strict mode: {len(names)} {noun} fell back to CPU on {backend}: {listed} "
        f"(allow {them} with --allow-fallback {joined})"
    )


def cross_check(events: list[dict[str, Any]], profile: Any) -> list[dict[str, Any]]:
    """Fill counts, times and a source line of name-only fallback events from an op profile.

    Real TorchNeuron reports fallbacks as unique op names (``torch_neuronx.get_fallback_ops()``);
    the op profile recorded the same run at dispatch level, so it knows how often each op was
    called and from which line first. Events that already carry counts are returned unchanged.

    Parameters
    ----------
    events : list of dict
        The run's fallback events.
    profile : OpProfile or dict
        The same run's op profile (``op_profiler``'s result or its ``to_dict()``).

    Returns
    -------
    list of dict
        New event dicts; ``source`` says where each number came from.
    """
    from neuron_workbench.trace.profile_data import as_profile

    prof = as_profile(profile)
    out = []
    for event in events:
        if event.get("count") is not None:
            out.append(dict(event))
            continue
        filled = dict(event)
        row = prof.row(str(event["op"]))
        if row is not None:
            filled.update(
                count=row.calls,
                cpu_time_s=row.self_time_s,
                site=dict(row.site) if row.site else None,
                module=row.module,
                source=f"{event.get('source', 'op tracking')} + op profile (counts, first site)",
            )
        out.append(filled)
    return out
