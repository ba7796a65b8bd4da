"""Turn notebook cells (IPython syntax) into plain Python without moving any line.

Line magics (``%pip install x``), shell escapes (``!nvidia-smi``), ``x = !cmd`` / ``x = %time f()``
and help lines (``obj?``) become ``pass`` / ``None`` at the same indentation, so line numbers in
findings match the cell. A cell magic whose body is Python (``%%neuron``, ``%%time``, ...) has its
header blanked and its body scanned; other cell magics (``%%bash``, ``%%html``) are skipped.
No IPython import is needed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from neuron_workbench.errors import WorkbenchUsageError

# Cell magics whose body is Python source.
PYTHON_CELL_MAGICS = frozenset(
    {
        "neuron",
        "neuron_scan",
        "neuron_migrate",
        "time",
        "timeit",
        "capture",
        "prun",
        "debug",
    }
)

_MAGIC_LINE = re.compile(r"^(\s*)(%|!|\?)")
_ASSIGN_MAGIC = re.compile(r"^(\s*[\w.\[\], ]+?=\s*)[!%].*$")
_HELP_LINE = re.compile(r"^(\s*)[\w.]+\?{1,2}\s*$")


#: Shell cell magics whose lines are commands (``%%bash``): scanned for CUDA's tools.
SHELL_CELL_MAGICS = frozenset({"bash", "sh", "script"})
#: The call a shell command line (``!nvidia-smi``) stands as in the Python text, so a check can
#: read the command where the line was (it takes the line's place, column for column).
SHELL_CALL = "__nw_shell__"
#: The subscript a ``%env NAME=...`` line stands as: the name's string starts where it did.
ENV_SUBSCRIPT = "_e__"

_ENV_MAGIC = re.compile(r"^(\s*)%(?:set_)?env\s+([A-Za-z_][A-Za-z0-9_]*)")
_SHELL_LINE = re.compile(r"^(\s*)!(.*)$")


@dataclass(frozen=True)
class MaskedCell:
    """Python text for a cell, and which of its lines were replaced.

    ``scanned_lines`` are replaced lines that stand for what they did (``%env``, ``!cmd``): their
    findings count, while a rewrite still puts the original line back.
    """

    source: str
    masked_lines: frozenset[int]  # 1-based
    scanned_lines: frozenset[int] = frozenset()


def _standing_for(line: str) -> str | None:
    """The Python a ``%env NAME=...`` or ``!command`` line stands as for the checks, else None."""
    m = _ENV_MAGIC.match(line)
    if m:
        indent, name = m.group(1), m.group(2)
        # `_e__['NAME']`: the name's quote where `%env ` was, so the finding's column is the name's
        return f"{indent}{ENV_SUBSCRIPT}[{name!r}]"
    m = _SHELL_LINE.match(line)
    if m:
        return f"{m.group(1)}{SHELL_CALL}({m.group(2).strip()!r})"
    return None


def mask_ipython(source: str) -> MaskedCell | None:
    """Replace IPython-only lines with Python placeholders of the same line count.

    Parameters
    ----------
    source : str
        A cell's source.

    Returns
    -------
    MaskedCell or None
        None when the cell is a non-Python cell magic (``%%bash``, ``%%html``, ...), which is
        skipped.
    """
    lines = source.split("\n")
    masked: set[int] = set()
    scanned: set[int] = set()
    first = lines[0].strip() if lines else ""
    if first.startswith("%%"):
        name = first[2:].split(None, 1)[0] if len(first) > 2 else ""
        args = first[2 + len(name) :].split()
        is_py_file = name == "writefile" and any(a.endswith(".py") for a in args)
        if name in SHELL_CELL_MAGICS and (name != "script" or args[:1] in (["bash"], ["sh"])):
            # every line a command, as after `!` (nvcc, nvidia-smi)
            python = [""] + [
                f"{SHELL_CALL}({line.strip()!r})" if line.strip() else "" for line in lines[1:]
            ]
            every = frozenset(range(1, len(lines) + 1))
            return MaskedCell("\n".join(python), every, every - {1})
        if name not in PYTHON_CELL_MAGICS and not is_py_file:
            return None
        lines[0] = ""
        masked.add(1)
    for i, line in enumerate(lines):
        if i + 1 in masked:
            continue
        standing = _standing_for(line)
        if standing is not None:
            lines[i] = standing
            masked.add(i + 1)
            scanned.add(i + 1)
            continue
        m = _MAGIC_LINE.match(line)
        if m:
            lines[i] = f"{m.group(1)}pass"
            masked.add(i + 1)
            continue
        m = _ASSIGN_MAGIC.match(line)
        if m:
            command = line[m.end(1) :]
            if command.startswith("!"):  # `gpus = !nvidia-smi -L`: read for what it runs
                lines[i] = f"{m.group(1)}{SHELL_CALL}({command[1:].strip()!r})"
                scanned.add(i + 1)
            else:
                lines[i] = f"{m.group(1)}None"
            masked.add(i + 1)
            continue
        m = _HELP_LINE.match(line)
        if m:
            lines[i] = f"{m.group(1)}pass"
            masked.add(i + 1)
    return MaskedCell("\n".join(lines), frozenset(masked), frozenset(scanned))


def unmask(original: str, rewritten: str, masked_lines: frozenset[int]) -> str:
    """Put the original IPython lines back into a rewritten cell (fixes never add lines)."""
    old, new = original.split("\n"), rewritten.split("\n")
    if len(old) != len(new):  # pragma: no cover - fixes keep the line count
        raise ValueError("a rewrite changed the number of lines of a cell")
    return "\n".join(old[i] if i + 1 in masked_lines else new[i] for i in range(len(new)))


@dataclass(frozen=True)
class CodeCell:
    """One code cell of a notebook."""

    index: int  # 1-based among code cells
    nb_index: int  # 0-based among all cells
    source: str


def read_notebook(path: str | Path) -> dict:
    """Load a notebook as JSON (nbformat 4), raising a usage error for bad files."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise WorkbenchUsageError(f"{path}: cannot read notebook: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise WorkbenchUsageError(f"{path}: not a Jupyter notebook (no cells)")
    return data


def code_cells(nb: dict) -> list[CodeCell]:
    """The code cells of a notebook, numbered from 1 like Jupyter's ``In`` order on a fresh run."""
    cells = []
    for nb_index, cell in enumerate(nb["cells"]):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        if isinstance(source, list):
            source = "".join(source)
        cells.append(CodeCell(len(cells) + 1, nb_index, source))
    return cells
