"""Execute a notebook headless in a real kernel and collect every ``%%neuron`` report it produced.

Also the report files every command writes (the run JSON document, JUnit XML), so ``run`` and
``compare`` produce the same shapes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.report.display import UNCOMPARED
from neuron_workbench.report.report import REPORT_MIME
from neuron_workbench.version import __version__

#: ``schema_version`` of the ``run --json`` document (``run.schema.json``).
RUN_SCHEMA_VERSION = 1

_SETUP_TAG = "neuron-workbench-setup"
#: The file ipykernel compiles a cell under, as a SyntaxError names it: ``(3395539720.py, line 1)``
#: (a hash of the cell's code; no importable module has a name of digits only).
_KERNEL_CELL_FILE = re.compile(r"\((?:.*[/\\])?\d+\.py, line (\d+)\)$")

if TYPE_CHECKING:
    from neuron_workbench.run.script import ScriptContext


@dataclass
class InputResult:
    """What one ``run`` or ``compare`` command produced for its input: reports and cell errors.

    The input is a notebook, a script, or (``compare``) two run artifacts; :func:`run_document`
    writes it as the ``run --json`` document, whose ``input`` it describes.
    """

    path: str
    reports: list[dict[str, Any]] = field(default_factory=list)
    cell_errors: list[dict[str, Any]] = field(default_factory=list)
    #: ``notebook``, ``script`` or ``artifacts``.
    kind: str = "notebook"
    #: Code cells executed (1 for a script).
    cells: int = 0
    #: A script that exited with a non-zero code before it was compared (an argument error):
    #: the code and what the script printed (its usage message).
    script_exit: tuple[int, str] | None = None
    #: Code cells starting with ``%%neuron`` (a notebook's; a report or an error each).
    neuron_cells: int = 0
    #: Seconds each code cell of a notebook took in its kernel, by the cell's number (``cell N``):
    #: what a JUnit test case's time is (the runs' bodies are a fraction of a %%neuron cell's).
    cell_seconds: dict[int, float] = field(default_factory=dict)
    #: What a script printed, ``(stdout, stderr)`` of the kept run (the reference's unless ``keep``
    #: is ``target``): ``run`` shows it before the script's reports, as ``python SCRIPT`` would.
    #: Not part of the report files (each run's own output is in its report).
    printed: tuple[str, str] = ("", "")
    #: Whether :attr:`printed` (and a :attr:`script_exit`'s text) was shown as the script printed
    #: it (``run_script(live=True)``): ``run`` then shows it no more.
    shown_live: bool = False

    def verdict_counts(self) -> dict[str, int]:
        """Number of reports per verdict."""
        counts: dict[str, int] = {}
        for report in self.reports:
            counts[report["verdict"]] = counts.get(report["verdict"], 0) + 1
        return counts

    def fallback_reports(self, allowed: Sequence[str] = ()) -> int:
        """Number of reports whose target fell back to CPU on an op not in ``allowed``."""
        return len(self.fallback_violations(allowed))

    def fallback_violations(self, allowed: Sequence[str] = ()) -> list[str]:
        """``label: --strict: ... fell back to CPU: ops`` for each report over ``allowed``."""
        from neuron_workbench.opnames import normalize_op

        exempt = {normalize_op(name) for name in allowed}
        found = []
        for report in self.reports:
            ops = [op for op in report.get("fallback_ops") or () if normalize_op(op) not in exempt]
            if ops:
                target = ((report.get("target") or {}).get("backend") or {}).get("name", "target")
                found.append(
                    f"{report.get('label', '')}: --strict: on {target} these ops fell back to CPU: "
                    f"{', '.join(ops)} (--allow-fallback OP accepts one)"
                )
        return found

    def graph_break_violations(self) -> list[str]:
        """``label: --strict-graph-breaks: ...`` for each report whose target broke a graph."""
        from neuron_workbench.trace.compile import graph_break_violation

        found = []
        for report in self.reports:
            target = report.get("target") or {}
            breaks = (target.get("compile") or {}).get("graph_breaks") or []
            line = graph_break_violation(breaks, (target.get("backend") or {}).get("name", ""))
            if line:
                found.append(f"{report.get('label', '')}: {line}")
        return found

    def exit_code(
        self, strict: bool, strict_graph_breaks: bool = False, allowed: Sequence[str] = ()
    ) -> int:
        """The command's exit code for these results.

        3 when ``strict`` and ops other than the ``allowed`` ones fell back, 4 when
        ``strict_graph_breaks`` and torch.compile broke a graph on a target, else 1 on a failure,
        an error or nothing compared, else 0. A report whose verdict is ``UNCOMPARED`` verified
        nothing, so it is not a pass; nor is a notebook without a ``%%neuron`` cell (no report).
        """
        if strict and self.fallback_reports(allowed):
            return 3
        if strict_graph_breaks and self.graph_break_violations():
            return 4
        counts = self.verdict_counts()
        failed = sum(counts.get(v, 0) for v in ("FAIL", "ERROR", UNCOMPARED))
        return 1 if failed + len(self.cell_errors) or not self.reports else 0


def _setup_source(
    options: Mapping[str, Any], record_dir: str | None = None, against_dir: str | None = None
) -> str:
    # Settings go into the shell's config *before* the extension loads: loading installs the
    # target's emulated device, and a process can emulate only one device.
    from neuron_workbench.cell.option_parsing import config_lines

    own: dict[str, Any] = {
        name: path
        for name, path in {"record_dir": record_dir, "against_dir": against_dir}.items()
        if path
    }
    if own:
        # this cell is the kernel's first: the notebook's cells, numbered from 1 in the report
        # lines, are numbered so in the folder too (cell-1.nwrun.zip is the first code cell's)
        own["cells_before"] = 1
    lines = config_lines(options, own=own)
    lines.append("%load_ext neuron_workbench")
    return "\n".join(lines)


def _checked(options: Mapping[str, Any]) -> None:
    """Raise the one-line usage error of option values no cell could run with."""
    from neuron_workbench.cell.settings import cell_options

    cell_options(options).validate()


def _kernel_manager(kernel_name: str) -> Any:
    """A kernel manager whose kernel talks over local IPC sockets where the platform has them.

    Over TCP, ipykernel warns on the terminal of every ``run`` that the "Kernel is running over TCP
    without encryption"; Unix-domain sockets in a private temporary folder need no encryption and
    end the warning. The folder goes away with :func:`_remove_kernel_sockets`.
    """
    # The asynchronous manager: with the blocking one nbclient's reply poll never times out, so
    # neither --timeout nor the check that the kernel is still alive ran (a dead kernel hung run).
    from jupyter_client.manager import AsyncKernelManager

    if sys.platform.startswith("win"):  # no IPC transport there
        return AsyncKernelManager(kernel_name=kernel_name)
    folder = tempfile.mkdtemp(prefix="nw-kernel-")
    return AsyncKernelManager(
        kernel_name=kernel_name, transport="ipc", ip=os.path.join(folder, "k")
    )


def _remove_kernel_sockets(manager: Any) -> None:
    if getattr(manager, "transport", "tcp") == "ipc":
        shutil.rmtree(os.path.dirname(manager.ip), ignore_errors=True)


def renumber_cell_sites(report: dict[str, Any], offset: int) -> dict[str, Any]:
    """Shift every ``cell [N]`` site of a report's data by ``-offset`` (in place; returns it).

    ``run`` executes a setup cell first, so each notebook cell runs one count later than in a fresh
    Jupyter "Run All"; its sites should read as they would there.
    """
    from neuron_workbench.sites import cell_file

    for role in ("ref", "target"):
        run = report.get(role) or {}
        profile = run.get("profile") or {}
        sites = [event.get("site") for event in run.get("fallbacks") or []]
        for table in ("rows", "first_call", "steady"):
            sites += [row.get("site") for row in profile.get(table) or []]
        for site in sites:
            if isinstance(site, dict) and isinstance(site.get("cell"), int):
                site["cell"] -= offset
                site["file"] = cell_file(site["cell"])
    return report


def _report_of(output: dict[str, Any]) -> Any:
    """The report an output carries: in its data, or in its metadata (``%%neuron --widget``)."""
    return output.get("data", {}).get(REPORT_MIME) or output.get("metadata", {}).get(REPORT_MIME)


def run_notebook(
    path: str | Path,
    *,
    options: Mapping[str, Any] | None = None,
    timeout: int = 900,
    progress: Callable[[int, int], None] | None = None,
    record_dir: str | None = None,
    against_dir: str | None = None,
) -> InputResult:
    """Execute ``path`` with the extension loaded and ``options`` as the magic's defaults.

    ``options`` are option-table values by API name (:mod:`neuron_workbench.cell.options`), set
    as ``%config NeuronMagics`` settings before the extension loads. Cells that raise outside
    ``%%neuron`` do not stop the run; they are listed in ``cell_errors``. ``record_dir`` sets
    ``NeuronMagics.record_dir`` (every ``%%neuron`` cell saves its runs there); ``against_dir``
    makes every ``%%neuron`` cell compare against the reference a ``record_dir`` run saved for it
    (``cell-<N>.nwrun.zip``), instead of running one.
    """
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    if not path.is_file():
        raise WorkbenchUsageError(f"no such notebook: {path}")
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:
        raise WorkbenchUsageError(f"{path} is not a readable notebook: {exc}") from None
    options = dict(options or {})
    # Bad values are usage errors before a kernel starts (the kernel would fail every cell).
    _checked(options)
    setup = nbformat.v4.new_code_cell(
        _setup_source(options, record_dir, against_dir), metadata={"tags": [_SETUP_TAG]}
    )
    nb.cells.insert(0, setup)
    code_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    for index in code_cells:
        if not nb.cells[index].source.strip():
            # an empty cell takes no execution count: the kernel's counts, by which record_dir
            # names its files, would drift from the report lines' cell numbers after it
            nb.cells[index].source = "#"
    neuron_cells = sum(
        1 for index in code_cells if nb.cells[index].source.lstrip().startswith("%%neuron")
    )
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=True,
        # a kernel left running a cell past --timeout is ended, not asked to shut down
        shutdown_kernel="immediate",
        resources={"metadata": {"path": str(path.parent.resolve())}},
    )
    # Set after construction: a client given its manager (km=) would leave the kernel running.
    client.km = manager = _kernel_manager("python3")
    total = len(code_cells) - 1
    replies: dict[int, dict[str, Any]] = {}
    started: dict[int, float] = {}
    seconds: dict[int, float] = {}

    def on_cell_execute(cell: Any, cell_index: int, **kwargs: Any) -> None:
        started[cell_index] = time.monotonic()

    def on_cell_executed(cell: Any, cell_index: int, **kwargs: Any) -> None:
        if cell_index in started:
            seconds[cell_index] = time.monotonic() - started[cell_index]
        reply = kwargs.get("execute_reply") or {}
        replies[cell_index] = dict(reply.get("content", {}))
        if progress is not None and cell_index in code_cells[1:]:
            progress(code_cells.index(cell_index), total)

    client.on_cell_execute = on_cell_execute
    client.on_cell_executed = on_cell_executed
    try:
        client.execute()
    except Exception as exc:  # no kernel, a dead kernel, a timeout: one line, exit 2
        if getattr(client, "_async_cleanup_kernel_future", None) is not None:
            # nbclient's SIGINT/SIGTERM handler ended the kernel; what reached here was its
            # cleanup's AssertionError ("could not be executed: AssertionError: ", no text)
            raise WorkbenchUsageError(
                f"{path}: interrupted (SIGINT or SIGTERM) while a cell ran; the kernel was ended"
            ) from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise WorkbenchUsageError(
            f"{path}: the notebook could not be executed: {type(exc).__name__}: {first}"
        ) from None
    finally:
        _remove_kernel_sockets(manager)
    setup_cell = nb.cells[code_cells[0]]
    for output in setup_cell.get("outputs", []):
        if output.get("output_type") == "error":
            raise WorkbenchUsageError(
                f"{path}: loading neuron_workbench in the kernel failed: "
                f"{output.get('ename', '')}: {output.get('evalue', '')}"
            )
    result = InputResult(
        str(path),
        kind="notebook",
        cells=len(code_cells) - 1,
        neuron_cells=neuron_cells,
        cell_seconds={
            position: seconds[index]
            for position, index in enumerate(code_cells[1:], start=1)
            if index in seconds
        },
    )
    for position, index in enumerate(code_cells[1:], start=1):
        cell = nb.cells[index]
        errors_before = len(result.cell_errors)
        for output in cell.get("outputs", []):
            report = _report_of(output)
            if report:
                if isinstance(report, str):
                    report = json.loads(report)
                report = renumber_cell_sites(json.loads(json.dumps(report)), offset=1)
                report["label"] = f"cell {position}"
                report["cell_index"] = position
                result.reports.append(report)
            elif output.get("output_type") == "error":
                result.cell_errors.append(
                    {
                        "cell_index": position,
                        "type": output.get("ename", ""),
                        "message": _cell_error_message(output.get("evalue", "")),
                    }
                )
        reply = replies.get(index, {})
        if reply.get("status") == "error" and len(result.cell_errors) == errors_before:
            # IPython prints a UsageError (a bad %%neuron flag, an unavailable backend) to stderr
            # instead of an error output; only the execute reply says the cell failed.
            result.cell_errors.append(
                {
                    "cell_index": position,
                    "type": str(reply.get("ename", "")),
                    "message": _cell_error_message(str(reply.get("evalue", ""))),
                }
            )
    return result


def _cell_error_message(message: str) -> str:
    """A cell's error message as the user reads it next to ``cell N``.

    A SyntaxError in a plain cell names the temporary file the kernel compiled the cell under
    (``incomplete input (3395539720.py, line 1)``); the line is the cell's own, so only it stays.
    """
    return _KERNEL_CELL_FILE.sub(r"(line \1)", message)


def terminal_progress(done: int, total: int) -> None:
    """Show ``cell n/N`` on a terminal (nothing when stderr is not one)."""
    if sys.stderr.isatty():
        end = "\n" if done >= total else ""
        sys.stderr.write(f"\rcell {done}/{total}{end}")
        sys.stderr.flush()


def read_script(path: str | Path) -> str:
    """The text of a Python script, decoded as ``python SCRIPT`` decodes it; or a one-line error.

    Python reads a source file's UTF-8 byte order mark and its ``# -*- coding: ... -*-`` line
    (PEP 263): a script saved with a BOM (Windows editors) or declared ``latin-1`` runs under
    ``python``, so it runs here too (read as plain UTF-8, the BOM was a "syntax error" at line 1).
    """
    import importlib.util

    path = Path(path)
    if not path.is_file():
        raise WorkbenchUsageError(f"no such script: {path}")
    try:
        return importlib.util.decode_source(path.read_bytes())
    except (OSError, UnicodeDecodeError, SyntaxError, LookupError) as exc:
        # SyntaxError: a malformed coding line; LookupError: one naming no known codec
        raise WorkbenchUsageError(f"{path} is not a readable Python script: {exc}") from None


def compile_script(path: str | Path, source: str) -> Any:
    """Compile a whole script as one cell; syntax errors name the script."""
    from neuron_workbench.run import compile_cell

    try:
        return compile_cell(source, filename=str(path))
    except WorkbenchUsageError as exc:
        raise WorkbenchUsageError(f"{path}: {exc}".replace("in the cell, ", "")) from None


def script_run_context(
    path: str | Path, args: Sequence[str] = (), cwd: str | None = None
) -> ScriptContext:
    """The context of ``python SCRIPT ARGS`` run from ``cwd`` (default: the script's folder).

    A run instrument (both runs, the target's in its worker). ``argv[0]`` names the script from
    that folder, as ``cd FOLDER && python train.py`` gives it: the script as the command line named
    it (``run sub/train.py``) is relative to the folder the command runs in, so
    ``os.path.abspath(sys.argv[0])`` named ``sub/sub/train.py`` in the runs and the files a script
    finds next to itself that way were missing.
    """
    from neuron_workbench.run.script import ScriptContext

    folder = str(Path(path).resolve().parent)
    run_folder = cwd or folder
    named = str(path)
    if not Path(named).is_absolute() and Path(run_folder).resolve() != Path.cwd().resolve():
        named = os.path.relpath(Path(path).absolute(), run_folder)
    return ScriptContext((named, *args), run_folder, folder)


@dataclass
class ExitWatch:
    """Run instrument: whether the run called ``sys.exit(0)`` (or ``sys.exit()``).

    The run ends such a call as the program's normal end; a script's ``--help`` ends that way
    before it computed anything. Only the instance in this process (the reference run's) is read.
    """

    exited_ok: bool = False

    @contextlib.contextmanager
    def __call__(self, backend: Any = None) -> Iterator[None]:
        """Watch ``sys.exit`` during the run; put it back after."""
        original = sys.exit

        def watched_exit(status: object = None) -> NoReturn:
            self.exited_ok = status in (0, None)
            original(status)

        sys.exit = watched_exit
        try:
            yield None
        finally:
            sys.exit = original


def script_namespace(path: str | Path) -> dict[str, Any]:
    """The globals a script starts with: it runs as ``__main__``.

    ``__file__`` is absolute, as under ``python`` (3.9+), so ``os.path.dirname(__file__)`` names
    the script's folder from any working folder. Call this before changing the working folder.
    ``__doc__``, ``__spec__`` and ``__package__`` are None as there (the docstring, if any, sets
    ``__doc__`` when the script runs): unset, the names fell through to the ``builtins`` module's,
    and ``ArgumentParser(description=__doc__)`` printed its docstring in the script's ``--help``.
    """
    return {
        "__name__": "__main__",
        "__file__": str(Path(path).resolve()),
        "__doc__": None,
        "__spec__": None,
        "__package__": None,
    }


def run_script(
    path: str | Path,
    *,
    options: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    record_dir: str | None = None,
    timeout: float | None = None,
    against: str | None = None,
    args: Sequence[str] = (),
    cwd: str | None = None,
    live: bool = False,
) -> InputResult:
    """Run a CUDA-style script as one ``%%neuron`` cell and collect its report.

    ``options`` are option-table values by API name (:mod:`neuron_workbench.cell.options`), as
    for a cell. Both runs see ``sys.argv == [path, *args]``, run from ``cwd`` (default: the
    script's folder) with ``__name__ == "__main__"``; ``max_steps`` stops both after that many
    scalars from the first call site that makes one. A script that exits with a non-zero code on
    the reference before anything is compared (argparse's usage error) gives
    :attr:`InputResult.script_exit`.

    The reference runs in this process; the target in a worker process (``auto`` for neuron and
    tpu, or ``worker``) or here (``inprocess``); ``timeout`` ends a target run in a worker or Ray
    actor after that many seconds. ``record_dir`` saves both runs (and the report) as
    ``DIR/<script stem>.nwrun.zip``; ``against`` takes the reference from that artifact (or any
    recorded one) instead of running it. With ``live`` what the kept run prints reaches this
    process's streams as it prints it, where that run is here (a training loop's progress, all of
    it before an interrupt); :attr:`InputResult.shown_live` says whether it did.
    """
    from neuron_workbench.backends.registry import prepare_target
    from neuron_workbench.cell.session import Session
    from neuron_workbench.cell.settings import cell_options
    from neuron_workbench.run.target_requests import main_module_over

    source = read_script(path)
    # Everything relative to the invocation folder is resolved before the runs change folder.
    context = script_run_context(path, args, cwd)
    namespace = script_namespace(path)
    exits = ExitWatch()
    asked = any(arg in ("-h", "--help") for arg in args)
    options = cell_options(
        # the script's own --help is printed once, as under python, whatever --steps says
        {"scan": False, **(options or {}), **({"steps": 1} if asked else {})},
        record=str(Path(record_dir).resolve() / f"{Path(path).stem}.nwrun.zip")
        if record_dir
        else None,
        against=against,
    )
    if timeout is not None and (options.cluster or options.resolved_executor == "worker"):
        options = dataclasses.replace(options, timeout=timeout)
    options.validate()
    program = compile_script(path, source)
    # PyTorch's autograd engine only learns of devices registered before its first backward pass,
    # so an in-process emulated target is installed before the reference run can call backward().
    if not options.cluster:
        prepare_target(options.compare.target, options.executor)
    if progress is not None:
        progress(f"running {Path(path).name} on {options.compare.ref} and {options.compare.target}")
    # The script's own lines (and files next to it) read relative to its folder, as in a notebook.
    from neuron_workbench.sites import library_folders

    folders = [str(Path(path).resolve().parent), os.getcwd(), *library_folders()]
    session = Session()
    try:
        # the script is __main__ for the run: pickle and multiprocessing's spawn (DataLoader
        # workers) find its classes there, as under `python SCRIPT`. Its argv, working folder and
        # its folder first on sys.path are each run's alone (`context`, an instrument): set around
        # the whole session, the workbench imported its own modules from the script's folder
        # first, here and in the target's worker (which takes this process's sys.path), and a
        # script's secrets.py stood in for the standard library's one NumPy's generators import
        with context.around_runs(), main_module_over(namespace):
            result = session.run_cell(
                source,
                namespace,
                options,
                program=program,
                relabel=lambda run: run.relabel_sites({}, folders),
                instruments={"script": context, "exit": exits},
                live_output=live,
            )
    finally:
        session.close()
    # sys.exit(0) before anything was compared, asked for help: the script's own --help, not an
    # empty run (`sys.exit(main())` of a script that compared nothing stays UNCOMPARED, exit 1)
    helped = asked and exits.exited_ok and result.report.verdict == UNCOMPARED
    kept = result.captured.get(result.report.options.get("keep", options.compare.keep))
    shown_live = bool(getattr(kept, "live", False))
    exited = script_exit(result.report.ref, exited_ok=helped)
    if exited is not None:
        # shown already where the script printed it (its usage message); `sys.exit("no data")`'s
        # text is Python's to print at exit, which the run did not
        printed_text = (kept.stdout + kept.stderr) if kept is not None else ""
        shown = shown_live and exited[1].strip() in printed_text
        return InputResult(str(path), kind="script", cells=1, script_exit=exited, shown_live=shown)
    reports = []
    # one report per target (--target neuron,tpu), all against the one reference run
    for report in result.reports:
        data = report.to_dict()
        data["label"] = Path(path).name
        data["cell_index"] = 1
        reports.append(data)
    # the kept run's output, once, as the magic shows a cell's (with --against that is the target's)
    printed = (kept.stdout, kept.stderr) if kept is not None else ("", "")
    return InputResult(
        str(path),
        reports=reports,
        kind="script",
        cells=1,
        printed=printed,
        shown_live=shown_live,
    )


def script_exit(run: Any, exited_ok: bool = False) -> tuple[int, str] | None:
    """``(code, printed)`` when ``run`` ended in ``sys.exit(code)`` before it was compared.

    That is a non-zero ``code`` before the script printed anything to its standard output or
    logged a scalar from a tensor (``printed``: the script's usage message), or ``0`` when the
    caller knows the run ended in ``sys.exit(0)`` with nothing to compare, ``exited_ok`` (a
    script's own ``--help``; ``printed``: its standard output). A script that printed or logged its
    progress and then exited non-zero ("the loss did not converge") did its work: its runs are
    reported (``ERROR``, exit 1), report files written.
    """
    from neuron_workbench.compare.scalars import recorded_trace

    error = run.error
    if error is None and exited_ok:
        printed = run.stdout or ""
        return 0, printed if printed.endswith("\n") or not printed else printed + "\n"
    if error is None or error.type != "SystemExit" or (run.stdout or "").strip():
        return None
    logged = recorded_trace(run.extras.get("scalars"))
    if logged is not None and logged.total:
        # its progress went to stderr (`logging`'s default stream), where a usage message goes
        # too: the loss it logged says it ran
        return None
    message = str(error.message).strip()
    if message in ("", "0", "None"):
        return None
    code = int(message) if message.lstrip("-").isdigit() else 1  # sys.exit("text") exits 1
    printed = run.stderr or run.stdout or (message if code == 1 else "")
    return code, printed if printed.endswith("\n") or not printed else printed + "\n"


def terminal_message(text: str) -> None:
    """Show a progress message on a terminal (nothing when stderr is not one)."""
    if sys.stderr.isatty():
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


# --- report files ---------------------------------------------------------------------------------


def run_document(
    result: InputResult,
    *,
    strict: bool,
    options: dict[str, Any],
    strict_graph_breaks: bool = False,
    allowed: Sequence[str] = (),
) -> dict[str, Any]:
    """The ``run --json`` document (documented by ``report/run.schema.json``)."""
    counts = result.verdict_counts()
    return {
        "schema_version": RUN_SCHEMA_VERSION,
        "kind": "neuron-workbench.run",
        "workbench_version": __version__,
        "input": {"path": result.path, "kind": result.kind, "cells": result.cells},
        "options": dict(options),
        "summary": {
            "reports": len(result.reports),
            # the three verdicts always, any other (UNCOMPARED) when it occurs
            "verdicts": {verdict: counts.get(verdict, 0) for verdict in ("PASS", "FAIL", "ERROR")}
            | counts,
            "fallback_reports": result.fallback_reports(),
            "cell_errors": len(result.cell_errors),
            "strict": strict,
            **({"strict_graph_breaks": True} if strict_graph_breaks else {}),
            "exit_code": result.exit_code(strict, strict_graph_breaks, allowed),
        },
        "reports": result.reports,
        "cell_errors": result.cell_errors,
    }


# Characters XML 1.0 cannot hold at all (escaping does not help): most C0 controls, surrogates.
_XML_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(value: Any) -> str:
    return _XML_INVALID.sub("\ufffd", "" if value is None else str(value))


def _report_time(report: dict[str, Any]) -> str:
    total = 0.0
    for role in ("ref", "target"):
        seconds = (report.get(role) or {}).get("wall_time_s")
        if isinstance(seconds, int | float):
            total += seconds
    return f"{total:.3f}"


def _failure_text(report: dict[str, Any]) -> str:
    lines = [report.get("summary", "")]
    for out in report.get("outputs", []):
        if out.get("status") != "match":
            detail = out.get("detail") or ""
            max_abs = out.get("max_abs")
            numbers = f" max|Δ| {max_abs}" if max_abs is not None else ""
            lines.append(f"{out.get('path')}: {out.get('status')}{numbers} {detail}".rstrip())
    for role in ("ref", "target"):
        error = (report.get(role) or {}).get("error")
        if error:
            lines.append(f"{role} raised {error.get('type')}: {error.get('message')}")
    first = (report.get("scalars") or {}).get("first")
    if first:
        lines.append(
            f"observed scalars part first at {first['site']} #{first['occurrence']}: "
            f"{first['ref']} (reference) vs {first['target']} (target)"
        )
        lines += [f"hint: {hint}" for hint in first.get("hints") or []]
    if report.get("fallback_ops"):
        lines.append("fell back to CPU: " + ", ".join(report["fallback_ops"]))
    for warning in report.get("warnings", []):
        lines.append(f"warning: {warning}")
    return "\n".join(lines)


def _target_name(report: Mapping[str, Any]) -> str:
    target = report.get("target")
    backend = target.get("backend") if isinstance(target, Mapping) else None
    return str(backend.get("name", "")) if isinstance(backend, Mapping) else ""


def junit_xml(
    suite: str,
    reports: Sequence[dict[str, Any]],
    cell_errors: Sequence[dict[str, Any]] = (),
    cell_seconds: Mapping[int, float] | None = None,
) -> str:
    """JUnit XML with one ``<testcase>`` per report (``cell N``); ERROR is an error, FAIL a failure.

    UNCOMPARED (a cell that verified nothing) is a failure too. Cells that raised outside
    ``%%neuron`` are test cases with an ``<error>``. ElementTree does the escaping; characters XML
    cannot hold at all are replaced. A case's time is its cell's time in ``cell_seconds`` (shared
    among a cell's cases, one per target), else the runs' bodies (a recorded pair of runs).
    """
    cell_seconds = cell_seconds or {}
    cases: list[tuple[int, ET.Element]] = []
    failures = errors = 0
    # a cell compared on several targets (--target neuron,tpu) has a case per target, each named
    # for it: CI tools take cases of one name for one test, and showed one target's verdict
    indices = [
        int(report.get("cell_index", position)) for position, report in enumerate(reports, 1)
    ]
    targets: dict[int, set[str]] = {}
    for index, report in zip(indices, reports, strict=True):
        targets.setdefault(index, set()).add(_target_name(report))
    for index, report in zip(indices, reports, strict=True):
        name = f"cell {index}"
        if len(targets.get(index, ())) > 1:
            name += f" ({_target_name(report)})"
        took = cell_seconds.get(index)
        case = ET.Element(
            "testcase",
            classname=_xml_text(suite),
            name=_xml_text(name),
            time=_report_time(report)
            if took is None
            else f"{took / max(1, indices.count(index)):.3f}",
        )
        verdict = report.get("verdict")
        summary = _xml_text(report.get("summary", ""))
        if verdict in ("FAIL", "ERROR", UNCOMPARED):
            # a cell that compared nothing verified nothing: a failure, as its exit code says
            tag = "error" if verdict == "ERROR" else "failure"
            failures += verdict != "ERROR"
            errors += verdict == "ERROR"
            element = ET.SubElement(case, tag, message=summary, type=str(verdict))
            element.text = _xml_text(_failure_text(report))
        ET.SubElement(case, "system-out").text = summary
        cases.append((index, case))
    for error in cell_errors:
        index = int(error.get("cell_index", 0))
        case = ET.Element(
            "testcase",
            classname=_xml_text(suite),
            name=f"cell {index}",
            time=f"{cell_seconds.get(index, 0.0):.3f}",
        )
        element = ET.SubElement(
            case,
            "error",
            message=_xml_text(f"{error.get('type', '')}: {error.get('message', '')}"),
            type=_xml_text(error.get("type", "")),
        )
        element.text = _xml_text(error.get("message", ""))
        errors += 1
        cases.append((index, case))
    root = ET.Element("testsuites", name="neuron-workbench")
    suite_element = ET.SubElement(
        root,
        "testsuite",
        name=_xml_text(suite),
        tests=str(len(cases)),
        failures=str(failures),
        errors=str(errors),
        skipped="0",
    )
    for _, case in sorted(cases, key=lambda item: item[0]):
        suite_element.append(case)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def terminal_safe(text: str) -> str:
    """``text`` with its control characters (an artifact's ESC sequences) shown, not obeyed.

    Line breaks and tabs stay. A crafted artifact's strings reach the terminal through ``show``,
    ``compare`` and ``run --against``: escape sequences there could rewrite what the screen shows.
    """
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def check_writable(path: str | Path | None, *, folder: bool = False) -> None:
    """Raise a one-line usage error now for a ``path`` the write after the runs would refuse.

    A long training run must not end with its report refused: a folder named as the file, a file
    where a folder must be made, a folder that cannot be written. ``folder``: ``path`` is a folder
    the command writes into. Nothing is made here (another usage error may still stop the command).
    """
    if path is None:
        return
    target = Path(path).absolute()
    if not folder and target.is_dir():
        raise WorkbenchUsageError(f"cannot write {path}: it is a folder")
    existing = target if folder else target.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise WorkbenchUsageError(f"cannot write {path}: {existing} is not a folder")
    if not os.access(existing, os.W_OK):
        raise WorkbenchUsageError(f"cannot write {path}: {existing} is not writable")


def check_distinct(
    outputs: Mapping[str, str | Path | None], inputs: Sequence[str | Path] = ()
) -> None:
    """Raise a one-line usage error when two files the command writes, or one and an input, are one.

    Parameters
    ----------
    outputs
        The files the command writes, by the option that names each (``--json``).
    inputs
        The files it reads (the notebook, the artifacts).

    Raises
    ------
    WorkbenchUsageError
        ``run nb.ipynb --html nb.ipynb`` wrote the report over the notebook, and ``--json F
        --html F`` kept only the last report written: fail before anything runs.
    """
    seen = {Path(path).resolve(): f"the input {path}" for path in inputs}
    on_stdout = [option for option, path in outputs.items() if str(path) == "-"]
    if len(on_stdout) > 1:
        raise WorkbenchUsageError(
            f"{' and '.join(on_stdout)} both name - (standard output): one report can go there"
        )
    for option, path in outputs.items():
        if path is None or str(path) == "-":
            continue
        key = Path(path).resolve()
        if key in seen:
            raise WorkbenchUsageError(
                f"{option} {path} is also {seen[key]}: one would overwrite the other"
            )
        seen[key] = option


def write_text(path: str | Path, text: str, stdout: TextIO | None = None) -> None:
    """Write a report file, creating its folder; failures are one-line usage errors.

    ``path`` ``-`` writes ``text`` to ``stdout``, the command's standard output (``--json -``).
    """
    if str(path) == "-" and stdout is not None:
        stdout.write(text)
        stdout.flush()
        return
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise WorkbenchUsageError(f"cannot write {path}: {exc.strerror or exc}") from None
