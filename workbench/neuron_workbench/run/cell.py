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
    read_names : frozenset of str
        Every global name the cell loads, including inside functions it defines.
    """

    source: str
    filename: str
    body: CodeType
    last_expr: CodeType | None
    last_expr_name: str | None
    read_names: frozenset[str]


def compile_cell(
    source: str,
    *,
    filename: str | None = None,
    transform_ast: Callable[[ast.Module], ast.Module] | None = None,
) -> CellProgram:
    """Parse and compile ``source``; syntax errors become one-line usage errors."""
    filename = filename or f"<neuron-cell-{next(_cell_counter)}>"
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        raise WorkbenchUsageError(
            f"syntax error in the cell, line {exc.lineno}: {exc.msg}"
        ) from None
    if transform_ast is not None:
        tree = transform_ast(tree)
    read_names = frozenset(_loaded_names(tree))
    last_expr = None
    last_expr_name = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        node = tree.body.pop()
        last_expr = compile(ast.Expression(node.value), filename, "eval")
        if isinstance(node.value, ast.Name):
            last_expr_name = node.value.id
    body = compile(tree, filename, "exec")
    # Register the source so tracebacks and error reports can show the offending line.
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    return CellProgram(source, filename, body, last_expr, last_expr_name, read_names)


def _loaded_names(tree: ast.AST) -> Iterable[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Global | ast.Nonlocal):
            yield from node.names


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
    todo = list(program.read_names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name not in namespace:
            continue
        for func in _user_functions(namespace[name], namespace):
            todo.extend(n for n in _code_names(func.__code__) if n not in seen)
    return seen
