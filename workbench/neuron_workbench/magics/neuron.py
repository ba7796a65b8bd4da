"""The ``%%neuron`` cell magic and the ``%neuron_backends`` line magic."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display
from IPython.utils.capture import capture_output
from traitlets import Bool, Dict, Enum, Float, Int, Unicode, default

from neuron_workbench.backends.registry import BackendStatusTable, default_reference
from neuron_workbench.compare.budget import JUDGES
from neuron_workbench.compare.tolerances import PRESETS, parse_override
from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.magics.flags import usage_message
from neuron_workbench.report.driver import (
    KEEP_CHOICES,
    RNG_CHOICES,
    WHAT_IF_CHOICES,
    CompareOptions,
)
from neuron_workbench.report.html import library_folders, relabel_run_sites
from neuron_workbench.report.session import (
    EXECUTOR_CHOICES,
    CellOptions,
    Session,
    prepare_target,
)
from neuron_workbench.run import compile_cell
from neuron_workbench.run.cuda_on_host import REF_PRECISIONS

__all__ = ["NeuronMagics", "prepare_target"]


def _capture() -> Any:
    return capture_output(stdout=True, stderr=True, display=True)


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


def _graph_break_violation(report: Any) -> str | None:
    """The one-line ``--strict-graph-breaks`` failure of a report, or None."""
    from neuron_workbench.run.records import recorded
    from neuron_workbench.trace.compile import graph_break_violation

    record = recorded(report.target.extras.get("compile"))
    breaks = list(getattr(record, "graph_breaks", None) or [])
    return graph_break_violation(breaks, report.target.backend.name)


@magics_class
class NeuronMagics(Magics):
    """Compare a CUDA-style cell on a reference and a target backend.

    Defaults can be changed for the session with ``%config NeuronMagics.<name> = value``.
    """

    ref = Unicode(
        "", help="Reference backend; empty means cuda when a GPU is usable, else cpu."
    ).tag(config=True)
    target = Unicode(
        help="Target backend: neuron or tpu (or cpu/cuda). Default: $NEURON_WORKBENCH_TARGET, "
        "else the device named by $NEURON_WORKBENCH_EMULATE, else neuron."
    ).tag(config=True)

    @default("target")
    def _default_target(self) -> str:
        env = os.environ
        return env.get("NEURON_WORKBENCH_TARGET") or env.get("NEURON_WORKBENCH_EMULATE") or "neuron"

    rtol = Float(None, allow_none=True, help="Relative tolerance (give atol too).").tag(config=True)
    atol = Float(None, allow_none=True, help="Absolute tolerance (give rtol too).").tag(config=True)
    seed = Int(0, help="Seed of torch, random and numpy at the start of each run.").tag(config=True)
    keep = Enum(
        KEEP_CHOICES, default_value="ref", help="Whose results stay in the namespace afterwards."
    ).tag(config=True)
    preset = Enum(
        tuple(PRESETS), default_value="default", help="Tolerance preset for every comparison."
    ).tag(config=True)
    judge = Enum(
        JUDGES,
        default_value="tolerance",
        help="How floating outputs are judged (as --judge): tolerance (fixed rtol/atol; a failing "
        "output also shows its error ratio R) or budget (R against the reference's noise floor).",
    ).tag(config=True)
    rng = Enum(RNG_CHOICES, default_value="device", help="Where random numbers are drawn.").tag(
        config=True
    )
    record_dir = Unicode(
        "",
        help="If set, every %%neuron cell saves its runs to DIR/cell-<execution count>.nwrun.zip.",
    ).tag(config=True)
    against_dir = Unicode(
        "",
        help="If set, every %%neuron cell compares against the reference recorded in "
        "DIR/cell-<execution count>.nwrun.zip (as record_dir writes it) instead of running one.",
    ).tag(config=True)
    strict = Bool(False, help="Fail every cell whose target fell back to CPU.").tag(config=True)
    compile_check = Bool(
        False, help="Run every cell with torch.compile off too (as --compile-check)."
    ).tag(config=True)
    widget = Bool(
        False,
        help="Show every report as the interactive widget (tabs, Plotly charts), also where the "
        "neuron-workbench-lab extension would draw its native view (JupyterLab). Without it each "
        "front end picks its richest view: the extension's in JupyterLab, the widget elsewhere.",
    ).tag(config=True)

    executor = Enum(
        EXECUTOR_CHOICES,
        help="Where the target runs: worker (a child process per target that owns the device; "
        "crashes and hangs stay out of the kernel), inprocess (this kernel), or auto (worker for "
        "neuron and tpu unless the kernel already holds that device, inprocess for cpu and "
        "cuda). Default: $NEURON_WORKBENCH_EXECUTOR, else auto.",
    ).tag(config=True)

    @default("executor")
    def _default_executor(self) -> str:
        value = os.environ.get("NEURON_WORKBENCH_EXECUTOR", "").strip().lower()
        return value if value in EXECUTOR_CHOICES else "auto"

    timeout = Float(
        None, allow_none=True, help="Seconds a worker target run may take before it is ended."
    ).tag(config=True)
    list_fallbacks = Bool(
        False,
        help="tpu targets run with the CPU fallback on and list every missing op in one run "
        "(as --list-fallbacks).",
    ).tag(config=True)
    track_per_op = Bool(
        False,
        help="A real neuron target attributes every CPU fallback to its call, at a synchronize "
        "per op (as --track-per-op).",
    ).tag(config=True)
    cluster = Unicode(
        "",
        help="Run targets in Ray actors on this cluster (as --on): ray://HOST:PORT, or ray for "
        "the cluster this kernel connected to with ray.init(...). Empty: on this host.",
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

    @magic_arguments()
    @argument(
        "--ref", metavar="BACKEND", help="reference backend (default: cuda if usable, else cpu)"
    )
    @argument(
        "--target",
        metavar="BACKEND",
        help="target backend (default: neuron); several, comma-separated (neuron,tpu), are each "
        "compared against one reference run",
    )
    @argument("--rtol", type=float, help="relative tolerance; give --atol too")
    @argument("--atol", type=float, help="absolute tolerance; give --rtol too")
    @argument("--seed", type=int, help="seed for torch/random/numpy at the start of each run")
    @argument("--keep", choices=KEEP_CHOICES, help="whose results stay in the namespace")
    @argument(
        "--preset",
        choices=tuple(PRESETS),
        help="tolerance preset: "
        + "; ".join(f"{p.name}: {p.description}" for p in PRESETS.values()),
    )
    @argument(
        "--tol",
        action="append",
        default=[],
        metavar="PATH=RTOL,ATOL",
        help="tolerance for one output, a prefix (model) or a glob (model.*.grad); repeatable",
    )
    @argument(
        "--layers",
        action="store_true",
        help="record per-module statistics and name the first module where outputs diverge",
    )
    @argument(
        "--layers-full",
        action="append",
        default=[],
        metavar="NAME",
        help="keep the full outputs of these modules (name or glob) for an element-wise look",
    )
    @argument(
        "--steps",
        type=int,
        metavar="N",
        help="run the cell N times per backend as consecutive training steps; compare per step",
    )
    @argument(
        "--max-steps",
        type=int,
        dest="max_steps",
        metavar="N",
        help="stop both runs after N scalars (loss.item(), ...) from the first call site that "
        "makes one: compare the first N steps of a long training loop",
    )
    @argument(
        "--rng",
        choices=RNG_CHOICES,
        help="cpu: draw random numbers on the CPU and move them, so both runs see the same ones",
    )
    @argument(
        "--what-if",
        choices=WHAT_IF_CHOICES,
        dest="what_if",
        help="bf16-matmul: round float32 matmul/conv inputs to bfloat16 on the emulated target",
    )
    @argument(
        "--judge",
        choices=JUDGES,
        help="tolerance (default): fixed rtol/atol, and a failing float output shows its error "
        "ratio R against a float64 oracle; budget: a float output passes when R is within the "
        "reference's precision budget (R <= 2)",
    )
    @argument(
        "--ref-precision",
        choices=REF_PRECISIONS,
        dest="ref_precision",
        help="cuda (default): a cpu reference computes as a CUDA GPU would, TF32 matmuls when the "
        "cell enables them; fp32: full float32 matmuls",
    )
    @argument(
        "--profile",
        action="store_true",
        help="record an op-level profile (time, calls, memory) of both runs; emulated timings are "
        "host CPU time",
    )
    @argument(
        "--repeat",
        type=int,
        metavar="N",
        help="run the cell N times per backend; profiles separate the first call from the rest",
    )
    @argument("--strict", action="store_true", help="fail the cell if any op fell back to CPU")
    @argument(
        "--strict-graph-breaks",
        action="store_true",
        help="fail the cell if torch.compile broke a graph on the target (each break is listed "
        "in the report with its reason and line)",
    )
    @argument(
        "--compile-check",
        action="store_true",
        help="run the cell again with torch.compile off on both sides and report both verdicts "
        "(does a difference come from the compilers?)",
    )
    @argument(
        "--allow-fallback",
        metavar="OPS",
        default="",
        help="comma-separated ops that may fall back under --strict (aten::sort or sort)",
    )
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
    @argument("--no-scan", action="store_true", help="skip the migration scan of the cell source")
    @argument(
        "--executor",
        choices=EXECUTOR_CHOICES,
        help="worker: run the target in a child process that owns the device (one per target, "
        "reused; a crash or hang there never touches the kernel); inprocess: in this kernel; "
        "auto (default): worker for neuron and tpu (unless the kernel already holds that "
        "device), inprocess for cpu and cuda",
    )
    @argument(
        "--timeout",
        type=float,
        metavar="S",
        help="end a worker target run after S seconds and report it (needs --executor worker)",
    )
    @argument(
        "--list-fallbacks",
        action="store_true",
        dest="list_fallbacks",
        help="tpu target: run with the CPU fallback on and list every missing op in one run "
        "(TorchTPU stops at the first by default)",
    )
    @argument(
        "--track-per-op",
        action="store_true",
        dest="track_per_op",
        help="real neuron target: attribute every CPU fallback to its call and line (a "
        "synchronize per op)",
    )
    @argument(
        "--on",
        metavar="CLUSTER",
        help="run the target in a Ray actor on a node that has its device: ray://HOST:PORT, ray "
        "(the cluster this kernel connected to with ray.init), or local; the reference stays here",
    )
    @argument(
        "-o",
        "--output",
        metavar="NAME",
        help="store the Report object in this variable (a list of them for several targets)",
    )
    @cell_magic
    def neuron(self, line: str, cell: str) -> Any:
        """Run the cell on a reference and a target backend, and compare every output.

        The cell is ordinary CUDA-style PyTorch: ``"cuda"`` devices, ``.cuda()``,
        ``torch.cuda.is_available()``, ``torch.autocast("cuda")`` and ``GradScaler`` land on each run's
        backend. Each run gets its own deep copy of the notebook state the cell uses, and both start
        from the same seed. Afterwards the namespace holds the reference run's results (``--keep
        target`` for the other) and the cell's last expression is returned as usual. Tensors, modules
        (parameters, buffers and grads), optimizers, NumPy arrays and Python numbers bound by the cell
        are compared with dtype-aware tolerances (``torch.testing.assert_close``'s defaults).

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
        args = parse_argstring(self.neuron, line)
        try:
            targets = [t.strip() for t in (args.target or self.target).split(",") if t.strip()]
            if not targets:
                raise WorkbenchUsageError("--target needs a backend name")
            compare = CompareOptions(
                ref=args.ref or self.ref or default_reference(),
                target=targets[0],
                rtol=args.rtol
                if args.rtol is not None
                else (None if args.atol is not None else self.rtol),
                atol=args.atol
                if args.atol is not None
                else (None if args.rtol is not None else self.atol),
                seed=args.seed if args.seed is not None else self.seed,
                keep=args.keep or self.keep,
                preset=args.preset or self.preset,
                per_output=tuple(parse_override(text) for text in args.tol),
                layers=bool(args.layers or args.layers_full),
                layers_full=tuple(args.layers_full),
                steps=max(args.steps or 1, args.repeat or 1),
                rng=args.rng or self.rng,
                what_if=args.what_if,
                ref_precision=args.ref_precision or "cuda",
                list_fallbacks=bool(args.list_fallbacks or self.list_fallbacks),
                track_per_op=bool(args.track_per_op or self.track_per_op),
                judge=args.judge or self.judge,
                max_steps=args.max_steps,
                compile_check=bool(args.compile_check or self.compile_check),
            )
            shell = self.shell
            # Line 1 of the cell is the %%neuron line: errors and sites count lines as the editor.
            program = compile_cell(
                shell.transform_cell(cell), transform_ast=shell.transform_ast, first_line=2
            )
            # Sites read `cell [7], line 3` and `models.py:16` in every view and artifact.
            cells = cell_filenames(shell, program.filename)
            # The running cell's number, as its sites read it (not shell.execution_count, which
            # IPython has already moved to the next cell).
            count = cells[program.filename]
            options = CellOptions(
                compare=compare,
                profile=args.profile,
                strict=bool(args.strict or self.strict),
                allow_fallback=tuple(
                    op.strip() for op in args.allow_fallback.split(",") if op.strip()
                ),
                record=args.record
                or (
                    str(Path(self.record_dir) / f"cell-{count}.nwrun.zip")
                    if self.record_dir
                    else None
                ),
                against=args.against or _recorded_cell(self.against_dir, count),
                scan=not args.no_scan,
                # the scanner counts lines as the editor does: line 1 is the %%neuron line
                source_first_line=2,
                executor=args.executor or self.executor,
                timeout=args.timeout if args.timeout is not None else self.timeout,
                extra_targets=tuple(targets[1:]),
                **self._cluster_settings(args.on),
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
                relabel=lambda run: relabel_run_sites(run, cells, folders),
            )
        except WorkbenchUsageError as exc:
            raise UsageError(usage_message(exc)) from None
        report = result.report
        kept = result.captured.get(report.options.get("keep", compare.keep))
        if kept is not None:
            kept.show()  # what the cell printed, once (the kept run's copy)
        if args.output:
            self.shell.user_ns[args.output] = report if len(result.reports) == 1 else result.reports
        # One display per report; each front end picks its richest view (views.report_bundle).
        from neuron_workbench.views import report_bundle

        for each in result.reports:
            data, metadata = report_bundle(
                each, widget="force" if args.widget or self.widget else "auto"
            )
            display(data, metadata=metadata, raw=True)
        if result.strict_violation:
            raise UsageError(result.strict_violation)
        if args.strict_graph_breaks:
            for each in result.reports:
                broken = _graph_break_violation(each)
                if broken:
                    raise UsageError(broken)
        return result.last_value

    def _cluster_settings(self, on: str | None) -> dict[str, Any]:
        """``cluster`` and ``cluster_options`` of a cell (``--on`` over ``NeuronMagics.cluster``)."""
        text = on if on is not None else self.cluster
        if not text.strip():
            return {}  # nothing of Ray is imported unless a cell names a cluster
        from neuron_workbench.run.ray_executor import RayOptions, parse_cluster

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

        Each row: target, process id, resident memory, cells run since the worker started.
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
            out.append(f"{row.target:<7} pid {pid:<8} {memory:>9}  {row.cells_run} cells run")
        return out

    def __repr__(self) -> str:
        return "\n".join(self.lines())
