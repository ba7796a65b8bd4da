"""Public entry points: scan and migrate source text, files, notebooks and directories."""

from __future__ import annotations

import ast
import difflib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import libcst as cst

from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.scan.analyzer import analyze
from neuron_workbench.scan.cells import code_cells, mask_ipython, read_notebook, unmask
from neuron_workbench.scan.checks import TARGETS, Fix
from neuron_workbench.scan.context import Context, collect_context
from neuron_workbench.scan.findings import Finding, Migration, ScanSyntaxError
from neuron_workbench.scan.migrate import apply_fixes

_SKIP_DIRS = {
    ".git",
    ".hg",
    ".venv",
    "venv",
    "__pycache__",
    ".ipynb_checkpoints",
    "node_modules",
    ".tox",
    ".nox",
    "build",
    "dist",
}


class _Parsed:
    """A source parsed for scanning: the Python text (magics masked) and its tree."""

    def __init__(
        self,
        source: str,
        python: str,
        tree: ast.Module,
        masked: frozenset[int],
        scanned: frozenset[int] = frozenset(),
    ) -> None:
        self.source = source
        self.python = python
        self.tree = tree
        self.masked = masked
        #: masked lines standing for what they did (``%env``, ``!cmd``): their findings count
        self.scanned = scanned


def _where(path: str, cell: int | None, line: int | None, col: int | None = None) -> str:
    cell_part = f"cell {cell}:" if cell is not None else ""
    col_part = f":{col}" if col else ""
    return f"{path}:{cell_part}{line or 1}{col_part}"


def _check_target(target: str) -> None:
    if target not in TARGETS:
        raise WorkbenchUsageError(
            f"unknown target {target!r}; expected one of {', '.join(TARGETS)}"
        )


def _parse(source: str, path: str, ipython: bool, cell: int | None = None) -> _Parsed | None:
    try:
        return _Parsed(source, source, ast.parse(source), frozenset())
    except SyntaxError as exc:
        error = exc
    if ipython:
        masked = mask_ipython(source)
        if masked is None:
            return None  # a non-Python cell magic
        try:
            return _Parsed(
                source,
                masked.source,
                ast.parse(masked.source),
                masked.masked_lines,
                masked.scanned_lines,
            )
        except SyntaxError:
            pass
    where = _where(path, cell, error.lineno, error.offset)
    raise ScanSyntaxError(f"{where}: cannot parse: {error.msg}") from None


def _use_ipython(path: str, ipython: bool | None) -> bool:
    return (not path.endswith(".py")) if ipython is None else ipython


def _seeded(parsed: _Parsed, imports: Mapping[str, str] | None) -> Context | None:
    if not imports:
        return None
    ctx = Context(
        imports=dict(imports), torch_aliases={name for name, qn in imports.items() if qn == "torch"}
    )
    ctx.merge(collect_context(parsed.tree))
    return ctx


def _scan_parsed(
    parsed: _Parsed, path: str, target: str, context: Context | None = None, cell: int | None = None
) -> list[tuple[Finding, Fix | None]]:
    results = analyze(parsed.tree, parsed.python, path, target=target, context=context, cell=cell)
    # A masked (IPython) line has no finding unless it stands for what it did (`%env`, `!cmd`);
    # no fix rewrites one (the rewrite puts the original line back).
    return [
        (f, None if f.line in parsed.masked else fix)
        for f, fix in results
        if f.line not in parsed.masked or f.line in parsed.scanned
    ]


def scan_source(
    source: str,
    path: str = "<cell>",
    *,
    target: str = "neuron",
    ipython: bool | None = None,
    imports: Mapping[str, str] | None = None,
) -> list[Finding]:
    """Scan Python source text for CUDA-only code.

    Parameters
    ----------
    source : str
        The code (a file's text or a cell).
    path : str
        Shown in the findings.
    target : {"neuron", "tpu"}
        The device the suggestions are written for.
    ipython : bool, optional
        Accept IPython syntax (magics, ``!shell``). Defaults to True unless ``path`` ends in
        ``.py``.
    imports : mapping of str to str, optional
        Names bound outside the source (e.g. by earlier notebook cells) and the qualified names
        they stand for, e.g. ``{"T": "torch", "autocast": "torch.cuda.amp.autocast"}``.

    Returns
    -------
    list of Finding
        Sorted by line and column.

    Raises
    ------
    ScanSyntaxError
        If the source does not parse; the message names path and line.
    """
    _check_target(target)
    parsed = _parse(source, path, _use_ipython(path, ipython))
    if parsed is None:
        return []
    return [f for f, _ in _scan_parsed(parsed, path, target, _seeded(parsed, imports))]


def _notebook_cells(
    path: str, nb: dict, errors: list[str] | None = None
) -> list[tuple[int, _Parsed, Context]]:
    """The notebook's code cells, parsed.

    With ``errors``, a cell that does not parse adds its one-line message there and the others are
    still given; without, its error is raised.
    """
    parsed_cells = []
    shared = Context()
    for cell in code_cells(nb):
        try:
            parsed = _parse(cell.source, path, True, cell.index)
        except ScanSyntaxError as exc:
            if errors is None:
                raise
            errors.append(str(exc))
            continue
        if parsed is not None:
            shared.merge(collect_context(parsed.tree))
            parsed_cells.append((cell.index, parsed, shared))
    return parsed_cells


def _scan_notebook(path: str, nb: dict, target: str) -> list[Finding]:
    """Every cell's findings.

    A cell that does not parse raises once the others are scanned, its error carrying their
    findings (one broken cell hid every finding of the notebook).
    """
    errors: list[str] = []
    findings: list[Finding] = []
    for index, parsed, ctx in _notebook_cells(path, nb, errors):
        findings += [f for f, _ in _scan_parsed(parsed, path, target, ctx, index)]
    if errors:
        more = f" (and {len(errors) - 1} more cells)" if len(errors) > 1 else ""
        raise ScanSyntaxError(errors[0] + more, findings)
    return findings


def _read_text(path: str) -> str:
    p = Path(path)
    if not p.exists():
        raise WorkbenchUsageError(f"{path}: no such file or directory")
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkbenchUsageError(f"{path}: cannot read: {exc}") from None


def _read_python(path: str) -> tuple[str, str]:
    """A ``.py`` file's text as python decodes it, and that encoding (to write it back in).

    Python honours a UTF-8 byte order mark and a PEP 263 coding line (``# -*- coding: latin-1
    -*-``); read as plain UTF-8 such a file was "cannot parse" or "cannot read".
    """
    import io
    import tokenize

    p = Path(path)
    if not p.exists():
        raise WorkbenchUsageError(f"{path}: no such file or directory")
    try:
        data = p.read_bytes()
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        # newline=None: universal newlines, as read_text gave (and python's own reading)
        text = io.TextIOWrapper(io.BytesIO(data), encoding=encoding, newline=None).read()
    except (OSError, UnicodeDecodeError, SyntaxError, LookupError) as exc:
        # SyntaxError: a malformed coding line; LookupError: one naming no known codec
        raise WorkbenchUsageError(f"{path}: cannot read: {exc}") from None
    return text, encoding


def scan_path(path: str | os.PathLike[str], *, target: str = "neuron") -> list[Finding]:
    """Scan one ``.py`` file or ``.ipynb`` notebook.

    Notebooks are scanned cell by cell (code cells only; magics and ``!shell`` lines are skipped,
    ``%%neuron`` bodies are scanned); findings carry the 1-based code-cell index and the line
    within the cell. Imports in one cell apply to the later ones.

    Parameters
    ----------
    path : str or path-like
        The file.
    target : {"neuron", "tpu"}
        The device the suggestions are written for.

    Returns
    -------
    list of Finding
        Sorted by cell, line and column.

    Raises
    ------
    neuron_workbench.errors.WorkbenchUsageError
        If the file is missing or unreadable; :class:`ScanSyntaxError` if it does not parse (for a
        notebook, once its other cells are scanned: the error's ``findings`` are theirs).
    """
    _check_target(target)
    path = os.fspath(path)
    if not Path(path).is_file():
        raise WorkbenchUsageError(f"{path}: no such file")
    if path.endswith(".ipynb"):
        return _scan_notebook(path, read_notebook(path), target)
    source, _ = _read_python(path)
    parsed = _parse(source, path, False)
    assert parsed is not None
    return [f for f, _ in _scan_parsed(parsed, path, target)]


def iter_source_files(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """Expand directories into their ``*.py`` and ``*.ipynb`` files, sorted; keep files as given.

    Raises
    ------
    neuron_workbench.errors.WorkbenchUsageError
        If a path does not exist.
    """
    files: list[str] = []
    for raw in paths:
        path = os.fspath(raw)
        p = Path(path)
        if p.is_dir():
            found = []
            for root, dirs, names in os.walk(p):
                dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
                found += [os.path.join(root, n) for n in names if n.endswith((".py", ".ipynb"))]
            files += sorted(found)
        elif p.exists():
            files.append(path)
        else:
            raise WorkbenchUsageError(f"{path}: no such file or directory")
    return files


def scan_paths(
    paths: Iterable[str | os.PathLike[str]],
    *,
    target: str = "neuron",
    errors: list[str] | None = None,
) -> list[Finding]:
    """Scan files and directories (directories recurse over ``*.py`` and ``*.ipynb``).

    Parameters
    ----------
    paths : iterable of str or path-like
        Files and directories.
    target : {"neuron", "tpu"}
        The device the suggestions are written for.
    errors : list of str, optional
        When given, a file that cannot be read or parsed adds its one-line message here and the
        scan goes on with the other files (a linter's convention); else its error is raised.

    Returns
    -------
    list of Finding
        In file order, then by location.

    Raises
    ------
    neuron_workbench.errors.WorkbenchUsageError
        If a path does not exist; without ``errors``, also if a file cannot be read or parsed.
    """
    _check_target(target)
    findings: list[Finding] = []
    for path in iter_source_files(paths):
        try:
            findings += scan_path(path, target=target)
        except WorkbenchUsageError as exc:  # ScanSyntaxError too
            if errors is None:
                raise
            errors.append(str(exc))
            # what the rest of the file gave (a notebook's other cells)
            findings += getattr(exc, "findings", [])
    return findings


def unified_diff(old: str, new: str, path: str, label: str = "") -> str:
    """A unified diff between two texts, headed ``a/PATH`` and ``b/PATH`` (plain PATH if absolute)."""
    a = old.splitlines(keepends=True)
    b = new.splitlines(keepends=True)
    for lines in (a, b):
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
    suffix = f" ({label})" if label else ""
    before, after = (path, path) if os.path.isabs(path) else (f"a/{path}", f"b/{path}")
    return "".join(difflib.unified_diff(a, b, before + suffix, after + suffix))


def _migrate_parsed(
    parsed: _Parsed, path: str, target: str, context: Context | None = None, cell: int | None = None
) -> tuple[str, list[Finding]]:
    results = _scan_parsed(parsed, path, target, context, cell)
    fixes = [fix for _, fix in results if fix is not None]
    try:
        new_python, applied_keys = apply_fixes(parsed.python, fixes)
    except cst.ParserSyntaxError as exc:
        where = _where(path, cell, exc.raw_line, exc.raw_column + 1)
        raise ScanSyntaxError(f"{where}: cannot parse for rewriting: {exc.message}") from None
    new = unmask(parsed.source, new_python, parsed.masked) if parsed.masked else new_python
    applied = [f for f, fix in results if fix is not None and fix.key in applied_keys]
    return new, applied


def migrate_source(
    source: str,
    target: str = "neuron",
    *,
    path: str = "<cell>",
    ipython: bool | None = None,
    imports: Mapping[str, str] | None = None,
) -> Migration:
    """Rewrite the mechanically safe findings of ``source`` for the target device.

    Only these are rewritten: device strings (``"cuda:0"`` to ``"neuron:0"``), ``.cuda()`` to
    ``.to("neuron")``, ``torch.cuda.X`` with a direct ``torch.neuron`` (or, for tpu,
    ``torch.accelerator``) equivalent, ``.is_cuda``, the autocast device type and the GradScaler
    device. Comments and formatting are preserved; migrating migrated code changes nothing.

    Parameters
    ----------
    source : str
        The code.
    target : {"neuron", "tpu"}
        The device to migrate to.
    path : str
        Shown in the diff and findings.
    ipython : bool, optional
        Accept IPython syntax; defaults to True unless ``path`` ends in ``.py``.
    imports : mapping of str to str, optional
        Names bound outside the source, as for :func:`scan_source`.

    Returns
    -------
    Migration
        New source, unified diff, the applied findings and the findings that remain.
    """
    _check_target(target)
    parsed = _parse(source, path, _use_ipython(path, ipython))
    if parsed is None:
        return Migration(path, source, source, "", [], [])
    new, applied = _migrate_parsed(parsed, path, target, _seeded(parsed, imports))
    remaining = scan_source(new, path, target=target, ipython=ipython, imports=imports)
    diff = unified_diff(source, new, path) if new != source else ""
    return Migration(path, source, new, diff, applied, remaining)


def migrate_path(
    path: str | os.PathLike[str], write: bool = False, target: str = "neuron"
) -> Migration:
    """Migrate a ``.py`` file or a notebook (code cells only), optionally in place.

    Parameters
    ----------
    path : str or path-like
        The file.
    write : bool
        Write the result back to ``path`` (only when something changed).
    target : {"neuron", "tpu"}
        The device to migrate to.

    Returns
    -------
    Migration
        For notebooks ``old_source``/``new_source`` are the notebook JSON and the diff is per cell.
    """
    _check_target(target)
    path = os.fspath(path)
    if not Path(path).is_file():
        raise WorkbenchUsageError(f"{path}: no such file")
    if path.endswith(".ipynb"):
        return _migrate_notebook(path, write, target)
    source, encoding = _read_python(path)
    migration = migrate_source(source, target, path=path, ipython=False)
    if write and migration.changed:
        # in the file's own encoding: UTF-8 bytes under a latin-1 coding line would be misread
        Path(path).write_text(migration.new_source, encoding=encoding)
    return migration


def _migrate_notebook(path: str, write: bool, target: str) -> Migration:
    old_text = _read_text(path)
    nb = read_notebook(path)
    cells = {c.index: c for c in code_cells(nb)}
    diffs: list[str] = []
    applied: list[Finding] = []
    for index, parsed, ctx in _notebook_cells(path, nb):
        new, cell_applied = _migrate_parsed(parsed, path, target, ctx, index)
        if new == parsed.source:
            continue
        applied += cell_applied
        diffs.append(unified_diff(parsed.source, new, path, f"cell {index}"))
        raw = nb["cells"][cells[index].nb_index]
        raw["source"] = new.splitlines(keepends=True) if isinstance(raw["source"], list) else new
    remaining = _scan_notebook(path, nb, target)
    if not diffs:
        return Migration(path, old_text, old_text, "", [], remaining)
    new_text = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    if write:
        Path(path).write_text(new_text, encoding="utf-8")
    return Migration(path, old_text, new_text, "".join(diffs), applied, remaining)
