"""Check the package's layering from its source: ``python -m neuron_workbench._devtools.layers``.

The imports of every module are read with :mod:`ast` (no module is imported), including imports
inside functions; only imports under ``if TYPE_CHECKING:`` are left out, since they never run.
Four rules are checked:

``layer``
    A unit (a subpackage such as ``report``, or a top-level module such as ``errors``) imports only
    units of *lower* tiers of :data:`TIERS`; units of one tier do not import each other.
``cycle``
    No import cycle between units (every cycle is also a ``layer`` violation, but is reported as
    one finding naming the whole cycle).
``private``
    No unit imports another unit's private module (a module path component ``_name``).
``external``
    Only the units in :data:`EXTERNAL_OWNERS` import the listed third-party packages (IPython only
    in the magic layer and the test helpers, plotly/ipywidgets only in views, device SDKs only in
    backend adapters, and no torch in the static scanner).

The command prints every violation and exits 1 if there is any. The test
(``tests/_devtools/test_layers.py``) holds the allow-list of today's known violations, so that
only new ones fail it.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "neuron_workbench"
#: The root package module: ``load_ipython_extension`` and ``emulate`` (a façade over the layers).
ROOT = "(root)"
#: Constants the root module defines (``__version__``): importing them runs no other module, so
#: they are a leaf below every layer rather than an import of the façade.
ROOT_CONSTANTS = "(root constants)"

#: Units from top to bottom. A unit may import units of lower tiers only.
TIERS: tuple[tuple[str, frozenset[str]], ...] = (
    # Entry points: the extension façade, the test helpers and these tools.
    ("entry points", frozenset({ROOT, "testing", "_devtools"})),
    # `neuron-workbench run` drives the cell magic, so the CLI sits above it.
    ("command line", frozenset({"cli"})),
    ("magics", frozenset({"magics"})),
    ("views", frozenset({"views"})),
    ("report", frozenset({"report"})),
    # Saved runs: built on run records and comparison leaves; the report may load them.
    ("artifacts", frozenset({"artifacts"})),
    # Comparing reads what recording wrote (op profiles, layer traces), never the other way.
    ("compare", frozenset({"compare"})),
    # Recording and running are peers; the static scanner needs none of them.
    ("trace / run / scan", frozenset({"trace", "run", "scan"})),
    # The neuron/tpu adapters install the emulator when the real SDK is absent.
    ("backends", frozenset({"backends"})),
    ("emulator", frozenset({"emulator"})),
    # CUDA's semantics in plain PyTorch, shared by the host reference and the emulated devices;
    # source-line attribution of ops, shared by the emulator, the backends and the op recorder;
    # op-name spellings, shared by the backends' recorders, trace/ and compare/.
    (
        "errors / cuda semantics / sites / op names",
        frozenset({"errors", "cuda_semantics", "sites", "opnames", ROOT_CONSTANTS}),
    ),
)

#: Third-party top-level packages and the only units allowed to import them.
EXTERNAL_OWNERS: dict[str, frozenset[str]] = {
    "IPython": frozenset({"magics", "testing"}),
    "plotly": frozenset({"views"}),
    "ipywidgets": frozenset({"views"}),
    "torch_neuronx": frozenset({"backends"}),
    "torch_tpu": frozenset({"backends"}),
    "torch_xla": frozenset({"backends"}),
}
#: Third-party packages a unit must not import (on top of :data:`EXTERNAL_OWNERS`).
EXTERNAL_FORBIDDEN: dict[str, frozenset[str]] = {
    # The scanner runs where torch is not installed (README of scan/).
    "scan": frozenset({"torch"}),
}


@dataclass(frozen=True)
class Import:
    """One import statement's target, as read from the source.

    Attributes
    ----------
    module : str
        The importing module, e.g. ``"neuron_workbench.report.driver"``.
    line : int
        1-based line of the import statement.
    target : str
        The imported module (``neuron_workbench.x.y``) or the third-party top-level package.
    in_function : bool
        Whether the import runs only when a function is called.
    """

    module: str
    line: int
    target: str
    in_function: bool


@dataclass(frozen=True)
class Violation:
    """One broken rule.

    Attributes
    ----------
    rule : {"layer", "cycle", "private", "external"}
        Which rule.
    key : str
        A stable identity for allow-lists, e.g. ``"layer: trace -> compare"``.
    where : tuple of str
        ``module:line`` of each import behind it (empty for a cycle).
    detail : str
        One line saying what is wrong.
    """

    rule: str
    key: str
    where: tuple[str, ...]
    detail: str

    def format(self) -> str:
        """``key: detail`` and the import locations, one per line."""
        lines = [f"{self.key}  ({self.detail})"]
        lines += [f"    {w}" for w in self.where]
        return "\n".join(lines)


def package_dir() -> Path:
    """The directory of the ``neuron_workbench`` package next to this tool."""
    return Path(__file__).resolve().parent.parent


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    # Yields every node with whether it sits in a function, skipping `if TYPE_CHECKING:` bodies.
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield other, in_function
                yield from _walk(other, in_function)
            continue
        inner = in_function or isinstance(
            child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
        )
        yield child, in_function
        yield from _walk(child, inner)


class _Modules:
    """The package's modules by dotted name, to tell ``from pkg import module`` from a name."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}

    def resolve_from(self, module: str, names: Sequence[str]) -> list[str]:
        found = [f"{module}.{n}" for n in names if f"{module}.{n}" in self.files]
        return found if len(found) == len(names) else [*found, module]


def read_imports(root: Path | None = None) -> list[Import]:
    """Every import in the package under ``root`` (default: this package), read with ``ast``.

    Parameters
    ----------
    root : Path, optional
        The package directory (its name is the package name).

    Returns
    -------
    list of Import
        Imports of the package's own modules by full dotted name; third-party imports by their
        top-level package. Standard-library imports are included as third-party ones.
    """
    root = root or package_dir()
    modules = _Modules(root)
    imports: list[Import] = []
    for name, path in modules.files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_package = path.name == "__init__.py"
        for node, in_function in _walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = name.split(".") if is_package else name.split(".")[:-1]
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join([*parts, *([base] if base else [])])
                if base == root.name or base.startswith(root.name + "."):
                    names = [alias.name for alias in node.names]
                    if base == root.name:
                        # `from neuron_workbench import __version__` reads a root constant.
                        targets = [
                            f"{base}.{n}" if f"{base}.{n}" in modules.files else ROOT_CONSTANTS
                            for n in names
                        ]
                    else:
                        targets = modules.resolve_from(base, names)
                else:
                    targets = [base]
            for target in targets:
                if target == ROOT_CONSTANTS or target.split(".")[0] == root.name:
                    imports.append(Import(name, node.lineno, target, in_function))
                elif target:
                    imports.append(Import(name, node.lineno, target.split(".")[0], in_function))
    return imports


def unit_of(module: str) -> str:
    """The unit a module belongs to: ``report`` for ``neuron_workbench.report.html``."""
    if module == ROOT_CONSTANTS:
        return ROOT_CONSTANTS
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def _tier_index() -> dict[str, int]:
    return {unit: i for i, (_, units) in enumerate(TIERS) for unit in units}


def _is_internal(imp: Import, package: str) -> bool:
    return imp.target == ROOT_CONSTANTS or imp.target.split(".")[0] == package


def _where(imp: Import) -> str:
    return f"{imp.module}:{imp.line}" + (" (in a function)" if imp.in_function else "")


def unit_graph(imports: Sequence[Import], package: str = PACKAGE) -> dict[str, set[str]]:
    """Unit -> the other units it imports."""
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in imports:
        if _is_internal(imp, package):
            src, dst = unit_of(imp.module), unit_of(imp.target)
            if src != dst:
                graph[src].add(dst)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    # Tarjan's strongly connected components; each component of two or more units is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(unit: str) -> None:
        index[unit] = low[unit] = len(index)
        stack.append(unit)
        on_stack.add(unit)
        for nxt in sorted(graph.get(unit, ())):
            if nxt not in index:
                visit(nxt)
                low[unit] = min(low[unit], low[nxt])
            elif nxt in on_stack:
                low[unit] = min(low[unit], index[nxt])
        if low[unit] == index[unit]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == unit:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for unit in sorted(set(graph) | {u for targets in graph.values() for u in targets}):
        if unit not in index:
            visit(unit)
    return sorted(found)


def module_cycles(imports: Sequence[Import], package: str = PACKAGE) -> list[list[str]]:
    """Import cycles between modules of one unit (reported as notes, not violations).

    Imports inside functions count, so a cycle here need not fail at import time; it still means
    the two modules cannot be understood (or moved) one without the other.
    """
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in imports:
        if _is_internal(imp, package) and imp.target != ROOT_CONSTANTS:
            if imp.module != imp.target and unit_of(imp.module) == unit_of(imp.target):
                graph[imp.module].add(imp.target)
    return _cycles(graph)


def check(imports: Sequence[Import], package: str = PACKAGE) -> list[Violation]:
    """Every violation of the four rules (see the module docstring), sorted by key.

    Parameters
    ----------
    imports : sequence of Import
        From :func:`read_imports`.
    package : str
        The package name.

    Returns
    -------
    list of Violation
        One per (rule, importing unit, imported unit or package), with every import behind it.
    """
    tiers = _tier_index()
    grouped: dict[tuple[str, str, str], list[Import]] = defaultdict(list)
    details: dict[tuple[str, str, str], str] = {}
    for imp in imports:
        src = unit_of(imp.module)
        if _is_internal(imp, package):
            dst = unit_of(imp.target)
            if src == dst:
                continue
            if src not in tiers or dst not in tiers:
                unknown = src if src not in tiers else dst
                key = ("layer", src, dst)
                details[key] = f"{unknown} is in no tier of TIERS; place it"
            elif tiers[dst] <= tiers[src]:
                key = ("layer", src, dst)
                how = "a peer" if tiers[dst] == tiers[src] else "a higher layer"
                details[key] = f"{src} imports {how}: {dst} is in tier '{TIERS[tiers[dst]][0]}'"
            else:
                key = None
            if key is not None:
                grouped[key].append(imp)
            private = [p for p in imp.target.split(".")[1:] if p.startswith("_")]
            if private and not private[0].startswith("__"):
                key = ("private", src, imp.target)
                details[key] = f"{imp.target} is private to {dst}"
                grouped[key].append(imp)
        else:
            owners = EXTERNAL_OWNERS.get(imp.target)
            forbidden = EXTERNAL_FORBIDDEN.get(src, frozenset())
            if (owners is not None and src not in owners) or imp.target in forbidden:
                key = ("external", src, imp.target)
                allowed = ", ".join(sorted(owners)) if owners is not None else "none"
                details[key] = f"only {allowed} may import {imp.target}"
                grouped[key].append(imp)
    violations = [
        Violation(rule, f"{rule}: {src} -> {dst}", tuple(_where(i) for i in imps), details[key])
        for key, imps in grouped.items()
        for rule, src, dst in [key]
    ]
    violations += [
        Violation("cycle", "cycle: " + " <-> ".join(cycle), (), "import cycle between units")
        for cycle in _cycles(unit_graph(imports, package))
    ]
    return sorted(violations, key=lambda v: v.key)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the tiers and every violation; exit status 1 if there is any."""
    parser = argparse.ArgumentParser(
        prog="python -m neuron_workbench._devtools.layers", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--root", type=Path, default=None, help="package directory to check")
    args = parser.parse_args(argv)
    root = args.root or package_dir()
    imports = read_imports(root)
    violations = check(imports, root.name)
    for name, units in TIERS:
        print(f"{name:>30}: {', '.join(sorted(units))}")
    print()
    for violation in violations:
        print(violation.format())
    for cycle in module_cycles(imports, root.name):
        print("note: module cycle inside a unit: " + " <-> ".join(cycle))
    print(f"{len(violations)} violation{'s' if len(violations) != 1 else ''}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
