"""What every check shares: the :class:`Scan` state of one module, :class:`Fix` and :class:`Area`.

A check is a function ``hook(scan, node)`` registered for an ``ast`` node type in its rule area's
:class:`Area`; :func:`neuron_workbench.scan.analyzer.analyze` walks the tree once and calls, for
each node, the hooks of every area in :data:`neuron_workbench.scan.checks.AREAS` order. A check
reports through :meth:`Scan.report` with its own :class:`~neuron_workbench.scan.rule.Rule` and,
for a mechanically safe rewrite, a :class:`Fix` that :mod:`neuron_workbench.scan.migrate` applies.
Fixes are keyed by node type and character span, which ``ast`` and libcst agree on, so the scanner
stays the single judge of what is safe to rewrite.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from neuron_workbench.emulator.profiles import DEVICES
from neuron_workbench.scan.context import Context, qualname
from neuron_workbench.scan.findings import Finding
from neuron_workbench.scan.rule import Rule

#: The devices the scanner writes suggestions and fixes for (the ``--target`` choices): the
#: accelerators the workbench targets, :data:`neuron_workbench.emulator.profiles.DEVICES`.
TARGETS = DEVICES


@dataclass(frozen=True)
class Fix:
    """A mechanical rewrite of one node, located by node type and 0-based character span."""

    kind: str
    node: str  # libcst node class name: "SimpleString", "FormattedString", "Call", "Attribute"
    start: tuple[int, int]
    end: tuple[int, int]
    payload: tuple[tuple[str, Any], ...] = ()

    @property
    def key(self) -> tuple[str, tuple[int, int], tuple[int, int]]:
        """What libcst nodes are matched on."""
        return (self.node, self.start, self.end)

    def get(self, name: str) -> Any:
        """Return one payload value."""
        return dict(self.payload)[name]


class _Lines:
    """Converts ``ast``'s UTF-8 byte columns to character columns."""

    def __init__(self, source: str) -> None:
        self._lines = [s.encode("utf-8") for s in re.split(r"\r\n|\r|\n", source)]

    def col(self, line: int, byte_col: int) -> int:
        if 0 < line <= len(self._lines):
            return len(self._lines[line - 1][:byte_col].decode("utf-8", "replace"))
        return byte_col


class Scan:
    """The state of one module's scan, shared by every check.

    Parameters
    ----------
    source : str
        The source text (for character columns and source segments).
    path : str
        Shown in findings.
    target : {"neuron", "tpu"}
        The device the suggestions and fixes are written for.
    ctx : Context
        The first pass's result.
    cell : int or None
        1-based code-cell index for notebooks.

    Attributes
    ----------
    results : list of (Finding, Fix or None)
        What the checks reported, in visiting order.
    claimed : set of int
        ``id()`` of nodes a check has already reported on, so another check that meets the same
        string (a device string inside ``torch.Generator(...)``, an environment variable name
        both in a call and a subscript) does not report it twice.
    parents : dict of int to ast.AST
        Each node's parent, by ``id()``.
    """

    def __init__(self, source: str, path: str, target: str, ctx: Context, cell: int | None) -> None:
        self.lines = _Lines(source)
        self.source = source
        self.path = path
        self.target = target
        self.ctx = ctx
        self.cell = cell
        self.results: list[tuple[Finding, Fix | None]] = []
        self.claimed: set[int] = set()
        self.parents: dict[int, ast.AST] = {}
        # Calls whose device argument an area checks itself (autocast, GradScaler, Generator), so
        # the generic `device=` check leaves them alone.
        self.device_arg_checked: set[int] = set()

    def qn(self, node: ast.AST) -> str | None:
        """The qualified name of a Name/Attribute chain through this module's imports."""
        return qualname(node, self.ctx.imports)

    def start(self, node: Any) -> tuple[int, int]:
        """1-based line and 0-based character column where ``node`` starts."""
        return (node.lineno, self.lines.col(node.lineno, node.col_offset))

    def end(self, node: Any) -> tuple[int, int]:
        """1-based line and 0-based character column where ``node`` ends."""
        return (node.end_lineno, self.lines.col(node.end_lineno, node.end_col_offset))

    def attr_pos(self, func: ast.Attribute) -> tuple[int, int]:
        """Where the attribute name of ``x.attr`` starts (findings on methods point there)."""
        line, col = self.end(func)
        return (line, max(col - len(func.attr), 0))

    def fix(self, kind: str, node: ast.AST, cst_node: str, **payload: Any) -> Fix:
        """A :class:`Fix` of ``kind`` for ``node``, matched as libcst node type ``cst_node``."""
        return Fix(kind, cst_node, self.start(node), self.end(node), tuple(sorted(payload.items())))

    def report(
        self,
        rule: Rule,
        node: ast.AST,
        message: str,
        suggestion: str | None = None,
        fix: Fix | None = None,
        pos: tuple[int, int] | None = None,
    ) -> None:
        """Record a finding of ``rule`` at ``node`` (or at ``pos``), with an optional fix."""
        line, col = pos if pos is not None else self.start(node)
        finding = Finding(
            rule_id=rule.id,
            severity=rule.severity,
            message=message,
            suggestion=suggestion or rule.suggestion,
            source=rule.source,
            path=self.path,
            line=line,
            col=col + 1,
            cell=self.cell,
            fixable=fix is not None,
        )
        self.results.append((finding, fix))

    def is_outermost(self, node: ast.AST) -> bool:
        """Whether ``node`` is not the ``value`` of an enclosing attribute (``a`` in ``a.b``)."""
        parent = self.parents.get(id(node))
        return not (isinstance(parent, ast.Attribute) and parent.value is node)


Hook = Callable[[Scan, Any], None]
TorchNameHook = Callable[[Scan, "ast.Attribute | ast.Name", str, bool], None]


@dataclass(frozen=True)
class Area:
    """One rule area: its rules and the hooks that find them.

    Attributes
    ----------
    name : str
        Short name, e.g. ``"devices"``.
    rules : tuple of Rule
        The rules the area reports.
    hooks : mapping of ast node type to hook
        ``hook(scan, node)`` is called for every node of that type, parents before children.
    torch_name : callable, optional
        ``torch_name(scan, node, qualified_name, called)`` is called for every outermost
        Name/Attribute chain that resolves to a qualified name (a Name only when it is imported).
    prepare : callable, optional
        ``prepare(scan, tree)`` runs once before the walk.
    """

    name: str
    rules: tuple[Rule, ...]
    hooks: Mapping[type[ast.AST], Hook] = field(default_factory=dict)
    torch_name: TorchNameHook | None = None
    prepare: Callable[[Scan, ast.Module], None] | None = None
