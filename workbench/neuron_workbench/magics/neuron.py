"""The ``%%neuron`` cell magic and the ``%neuron_backends`` line magic."""

from __future__ import annotations

import contextlib
import keyword
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import (
    Magics,
    cell_magic,
    line_magic,
    magics_class,
    output_can_be_silenced,
)
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display
from IPython.utils.capture import capture_output
from traitlets import Bool, Dict, Enum, Float, HasTraits, Int, List, TraitType, Unicode, default

from neuron_workbench.backends.registry import BackendStatusTable, prepare_target
from neuron_workbench.cell.option_parsing import argument_spec, given_values
from neuron_workbench.cell.options import MAGIC, TRAIT, Option, options_for
from neuron_workbench.cell.session import Session
from neuron_workbench.cell.settings import cell_options
from neuron_workbench.errors import WorkbenchUsageError, interrupted_where
from neuron_workbench.magics.flags import parsed_line, usage_message
from neuron_workbench.report.display import format_bytes
from neuron_workbench.run import compile_cell
from neuron_workbench.run.executor import capture_text
from neuron_workbench.run.module_versions import remember_assigned_attributes
from neuron_workbench.sites import library_folders

__all__ = ["NeuronMagics", "prepare_target"]


def _capture(live: bool = False) -> Any:
    """A run's output, captured (``show()`` replays it), or with ``live`` shown as it comes.

    Shown as it comes, what the run displays (``display()``, a progress bar's widget) goes straight
    to the notebook, and the text it prints is also kept for the run's record.
    """
    if live:
        return capture_text(live=True)
    return capture_output(stdout=True, stderr=True, display=True)


def _unquoted(value: str | None) -> str | None:
    """``value`` without the quotes around it (a path with spaces, quoted in the magic's line)."""
    if value and len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _is_variable_name(name: str) -> bool:
    """Whether ``name`` can be assigned and read as a plain name in a cell (``-o NAME``)."""
    return name.isidentifier() and not keyword.iskeyword(name)


def _recorded_cell(folder: str, count: int) -> str | None:
    """``FOLDER/cell-<count>.nwrun.zip`` (``against_dir``), or None when no folder is set."""
    if not folder:
        return None
    path = Path(folder) / f"cell-{count}.nwrun.zip"
    if not path.is_file():
        raise WorkbenchUsageError(
            f"no recorded reference for this cell: {path} (record with --record/record_dir first)"
        )
    return str(path)


def cell_filenames(shell: Any, own_filename: str) -> dict[str, int]:
    """Compiled filename of each notebook cell → its execution count (``cell [N]`` in sites).

    IPython records the temporary file every cell is compiled under (``shell.compile``'s
    ``_filename_map``); the ``%%neuron`` cell's body is compiled under ``own_filename`` and
    belongs to the cell that is running now (compiled with the ``%%neuron`` line as line 1).
    """
    mapping = getattr(getattr(shell, "compile", None), "_filename_map", None) or {}
    names: dict[str, int] = {str(k): int(v) for k, v in mapping.items() if isinstance(v, int)}
    # The running cell's count: that of the cell code calling the magic (IPython counts up before a
    # cell runs, so shell.execution_count is already the next one), else the shell's.
    frame = sys._getframe(1)
    count = None
    while frame is not None and count is None:
        count = mapping.get(frame.f_code.co_filename)
        frame = frame.f_back
    names[own_filename] = int(count if isinstance(count, int) else shell.execution_count)
    return names


def site_folders(start_dir: str) -> list[str]:
    """Folders a site's file is shown relative to: notebook's, working directory, import roots.

    A library's file reads ``transformers/...py:120``. JupyterLab tells the kernel its notebook's
    path in ``$JPY_SESSION_NAME``; elsewhere the folder the kernel started in (where nbclient and
    Jupyter start it: the notebook's) stands in.
    """
    session = os.environ.get("JPY_SESSION_NAME", "")
    notebook_dir = os.path.dirname(session) if os.path.isabs(session) else start_dir
    return [notebook_dir, os.getcwd(), *library_folders()]


class _InterruptedOutsideTheCell(KeyboardInterrupt):
    """An interrupt that stopped none of the cell's lines: the notebook shows its message alone."""

    def _render_traceback_(self) -> list[str]:  # IPython shows these lines instead of frames
        return [f"KeyboardInterrupt: {self}"]


_InterruptedOutsideTheCell.__name__ = "KeyboardInterrupt"  # the name a notebook's error shows


def _interrupted(interrupt: KeyboardInterrupt, cell_file: str | None) -> KeyboardInterrupt:
    """The interrupt as the notebook shows it: where it stopped the cell, from the cell's lines.

    Every run of a cell interrupted while one ran is abandoned (a worker running it is ended) and
    nothing is committed, so then the message says that the notebook's names are as they were.
    """
    where = interrupted_where(interrupt)
    if where is None:  # before the runs started, or after them
        message = "%%neuron interrupted"
    else:
        message = (
            f"%%neuron interrupted {where}; no run of the cell was kept: the notebook's names are "
            "as they were before it"
        )
    frames = interrupt.__traceback__
    while frames is not None and frames.tb_frame.f_code.co_filename != cell_file:
        frames = frames.tb_next
    if frames is None:
        return _InterruptedOutsideTheCell(message)
    return KeyboardInterrupt(message).with_traceback(frames)


def _trait(option: Option) -> TraitType:
    """The ``%config NeuronMagics`` trait of a table option (its session default)."""
    # a switch that is on by default (scan) is what its flag (--no-scan) does when False
    when = " when False" if option.kind == "bool" and option.default else ""
    text = option.help[0].upper() + option.help[1:] + f"{when} (as {option.flag})."
    if option.kind == "bool":
        return Bool(option.default, help=text).tag(config=True)
    if option.kind == "int":
        return Int(option.default, allow_none=option.default is None, help=text).tag(config=True)
    if option.kind == "float":
        return Float(option.default, allow_none=True, help=text).tag(config=True)
    if option.kind == "choice":
        return Enum(
            option.choices,
            default_value=option.default,
            allow_none=option.default is None,
            help=text,
        ).tag(config=True)
    if option.kind == "list":
        return List(Unicode(), help=text).tag(config=True)
    return Unicode(option.default or "", help=text).tag(config=True)


def _env_default(option: Option) -> Any:
    @default(option.name)
    def from_environment(self: Any) -> Any:
        return option.env_default()

    return from_environment


#: One trait per session setting of the option table (``%config NeuronMagics.steps = 3``).
CellOptionTraits = type(
    "CellOptionTraits",
    (HasTraits,),
    {
        **{option.name: _trait(option) for option in options_for(TRAIT)},
        **{f"_default_{o.name}": _env_default(o) for o in options_for(TRAIT) if o.env},
    },
)


def _table_arguments(func: Any) -> Any:
    """The option table's ``%%neuron`` flags, as ``@argument`` decorators would add them."""
    for option in reversed(options_for(MAGIC)):
        flags, kwargs = argument_spec(option)
        func = argument(*flags, **kwargs)(func)
    return func


#: Cells IPython's input transformers made Python of, by their text and the transformers then.
_TRANSFORMED: dict[tuple[Any, ...], str] = {}
_TRANSFORMED_KEPT = 64


def _transformed_cell(shell: Any, cell: str) -> str:
    """``shell.transform_cell(cell)``, remembered for a cell run again with the same transformers.

    IPython tokenizes the whole cell each time (0.15 ms for a 10-line cell); a notebook reruns
    the same cells, and the magic reads each plain cell before and after it runs.
    """
    manager = shell.input_transformer_manager
    key = (
        cell,
        id(manager),
        *(
            tuple(map(id, transforms))
            for transforms in (
                manager.cleanup_transforms,
                manager.line_transforms,
                manager.token_transformers,
                shell.input_transformers_post,
            )
        ),
    )
    source = _TRANSFORMED.get(key)
    if source is None:
        source = shell.transform_cell(cell)
        if len(_TRANSFORMED) >= _TRANSFORMED_KEPT:
            del _TRANSFORMED[next(iter(_TRANSFORMED))]  # the oldest
        _TRANSFORMED[key] = source
    return source


@magics_class
class NeuronMagics(Magics, CellOptionTraits):  # type: ignore[misc, valid-type]
    """Compare a CUDA-style cell on a reference and a target backend.

    Defaults can be changed for the session with ``%config NeuronMagics.<name> = value``: every
    option of the cell (``steps``, ``preset``, ``target``, ...) and the settings below.
    """

    record_dir = Unicode(
        "",
        help="If set, every %%neuron cell saves its runs to DIR/cell-<execution count>.nwrun.zip.",
    ).tag(config=True)
    against_dir = Unicode(
        "",
        help="If set, every %%neuron cell compares against the reference recorded in "
        "DIR/cell-<execution count>.nwrun.zip (as record_dir writes it) instead of running one.",
    ).tag(config=True)
    cells_before = Int(
        0,
        help="Execution counts taken before the notebook's first cell (the command line's hidden "
        "set-up cell): record_dir and against_dir number a cell's file by its count less these, "
        "as `neuron-workbench run` numbers the cell in its report lines.",
    ).tag(config=True)
    widget = Bool(
        False,
        help="Show every report as the interactive widget (tabs, Plotly charts), also where the "
        "neuron-workbench-lab extension would draw its native view (JupyterLab). Without it each "
        "front end picks its richest view: the extension's in JupyterLab, the widget elsewhere.",
    ).tag(config=True)
    ray_resources = Dict(
        help="Ray resources a target's actor asks for, by target, over the defaults "
        "{'neuron': {'neuron_cores': 1}, 'tpu': {'TPU': 1}, 'cuda': {'GPU': 1}}.",
    ).tag(config=True)
    ray_ready_timeout = Float(
        30.0,
        help="Seconds a target's Ray actor may take to be placed and ready before the cell fails.",
    ).tag(config=True)
    ray_runtime_env = Dict(
        help="The Ray job's runtime_env, given to ray.init when a cell connects to a ray:// "
        "address (working_dir, py_modules, pip ...); its env_vars are also set in every target "
        "actor. The notebook's own .py modules are shipped to the actors without it.",
    ).tag(config=True)
    ray_ship_modules = Bool(
        True,
        help="Ship the .py files of the notebook's own modules (imported from its folder, not "
        "installed) to each target actor; off when the cluster's nodes have them installed.",
    ).tag(config=True)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self.session = Session()
        self._start_dir = os.getcwd()
        #: the plain cell about to run, and where what it binds was before it (before_plain_cell)
        self._places_before: tuple[str, dict[str, str | None]] | None = None

    def launch_workers(self) -> None:
        """Launch the worker processes of the session's targets (as configured), not waiting.

        Called as the extension loads: each worker imports torch and installs its device while the
        notebook's first cells run, instead of during its first ``%%neuron`` cell. A setting no
        cell could run with launches nothing (each cell says what is wrong with it).
        """
        from neuron_workbench.errors import WorkbenchError

        values = {option.name: getattr(self, option.name) for option in options_for(TRAIT)}
        with contextlib.suppress(WorkbenchError, OSError):
            options = cell_options(values)
            if not options.cluster:
                self.session.launch_workers(options.targets, options.executor)

    def before_plain_cell(self, info: Any) -> None:
        """Before every cell (IPython's ``pre_run_cell``): where what a plain cell binds is now.

        ``x = x * 2`` computes from the ``x`` before it: :meth:`after_plain_cell` reads the cell
        after it ran, when the name holds the new tensor (see
        :func:`~neuron_workbench.run.host_moves.places_before`).
        """
        self._places_before = None
        raw = getattr(info, "raw_cell", None) or ""
        if raw.lstrip().startswith("%%"):
            return  # a cell magic's body (a %%neuron cell) is followed by its own runs
        from neuron_workbench.run.host_moves import places_before

        try:
            source = _transformed_cell(self.shell, raw)
            self._places_before = (
                raw,
                places_before(source, self.shell.user_ns, self.session.resident),
            )
        except Exception:  # noqa: BLE001 - a plain cell's preparation must never fail the cell
            return

    def after_plain_cell(self, result: Any) -> None:
        """After every cell (IPython's ``post_run_cell``): what a plain cell moved, read from its source.

        A plain cell runs on the cpu stand-in for cuda, where a move changes nothing: without this,
        the next ``%%neuron`` cell put a model that ``model.cpu()`` moved back on each run's device,
        and left one that ``nn.Linear(4, 2).to(device)`` or ``copy.deepcopy(model)`` made on the
        CPU (see :mod:`neuron_workbench.run.host_moves`). What the cell let go of (``del batch``)
        is forgotten as on the device, so that its memory is freed now, as plain Python frees it.
        A setting the cell assigns on a module of the notebook's own (``config.LR = 0.5``) holds in
        the targets' processes from now on (see :mod:`~neuron_workbench.run.module_versions`).
        """
        self.session.resident.prune()
        raw = getattr(getattr(result, "info", None), "raw_cell", None) or ""
        if raw.lstrip().startswith("%%"):
            return  # a cell magic's body is no top-level statement of the cell (a %%neuron cell)
        from neuron_workbench.run.host_moves import follow_plain_cell_moves

        taken, self._places_before = self._places_before, None
        before = taken[1] if taken is not None and taken[0] == raw else None
        try:
            source = _transformed_cell(self.shell, raw)
            # even from a cell that failed: the kernel's value is sent, whether the store ran or not
            remember_assigned_attributes(source, self.shell.user_ns)
            if not getattr(result, "success", False):
                return  # what ran before the error is unknown: everything stays where it was
            follow_plain_cell_moves(source, self.shell.user_ns, self.session.resident, before)
        except Exception:  # noqa: BLE001 - a plain cell's aftermath must never fail the cell
            return

    @magic_arguments()
    @_table_arguments
    @argument(
        "--record", metavar="PATH", help="save both runs and the report to this artifact file"
    )
    @argument(
        "--against",
        metavar="PATH",
        help="use the reference run recorded in this artifact instead of executing one",
    )
    @argument(
        "--widget",
        action="store_true",
        help="show the report as the interactive widget (Summary/Numerics/Layers/Ops/Fallbacks "
        "tabs) in every front end, JupyterLab included",
    )
    @argument(
        "-o",
        "--output",
        metavar="NAME",
        help="store the Report object in this variable (a list of them for several targets)",
    )
    @cell_magic
    # a cell ending in `x;` shows no value and leaves `_` and `Out` alone, as a plain cell's
    @output_can_be_silenced
    def neuron(self, line: str, cell: str) -> Any:
        """Run the cell on a reference and a target backend, and compare every output.

        The cell is ordinary CUDA-style PyTorch: ``"cuda"`` devices, ``.cuda()``,
        ``torch.cuda.is_available()``, ``torch.autocast("cuda")`` and ``GradScaler`` land on each run's
        backend. Each run gets its own deep copy of the notebook state the cell uses, and both start
        from the same seed. Afterwards the namespace holds the reference run's results (``--keep
        target`` for the other) and the cell's last expression is returned as usual; so do the files
        the cell writes (the other run's writes through ``open``/``torch.save`` are kept apart).
        Tensors, modules (parameters, buffers and grads), optimizers, NumPy arrays, pandas
        DataFrames (by column) and Python numbers bound by the cell are compared with dtype-aware
        tolerances (``torch.testing.assert_close``'s defaults).

        Without Trainium or TPU hardware, ``neuron`` and ``tpu`` are emulated on the host CPU and
        every report says so. Without a GPU the reference is the host CPU standing in for ``cuda``
        (``cpu (as cuda)``): the cell's CUDA parts get CUDA's semantics (``.cuda()`` copies, CUDA's
        autocast op lists, pinned memory, foreach optimizers, TF32 when the cell enables it), and
        the report lists what stays different from a real GPU. Under autocast, floating outputs are
        judged at the tolerance of the lowest precision they went through.

        ``neuron`` and ``tpu`` targets run in a worker process per target (``--executor auto``, the
        default): the kernel installs no device, a crash or a hang (``--timeout S``) there becomes
        an ERROR report, and both targets can be compared in one notebook (``--target
        neuron,tpu``). What the cell reads is shipped to the worker; results come back as host
        copies. ``%neuron_workers`` lists the workers; ``--executor inprocess`` runs in the kernel.

        ``--on ray://HOST:PORT`` runs the target in a Ray actor on a node that has the device
        (``neuron_cores`` for neuron, ``TPU`` for tpu; ``NeuronMagics.ray_resources``), e.g. a
        Trainium host while the kernel and its CUDA reference stay on a GPU host; ``--on ray``
        uses the cluster the kernel connected to with ``ray.init(...)``; ``%config
        NeuronMagics.cluster`` sets it for every cell. Needs ``pip install neuron-workbench[ray]``.

        Examples
        --------
        ::

            %load_ext neuron_workbench

            %%neuron
            model = Net().cuda()
            logits = model(torch.randn(8, 3, 32, 32, device="cuda"))

            %%neuron --ref cpu --target tpu --rtol 1e-4 --atol 1e-5 -o report
            ...
        """
        # The notebook hides this frame from every traceback through it (an interrupt's starts at
        # the cell's own lines, as a plain cell's does); get_ipython().InteractiveTB.skip_hidden =
        # False shows it again.
        __tracebackhide__ = True
        args = parsed_line(self.neuron, line)
        if args is None:  # -h: its help was shown
            return None
        cell_file = None
        # IPython splits the line as Windows would, quotes kept: `--record "runs/a b.nwrun.zip"`
        args.record, args.against = _unquoted(args.record), _unquoted(args.against)
        args.output = _unquoted(args.output)
        # the report's "Tolerances that would pass" lines quote each --tol (a glob), as a shell
        # needs: pasted into the magic's line they keep their quotes; so does a --layers-full
        # glob or an --allow-fallback op a user quotes as in a shell, which then matched nothing
        for name in ("per_output", "layers_full", "allow_fallback"):
            if getattr(args, name):
                setattr(args, name, [_unquoted(value) for value in getattr(args, name)])
        if args.output is not None and not _is_variable_name(args.output):
            # stored under any other key, the report was in the namespace where no code could
            # name it, after both runs had gone by
            raise UsageError(f"-o NAME must be a Python variable name, got {args.output!r}")
        try:
            # A flag given in the cell wins over the session's setting (%config NeuronMagics.x);
            # a cell's rtol/atol pair replaces the session's pair whole.
            flags = given_values(args, MAGIC)
            values = {option.name: getattr(self, option.name) for option in options_for(TRAIT)}
            if "rtol" in flags or "atol" in flags:
                values["rtol"] = values["atol"] = None
            values.update(flags)
            shell = self.shell
            # Line 1 of the cell is the %%neuron line: errors and sites count lines as the editor.
            program = compile_cell(
                _transformed_cell(shell, cell),
                # without AST transformers (IPython has none unless a user adds one), a cell run
                # again is not parsed again
                transform_ast=shell.transform_ast if shell.ast_transformers else None,
                first_line=2,
            )
            cell_file = program.filename
            if args.output is not None and args.output in program.stored_names:
                # the report replaced what the cell had bound there, after both runs
                raise UsageError(
                    f"-o {args.output} names a variable the cell binds; store the report under "
                    f"another name"
                )
            # Sites read `cell [7], line 3` and `models.py:16` in every view and artifact.
            cells = cell_filenames(shell, program.filename)
            # The running cell's number, as its sites read it (not shell.execution_count, which
            # IPython has already moved to the next cell).
            count = cells[program.filename]
            numbered = count - self.cells_before  # record_dir's and against_dir's file number
            folder_record = (
                str(Path(self.record_dir) / f"cell-{numbered}.nwrun.zip")
                if self.record_dir
                else None
            )
            cluster = self._cluster_settings(values["cluster"])
            values["cluster"] = cluster.get("cluster", "")
            options = cell_options(
                values,
                record=args.record or folder_record,
                against=args.against or _recorded_cell(self.against_dir, numbered),
                # the scanner counts lines as the editor does: line 1 is the %%neuron line
                source_first_line=2,
                cluster_options=cluster.get("cluster_options"),
            )
            options.validate()
            folders = site_folders(self._start_dir)
            result = self.session.run_cell(
                cell,
                shell.user_ns,
                options,
                program=program,
                hidden=frozenset(shell.user_ns_hidden),
                capture=_capture,
                live_output=True,
                relabel=lambda run: run.relabel_sites(cells, folders),
            )
            # a setting the cell assigns on a module of the notebook's own (config.LR = 0.5) holds
            # in the processes that did not run it: another target's, a worker started afresh
            with contextlib.suppress(Exception):
                remember_assigned_attributes(program.source, shell.user_ns)
            if (
                args.record
                and folder_record
                and result.artifact is not None
                and Path(result.artifact).resolve() != Path(folder_record).resolve()
            ):
                # the folder holds every cell's, so that against_dir finds this one too
                Path(folder_record).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(result.artifact, folder_record)
        except WorkbenchUsageError as exc:
            raise UsageError(usage_message(exc)) from None
        except KeyboardInterrupt as interrupt:
            raise _interrupted(interrupt, cell_file) from None
        report = result.report
        kept = result.captured.get(report.options.get("keep", options.compare.keep))
        if kept is not None:
            kept.show()  # what the cell printed, once (the kept run's copy)
        if args.output:
            self.shell.user_ns[args.output] = report if len(result.reports) == 1 else result.reports
        # One display per report; each front end picks its richest view (views.report_bundle).
        from neuron_workbench.views import close_cell_views, report_bundle

        # the cell's output is replaced: the views its last run showed go (their widgets too)
        header = getattr(self.shell, "parent_header", None)
        metadata = header.get("metadata") if isinstance(header, dict) else None
        cell_id = metadata.get("cellId") if isinstance(metadata, dict) else None
        cell_id = cell_id if isinstance(cell_id, str) else None
        close_cell_views(cell_id)
        for each in result.reports:
            data, metadata = report_bundle(
                each, widget="force" if args.widget or self.widget else "auto", cell_id=cell_id
            )
            display(data, metadata=metadata, raw=True)
        if result.strict_violation:
            raise UsageError(result.strict_violation)
        if result.graph_break_violation:
            raise UsageError(result.graph_break_violation)
        return result.last_value

    def _cluster_settings(self, text: str) -> dict[str, Any]:
        """``cluster`` and ``cluster_options`` of a cell's ``cluster`` (``--on``) setting."""
        if not text.strip():
            return {}  # nothing of Ray is imported unless a cell names a cluster
        from neuron_workbench.run.ray_cluster import RayOptions, parse_cluster

        cluster = parse_cluster(text)
        if not cluster:
            return {}
        options = RayOptions(
            resources=dict(self.ray_resources),
            ready_timeout_s=self.ray_ready_timeout,
            runtime_env=dict(self.ray_runtime_env),
            ship_local_modules=self.ray_ship_modules,
        )
        return {"cluster": cluster, "cluster_options": options}

    @line_magic
    def neuron_backends(self, line: str = "") -> BackendStatusTable:
        """List the backends (cpu, cuda, neuron, tpu), whether each can run here, and why not."""
        if line.strip():
            raise UsageError("%neuron_backends takes no arguments")
        return BackendStatusTable()

    @line_magic
    def neuron_workers(self, line: str = "") -> WorkerTable:
        """List the target worker processes, or restart one: ``%neuron_workers restart neuron``.

        Each row: target, process id, resident memory, cells run since the worker started, and
        the shared memory kept between cells for shipping the next cell's state (a restart frees
        it; ``NEURON_WORKBENCH_KEPT_ARENA_MIB`` bounds it).
        """
        words = line.split()
        if words and (words[0] != "restart" or len(words) != 2):
            raise UsageError("usage: %neuron_workers [restart TARGET]")
        if words:
            from neuron_workbench.backends import get_backend

            try:
                target = get_backend(words[1]).name
            except WorkbenchUsageError as exc:
                raise UsageError(usage_message(exc)) from None
            self.session.workers.restart(target)
        return WorkerTable(self.session.workers.rows() + self.session.actor_rows())


class WorkerTable:
    """What ``%neuron_workers`` shows: one line per target worker."""

    def __init__(self, rows: list[Any]) -> None:
        self.rows = rows

    def lines(self) -> list[str]:
        """``target  pid  memory  cells`` per worker (or a note that none has started)."""
        if not self.rows:
            return ["no worker processes (run a cell with --executor worker)"]
        out = []
        for row in self.rows:
            memory = f"{row.memory_bytes / 2**20:.0f} MiB" if row.memory_bytes else "-"
            pid = str(row.pid) if row.alive else "stopped"
            line = f"{row.target:<7} pid {pid:<8} {memory:>9}  {row.cells_run} cells run"
            if row.kept_bytes:  # shared memory kept for the next transfers, freed by a restart
                line += f", {format_bytes(row.kept_bytes)} kept for transfers"
            out.append(line)
        return out

    def __repr__(self) -> str:
        return "\n".join(self.lines())
