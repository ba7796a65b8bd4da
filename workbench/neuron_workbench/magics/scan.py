"""``%neuron_scan`` and ``%neuron_migrate``: the migration scanner inside a notebook.

The magics only parse arguments and pick the source (a cell body, the previous cell, or a file);
scanning and rewriting live in :mod:`neuron_workbench.scan`, and the returned
:class:`~neuron_workbench.scan.ScanReport` / :class:`~neuron_workbench.scan.Migration` render
themselves.
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.magics.flags import parsed_line, usage_message
from neuron_workbench.scan import (
    TARGETS,
    Migration,
    ScanReport,
    migrate_path,
    migrate_source,
    scan_paths,
    scan_source,
)


@magics_class
class ScanMagics(Magics):
    """Magics that scan code for CUDA-only constructs and migrate the safe ones."""

    def _namespace_imports(self) -> dict[str, str]:
        # Names bound by earlier cells, so that `T.cuda.synchronize()` resolves after
        # `import torch as T` ran in another cell.
        found: dict[str, str] = {}
        for name, value in list(self.shell.user_ns.items()):
            if name.startswith("_"):
                continue
            if isinstance(value, ModuleType):
                found[name] = value.__name__
            elif (inspect.isclass(value) or inspect.isfunction(value)) and str(
                getattr(value, "__module__", "")
            ).startswith("torch."):
                found[name] = f"{value.__module__}.{value.__qualname__}"
        return found

    def _previous_cell(self, magic: str) -> str:
        history = list(getattr(self.shell.history_manager, "input_hist_raw", []) or [])
        # The last entry is the cell running this magic; the one before is "the previous cell".
        if len(history) < 2 or not history[-2].strip():
            raise UsageError(
                f"%{magic}: there is no previous cell to read; give a PATH, or run "
                f"%%{magic} as a cell magic on the code"
            )
        return history[-2]

    @magic_arguments()
    @argument("path", nargs="?", help="a .py file, notebook or directory to scan")
    @argument(
        "--target",
        choices=TARGETS,
        default="neuron",
        help="device the suggestions are written for (default: neuron)",
    )
    @line_cell_magic
    def neuron_scan(self, line: str, cell: str | None = None) -> ScanReport | None:
        """Scan code for CUDA-only constructs and explain each finding.

        Usage::

            %neuron_scan [PATH] [--target neuron|tpu]
            %%neuron_scan [--target neuron|tpu]

        As a cell magic, scans the cell body (the cell is not run). As a line magic, scans PATH
        (a ``.py`` file, a notebook, or a directory), or without PATH the previous cell.
        Returns a ``ScanReport``: linter lines ``path:line:col: RULE-ID message`` as text, and
        a table as HTML. Rules that ``%neuron_migrate`` can rewrite are marked ``[*]``.

        Examples
        --------
        ::

            %neuron_scan train.py
            %%neuron_scan
            model = model.cuda()
        """
        args = parsed_line(self.neuron_scan, line)
        if args is None:  # -h: its help was shown
            return None
        try:
            if cell is not None:
                if args.path:
                    raise UsageError("%%neuron_scan scans its cell body and takes no PATH")
                findings = scan_source(
                    cell,
                    "<cell>",
                    target=args.target,
                    ipython=True,
                    imports=self._namespace_imports(),
                )
            elif args.path:
                findings = scan_paths([args.path], target=args.target)
            else:
                findings = scan_source(
                    self._previous_cell("neuron_scan"),
                    "<cell>",
                    target=args.target,
                    ipython=True,
                    imports=self._namespace_imports(),
                )
        except WorkbenchUsageError as exc:
            raise UsageError(usage_message(exc)) from None
        return ScanReport(tuple(findings), args.target)

    @magic_arguments()
    @argument("path", nargs="?", help="a .py file or notebook to migrate")
    @argument("--write", action="store_true", help="rewrite PATH in place")
    @argument(
        "--next",
        action="store_true",
        help="put the migrated code into a new cell below (cell or previous-cell mode)",
    )
    @argument(
        "--target",
        choices=TARGETS,
        default="neuron",
        help="device to migrate to (default: neuron)",
    )
    @line_cell_magic
    def neuron_migrate(self, line: str, cell: str | None = None) -> Migration | None:
        """Rewrite the mechanically safe CUDA-isms and show the unified diff.

        Usage::

            %neuron_migrate [PATH] [--write] [--target neuron|tpu]
            %%neuron_migrate [--next] [--target neuron|tpu]

        Rewrites device strings (``"cuda:0"`` to ``"neuron:0"``), ``.cuda()`` to
        ``.to("neuron")``, ``torch.cuda`` calls that have a ``torch.neuron`` equivalent,
        ``.is_cuda``, the autocast device and the GradScaler device; comments and formatting are
        kept, and migrating twice changes nothing. Everything else stays a ``%neuron_scan``
        finding. As a cell magic, migrates the cell body without running it; ``--next`` puts the
        result in a new cell below. As a line magic, migrates PATH (``--write`` saves it), or
        without PATH the previous cell. Returns a ``Migration`` (diff, applied and remaining
        findings).

        Examples
        --------
        ::

            %neuron_migrate train.py --write
            %%neuron_migrate --next
            x = torch.ones(3).cuda()
        """
        args = parsed_line(self.neuron_migrate, line)
        if args is None:  # -h: its help was shown
            return None
        try:
            if cell is not None or not args.path:
                if args.write:
                    raise UsageError("%neuron_migrate: --write needs a PATH")
                if cell is not None and args.path:
                    raise UsageError("%%neuron_migrate migrates its cell body and takes no PATH")
                source = cell if cell is not None else self._previous_cell("neuron_migrate")
                migration = migrate_source(
                    source,
                    args.target,
                    path="<cell>",
                    ipython=True,
                    imports=self._namespace_imports(),
                )
                if args.next and migration.changed:
                    self.shell.set_next_input(migration.new_source.rstrip("\n"), replace=False)
                return migration
            if args.next:
                raise UsageError("%neuron_migrate: --next applies to cells, not to PATH")
            return migrate_path(args.path, write=args.write, target=args.target)
        except WorkbenchUsageError as exc:
            raise UsageError(usage_message(exc)) from None


def load_ipython_extension(ipython: Any) -> None:
    """Register :class:`ScanMagics` alone (the package's extension registers it with the rest)."""
    ipython.register_magics(ScanMagics)
