"""Compile a cell once, split off its last expression (like ``%%time``), and find the names it reads."""

from __future__ import annotations

import ast
import itertools
import linecache
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import CodeType, FunctionType
from typing import Any

from neuron_workbench.errors import WorkbenchUsageError

_cell_counter = itertools.count(1)


@dataclass(frozen=True)
class CellProgram:
    """A cell compiled for execution.

    Attributes
    ----------
    source : str
        The Python source that runs (after IPython's transforms, so ``%magics`` are already calls).
    filename : str
        The pseudo-file the code is compiled under; tracebacks and error reports point into it.
    body : CodeType
        Everything but a trailing expression.
    last_expr : CodeType or None
        The trailing expression, evaluated separately so the magic can return its value.
    last_expr_name : str or None
        The variable name when the trailing expression is just a name (``logits``).
    read_names : dict of str to frozenset of str
        Each global name the cell may read before binding it itself, mapped to the names the cell has
        definitely bound by then (used to prune what notebook functions reach). Reads inside
        functions and classes the cell defines count at the definition.
    """

    source: str
    filename: str
    body: CodeType
    last_expr: CodeType | None
    last_expr_name: str | None
    read_names: dict[str, frozenset[str]]


def compile_cell(
    source: str,
    *,
    filename: str | None = None,
    transform_ast: Callable[[ast.Module], ast.Module] | None = None,
    first_line: int = 1,
) -> CellProgram:
    """Parse and compile ``source``; syntax errors become one-line usage errors.

    Parameters
    ----------
    source : str
        The code to run.
    filename : str, optional
        The pseudo-file to compile under (a fresh ``<neuron-cell-N>`` by default).
    transform_ast : callable, optional
        IPython's AST transforms.
    first_line : int
        The line number ``source``'s first line has where the user sees it: 2 for the body of a
        ``%%neuron`` cell, whose line 1 is the magic. Every line number the run reports (errors,
        call sites, the line a crashed worker was running) then counts as the editor does.
    """
    filename = filename or f"<neuron-cell-{next(_cell_counter)}>"
    before = max(int(first_line), 1) - 1
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        line = exc.lineno + before if exc.lineno else exc.lineno
        raise WorkbenchUsageError(f"syntax error in the cell, line {line}: {exc.msg}") from None
    if transform_ast is not None:
        tree = transform_ast(tree)
    if before:
        ast.increment_lineno(tree, before)
    read_names = _names_read_before_bound(tree)
    last_expr = None
    last_expr_name = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        node = tree.body.pop()
        last_expr = compile(ast.Expression(node.value), filename, "eval")
        if isinstance(node.value, ast.Name):
            last_expr_name = node.value.id
    body = compile(tree, filename, "exec")
    # Register the source so tracebacks and error reports can show the offending line.
    lines = ["\n"] * before + source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    return CellProgram(source, filename, body, last_expr, last_expr_name, read_names)


def _names_read_before_bound(tree: ast.Module) -> dict[str, frozenset[str]]:
    """Names a statement reads that no earlier top-level statement has definitely bound.

    ``model = Net()`` followed by ``model(x)`` never reads the notebook's old ``model``, so it need
    not be copied for each run; ``x = x + 1`` does read it.
    """
    bound: set[str] = set()
    reads: dict[str, frozenset[str]] = {}
    for stmt in tree.body:
        loads = set()
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Store):
                loads.add(node.id)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                loads.add(node.target.id)
            elif isinstance(node, ast.Global | ast.Nonlocal):
                loads.update(node.names)
        snapshot = frozenset(bound)
        for name in loads - bound:
            reads.setdefault(name, snapshot)
        bound |= _definitely_bound(stmt)
    return reads


def _definitely_bound(stmt: ast.stmt) -> set[str]:
    """Names a top-level statement always binds when it completes."""
    names: set[str] = set()
    if isinstance(stmt, ast.Assign):
        for target in stmt.targets:
            names |= _target_names(target)
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        names |= _target_names(stmt.target)
    elif isinstance(stmt, ast.Import | ast.ImportFrom):
        for alias in stmt.names:
            names.add(alias.asname or alias.name.split(".")[0])
    elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        names.add(stmt.name)
    return names


def _target_names(target: ast.expr) -> set[str]:
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Tuple | ast.List):
        return set().union(*(_target_names(e) for e in target.elts)) if target.elts else set()
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    return set()  # attribute or subscript targets mutate an object, they bind no name


def _code_names(code: CodeType) -> Iterable[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _code_names(const)


def _user_functions(value: Any, namespace: Mapping[str, Any]) -> Iterable[FunctionType]:
    """Functions whose globals are ``namespace``: defined in the notebook, so they see its names."""
    if isinstance(value, FunctionType):
        if value.__globals__ is namespace:
            yield value
        return
    owner = value if isinstance(value, type) else type(value)
    if owner.__module__ != namespace.get("__name__", "__main__"):
        return  # a library type: its code does not read notebook globals
    for klass in owner.__mro__:
        for attr in vars(klass).values():
            func = getattr(attr, "__func__", attr)  # staticmethod / classmethod
            if isinstance(attr, property):
                func = attr.fget
            if isinstance(func, FunctionType) and func.__globals__ is namespace:
                yield func


def referenced_names(program: CellProgram, namespace: Mapping[str, Any]) -> set[str]:
    """Names the cell may touch: what it reads, plus what notebook-defined functions it reaches read.

    A training step written as ``train_step()`` with a global ``model`` must still get its own copy
    of ``model`` in each run, so functions, classes and instances defined in the notebook are followed
    through their code's global names.
    """
    seen: set[str] = set()
    todo = [(name, bound) for name, bound in program.read_names.items()]
    while todo:
        name, bound = todo.pop()
        if name in seen or name in bound:
            continue
        seen.add(name)
        if name not in namespace:
            continue
        for func in _user_functions(namespace[name], namespace):
            # a function reached after the cell rebound a name sees the cell's value, not the old one
            todo.extend((n, bound) for n in _code_names(func.__code__) if n not in seen)
    return seen


def calls_backward(program: CellProgram, namespace: Mapping[str, Any]) -> bool:
    """Whether the cell, or a notebook function it reaches, mentions ``backward``.

    A cheap static test used to decide whether gradients are worth watching (``--layers``).
    """
    if "backward" in program.source:
        return True
    for name in referenced_names(program, namespace):
        for func in _user_functions(namespace.get(name), namespace):
            if "backward" in set(_code_names(func.__code__)):
                return True
    return False
