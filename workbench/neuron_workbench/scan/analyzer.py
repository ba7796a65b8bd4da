"""The second pass: one walk over a parsed module that runs every rule area's checks.

:func:`~neuron_workbench.scan.context.collect_context` (the first pass) resolves import aliases;
:func:`analyze` then visits each node, parents before children, and calls the hooks that the
areas in :data:`neuron_workbench.scan.checks.AREAS` registered for its type. Each match yields a
:class:`~.findings.Finding` and, for mechanically safe rewrites, a
:class:`~neuron_workbench.scan.checks.base.Fix` that :mod:`.migrate` applies with libcst.
"""

from __future__ import annotations

import ast
from collections import defaultdict

from neuron_workbench.scan.checks import AREAS, TARGETS, Area, Fix, Scan
from neuron_workbench.scan.checks.base import Hook, TorchNameHook
from neuron_workbench.scan.context import Context, collect_context
from neuron_workbench.scan.findings import Finding

__all__ = ["TARGETS", "Context", "Fix", "analyze", "collect_context"]


class _Walk(ast.NodeVisitor):
    """Calls the areas' hooks on every node, parents before children."""

    def __init__(self, scan: Scan, areas: tuple[Area, ...]) -> None:
        self.scan = scan
        self.hooks: dict[type[ast.AST], list[Hook]] = defaultdict(list)
        for area in areas:
            for node_type, hook in area.hooks.items():
                self.hooks[node_type].append(hook)
        self.torch_name_hooks: list[TorchNameHook] = [
            area.torch_name for area in areas if area.torch_name is not None
        ]

    def generic_visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Attribute) or (
            isinstance(node, ast.Name) and node.id in self.scan.ctx.imports
        ):
            self._torch_name(node)
        for hook in self.hooks.get(type(node), ()):
            hook(self.scan, node)
        super().generic_visit(node)

    def _torch_name(self, node: ast.Attribute | ast.Name) -> None:
        # Only the outermost chain (`torch.cuda.synchronize`, not `torch.cuda` inside it).
        if not self.scan.is_outermost(node):
            return
        qn = self.scan.qn(node)
        if qn is None:
            return
        parent = self.scan.parents.get(id(node))
        called = isinstance(parent, ast.Call) and parent.func is node
        for hook in self.torch_name_hooks:
            hook(self.scan, node, qn, called)


def analyze(
    tree: ast.Module,
    source: str,
    path: str = "<cell>",
    *,
    target: str = "neuron",
    context: Context | None = None,
    cell: int | None = None,
) -> list[tuple[Finding, Fix | None]]:
    """Second pass: every rule over one parsed module.

    Parameters
    ----------
    tree : ast.Module
        The parsed source.
    source : str
        The source text (for character columns).
    path : str
        Shown in findings.
    target : {"neuron", "tpu"}
        The device the suggestions and fixes are written for.
    context : Context, optional
        The first pass's result; computed from ``tree`` when omitted (notebooks pass the context
        of all cells).
    cell : int, optional
        1-based code-cell index for notebooks.

    Returns
    -------
    list of (Finding, Fix or None)
        Sorted by location; one finding per rule and location.
    """
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
    scan = Scan(source, path, target, context or collect_context(tree), cell)
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            scan.parents[id(child)] = parent
    for area in AREAS:
        if area.prepare is not None:
            area.prepare(scan, tree)
    _Walk(scan, AREAS).visit(tree)
    seen: set[tuple[str, int, int]] = set()
    unique = []
    for finding, fix in sorted(scan.results, key=lambda r: r[0].sort_key()):
        key = (finding.rule_id, finding.line, finding.col)
        if key not in seen:
            seen.add(key)
            unique.append((finding, fix))
    return unique
