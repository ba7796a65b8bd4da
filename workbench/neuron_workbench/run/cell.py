"""Compile a cell once, split off its last expression (like ``%%time``), and find the names it reads."""

from __future__ import annotations

import ast
import contextlib
import dis
import functools
import itertools
import linecache
import symtable
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import CodeType, FunctionType, MethodType
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
        definitely bound by then (used to prune what notebook functions reach). The global names
        read inside functions, lambdas, classes and comprehensions the cell defines count at the
        definition; their parameters and locals are not reads.
    stored_names : frozenset of str
        The names the cell's top level binds (assignments, loop targets, imports, definitions),
        whatever it binds them to.
    """

    source: str
    filename: str
    body: CodeType
    last_expr: CodeType | None
    last_expr_name: str | None
    read_names: dict[str, frozenset[str]]
    stored_names: frozenset[str] = frozenset()


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
    compiled = _compiled(source, before) if transform_ast is None else None
    if compiled is not None:
        # the same text again (a training step run cell after cell): parsed, analysed and compiled
        # once, its code given this run's file name (new code objects, as a fresh compile's)
        body, last_expr, last_expr_name, read_names, stored = compiled
        body = _with_filename(body, filename)
        last_expr = _with_filename(last_expr, filename) if last_expr is not None else None
        read_names = dict(read_names)
    else:
        body, last_expr, last_expr_name, read_names, stored = _compile(
            source, filename, transform_ast, before
        )
    # Register the source so tracebacks and error reports can show the offending line.
    lines = ["\n"] * before + source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    return CellProgram(source, filename, body, last_expr, last_expr_name, read_names, stored)


_COMPILED_AS = "<neuron-cell>"


@functools.lru_cache(maxsize=64)
def _compiled(source: str, before: int) -> tuple[Any, ...] | None:
    """:func:`_compile` of ``source`` under a stand-in file name (a syntax error is not kept).

    None where compiling warns (``"is" with a literal``): such a cell is compiled each time, so
    the warning names its own file, every time, as a plain cell's does.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = _compile(source, _COMPILED_AS, None, before)
    return None if caught else compiled


def _with_filename(code: CodeType, filename: str) -> CodeType:
    """``code`` and the code objects it holds (functions, classes, comprehensions) in ``filename``."""
    consts = tuple(
        _with_filename(const, filename) if isinstance(const, CodeType) else const
        for const in code.co_consts
    )
    return code.replace(co_filename=filename, co_consts=consts)


def _compile(
    source: str,
    filename: str,
    transform_ast: Callable[[ast.Module], ast.Module] | None,
    before: int,
) -> tuple[CodeType, CodeType | None, str | None, dict[str, frozenset[str]], frozenset[str]]:
    """The body, last expression, its name, the names read and those stored, of ``source``."""
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
    try:  # what only the whole module shows: `await` at the top, `return` or `yield` outside
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            node = tree.body.pop()
            last_expr = compile(ast.Expression(node.value), filename, "eval")
            if isinstance(node.value, ast.Name):
                last_expr_name = node.value.id
        body = compile(tree, filename, "exec")
    except SyntaxError as exc:
        hint = (
            "; top-level await works in plain cells only: await it in a plain cell and use the "
            "result here"
            if "await" in exc.msg
            else ""
        )
        raise WorkbenchUsageError(
            f"syntax error in the cell, line {exc.lineno}: {exc.msg}{hint}"
        ) from None
    stored = _stored_names(body) | (_stored_names(last_expr) if last_expr else frozenset())
    return body, last_expr, last_expr_name, read_names, stored


_STORES = frozenset({"STORE_NAME", "STORE_GLOBAL"})


def _stored_names(code: CodeType) -> frozenset[str]:
    """The names ``code``'s own (module-level) instructions bind, as the compiler resolved them."""
    return frozenset(
        instruction.argval
        for instruction in dis.get_instructions(code)
        if instruction.opname in _STORES
    )


def _names_read_before_bound(tree: ast.Module) -> dict[str, frozenset[str]]:
    """Names a statement reads that no earlier top-level statement has definitely bound.

    ``model = Net()`` followed by ``model(x)`` never reads the notebook's old ``model``, so it need
    not be copied for each run; ``x = x + 1`` does read it.
    """
    reads: dict[str, frozenset[str]] = {}
    _block_reads(tree.body, set(), reads)
    return reads


def _block_reads(body: list[ast.stmt], bound: set[str], reads: dict[str, frozenset[str]]) -> None:
    """Note in ``reads`` what each statement of ``body`` reads unbound; ``bound`` grows as they bind.

    A ``with ... as f`` or ``for x in ...`` statement's body runs with its targets bound: a body
    reading ``f`` does not read the notebook's ``f`` (a closed file an earlier run of the cell
    left there, which could not be sent to the worker).
    """
    for stmt in body:
        if isinstance(stmt, ast.With | ast.AsyncWith):
            inner = set(bound)
            targets: set[str] = set()
            for item in stmt.items:  # each item's expression is evaluated before its target binds
                _expression_reads(item.context_expr, inner, reads)
                if item.optional_vars is not None:
                    _expression_reads(item.optional_vars, inner, reads)  # `as obj.attr` reads obj
                    targets |= _target_names(item.optional_vars)
                    inner |= targets
            _block_reads(stmt.body, inner, reads)
            bound |= targets  # not the body's bindings: a context manager may suppress the rest
        elif isinstance(stmt, ast.For | ast.AsyncFor):
            _expression_reads(stmt.iter, bound, reads)
            _expression_reads(stmt.target, bound, reads)  # `for obj.i in ...` reads obj
            _block_reads(stmt.body, bound | _target_names(stmt.target), reads)
            _block_reads(stmt.orelse, set(bound), reads)  # no item: the target is not bound
        else:
            snapshot = frozenset(bound)
            for name in _statement_reads(stmt) - bound:
                reads.setdefault(name, snapshot)
            bound |= _definitely_bound(stmt)


def _expression_reads(expr: ast.expr, bound: set[str], reads: dict[str, frozenset[str]]) -> None:
    """Note in ``reads`` what ``expr`` reads that ``bound`` does not hold (a target's objects too)."""
    snapshot = frozenset(bound)
    for name in _statement_reads(ast.Expr(value=expr)) - bound:
        reads.setdefault(name, snapshot)


# Nodes that open a scope of their own: a statement without any is read exactly by a plain walk.
_SCOPES = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Lambda,
    ast.GeneratorExp,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp)
_Comprehension = ast.ListComp | ast.SetComp | ast.DictComp


def _statement_reads(stmt: ast.stmt) -> set[str]:
    """Global names one top-level statement reads, itself or in the scopes it defines.

    Parameters
    ----------
    stmt : ast.stmt
        A statement of the cell's body.

    Returns
    -------
    set of str
        Every name loaded, deleted, updated in place (``x += 1``) or declared ``global`` in the
        cell's own scope, plus the names that functions, lambdas, classes and comprehensions defined
        in ``stmt`` look up in the cell's (the notebook's) globals. Their parameters and locals, and
        names bound in an enclosing function, are left out.
    """
    loads: set[str] = set()
    updated: set[str] = set()  # ``x += 1`` and ``del x`` need an ``x``, yet symtable sees bindings
    comprehensions: list[_Comprehension] = []
    scoped = False
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Del):
                updated.add(node.id)
            if not isinstance(node.ctx, ast.Store):
                loads.add(node.id)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            loads.add(node.target.id)
            updated.add(node.target.id)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            loads.update(node.names)
        elif isinstance(node, _SCOPES):
            scoped = True
            if isinstance(node, _COMPREHENSIONS):
                comprehensions.append(node)
    if not scoped:
        return loads  # every name is in the cell's own scope: the walk is exact, and cheaper
    try:
        table = symtable.symtable(_unparse_scopes(stmt, comprehensions), "<neuron-cell>", "exec")
    except (SyntaxError, ValueError):
        return loads  # e.g. a ``nonlocal`` with no binding: the compile fails too; keep every name
    return _global_reads(table, updated)


def _unparse_scopes(stmt: ast.stmt, comprehensions: list[_Comprehension]) -> str:
    """``stmt``'s source, with its list, set and dict comprehensions written as generator expressions.

    From Python 3.12 symtable merges those comprehensions into the enclosing scope (PEP 709),
    where their loop variables would pass for reads of the cell; a generator expression keeps a
    scope of its own, under the same rules. The nodes are relabelled in place just for this
    ``ast.unparse`` (copying the tree would cost more than the rest) and restored before returning.
    """
    kinds = [type(node) for node in comprehensions]
    try:
        for node in comprehensions:
            if isinstance(node, ast.DictComp):
                node.elt = ast.Tuple([node.key, node.value], ast.Load())
            node.__class__ = ast.GeneratorExp
        return ast.unparse(stmt)
    finally:
        for node, kind in zip(comprehensions, kinds):
            node.__class__ = kind
            if kind is ast.DictComp:
                vars(node).pop("elt", None)


def _global_reads(table: symtable.SymbolTable, updated: set[str]) -> set[str]:
    """Names the scopes in a module's symbol table read from the module's globals.

    Parameters
    ----------
    table : symtable.SymbolTable
        The table of one statement compiled as a module.
    updated : set of str
        Names the statement updates in place or deletes: reads where the module or a class body
        binds them (a function's own ``x += 1`` fails unless it declares ``x`` global).
    """
    names: set[str] = set()
    todo = [table]
    while todo:
        table = todo.pop()
        kind = table.get_type()
        for symbol in table.get_symbols():
            name = symbol.get_name()
            if kind == "module":
                read = symbol.is_referenced() or symbol.is_declared_global() or name in updated
            elif kind == "class":
                # A class body looks a name up in its own namespace, then in the globals, so a
                # name it binds may still be read before that (``lr = lr``). A free name belongs
                # to an enclosing function.
                read = symbol.is_global() or (
                    not symbol.is_free() and (symbol.is_referenced() or name in updated)
                )
            else:  # function, lambda, generator expression; annotation scopes from Python 3.12
                read = symbol.is_global()
            if read:
                names.add(name)
        todo.extend(table.get_children())
    return names


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


def _user_functions(
    value: Any, namespace: Mapping[str, Any], depth: int = 0
) -> Iterable[FunctionType]:
    """Functions whose globals are ``namespace``: defined in the notebook, so they see its names.

    Also those a value calls through: a bound method's function (and its instance's class), a
    partial's function, a wrapper's wrapped function and the functions its closure holds
    (``@timed def train_step()``).
    """
    if depth > 4:
        return
    if isinstance(value, MethodType):
        yield from _user_functions(value.__func__, namespace, depth + 1)
        value = value.__self__
    elif isinstance(value, functools.partial):
        yield from _user_functions(value.func, namespace, depth + 1)
        return
    if isinstance(value, FunctionType):
        if value.__globals__ is namespace:
            yield value
        inner = [vars(value).get("__wrapped__")]
        for cell in value.__closure__ or ():
            with contextlib.suppress(ValueError):  # a cell not filled yet
                inner.append(cell.cell_contents)
        for each in inner:
            if isinstance(each, FunctionType | MethodType | functools.partial):
                yield from _user_functions(each, namespace, depth + 1)
        return
    torch = sys.modules.get("torch")  # (no torch imported: no module can hold a hook)
    if torch is not None and isinstance(value, torch.nn.Module | torch.optim.Optimizer):
        # the hooks a plain cell registered on it run inside the cell (a forward hook appending
        # to a notebook list): their globals are read as the cell's own reads are
        for hook in _hooks_of(value, torch):
            yield from _user_functions(hook, namespace, depth + 1)
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


#: The hook tables of a module, and of an optimizer, that PyTorch calls during a step.
_MODULE_HOOKS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
)
_OPTIMIZER_HOOKS = ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks")


def _hooks_of(value: Any, torch: Any) -> Iterable[Any]:
    """The hook functions a module (its submodules' and parameters' too) or an optimizer holds."""
    if not isinstance(value, torch.nn.Module):  # an optimizer (one may have `modules` of its own)
        for table in _OPTIMIZER_HOOKS:
            yield from (getattr(value, table, None) or {}).values()
        return
    # Module.modules() by hand, without a generator per level: 17 instead of 25 ms on a model of
    # 12,000 modules, in every cell that reads it
    stack, seen = [value], set()
    while stack:
        module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        attributes = vars(module)
        for table in _MODULE_HOOKS:
            hooks = attributes.get(table)
            if hooks:
                yield from hooks.values()
        for param in (attributes.get("_parameters") or {}).values():
            if param is not None:
                hooks = param._backward_hooks
                if hooks:
                    yield from hooks.values()
        stack.extend(
            child for child in (attributes.get("_modules") or {}).values() if child is not None
        )


def referenced_names(program: CellProgram, namespace: Mapping[str, Any]) -> set[str]:
    """Names the cell may touch: what it reads, plus what notebook-defined functions it reaches read.

    A training step written as ``train_step()`` with a global ``model`` must still get its own copy
    of ``model`` in each run, so functions, classes and instances defined in the notebook are followed
    through their code's global names.
    """
    seen: set[str] = set()
    todo = [(name, bound) for name, bound in program.read_names.items()]
    unpickles = not _UNPICKLERS.isdisjoint(_code_names(program.body))
    while True:
        while todo:
            name, bound = todo.pop()
            if name in seen or name in bound:
                continue
            seen.add(name)
            if name not in namespace:
                continue
            for func in _user_functions(namespace[name], namespace):
                # a function reached after the cell rebound a name sees the cell's value
                names = set(_code_names(func.__code__))
                unpickles = unpickles or not _UNPICKLERS.isdisjoint(names)
                todo.extend((n, bound) for n in names if n not in seen)
        if not unpickles:
            return seen
        # torch.load(path, weights_only=False) of a whole model: pickle finds the notebook's
        # classes on __main__ by name, also those the cell does not name (a worker's __main__
        # holds only what the cell reads)
        # Only the classes themselves: what their methods read travels with them by value,
        # and following it would copy (and send) every dataset or model a method mentions.
        seen.update(_notebook_classes(namespace))
        return seen


#: Names of calls that unpickle (``torch.load``, ``pickle.load(s)``, ``joblib.load``,
#: ``pd.read_pickle``): what they load may hold instances of the notebook's classes.
_UNPICKLERS = frozenset({"load", "loads", "read_pickle"})


def _notebook_classes(namespace: Mapping[str, Any]) -> list[str]:
    """The names of the classes the notebook defined, bound where pickle looks them up."""
    return [
        name
        for name, value in list(namespace.items())
        if isinstance(value, type)
        and getattr(value, "__module__", None) == "__main__"
        and getattr(value, "__qualname__", None) == name
    ]


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
