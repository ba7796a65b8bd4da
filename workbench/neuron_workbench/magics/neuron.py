"""The ``%%neuron`` cell magic and the ``%neuron_backends`` line magic."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display
from IPython.utils.capture import capture_output
from traitlets import Bool, Enum, Float, Int, Unicode, default

from neuron_workbench.backends.registry import BackendStatusTable, default_reference
from neuron_workbench.compare.tolerances import PRESETS, parse_override
from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.report.driver import (
    KEEP_CHOICES,
    RNG_CHOICES,
    WHAT_IF_CHOICES,
    CompareOptions,
    compare_cell,
)
from neuron_workbench.report.html import library_folders, relabel_run_sites
from neuron_workbench.run import ResidentObjects, compile_cell
from neuron_workbench.run.cuda_on_host import REF_PRECISIONS


def prepare_target(name: str) -> None:
    """Activate ``name`` once if it is an emulated device; problems surface later, in the magic."""
    from neuron_workbench.backends import get_backend
    from neuron_workbench.errors import WorkbenchError

    try:
        backend = get_backend(name)
        if backend.availability().emulated:
            with backend.session():
                pass
    except WorkbenchError:
        pass


def _recorded_reference(path: str | None, cell: str) -> tuple[Any, str | None]:
    """The reference run recorded in the artifact at ``path`` (``--against``), and a warning."""
    if not path:
        return None, None
    from neuron_workbench import artifacts

    artifact = artifacts.load(path)
    run = artifact.runs.get("ref") or next(iter(artifact.runs.values()), None)
    if run is None:
        raise WorkbenchUsageError(f"{path}: the artifact holds no run")
    return run, artifacts.source_mismatch_warning(artifact, cell)


def _migration_findings(cell: str, target: str) -> dict[str, Any] | None:
    """The scanner's findings for the cell source (the report's Migration tab)."""
    if target not in ("neuron", "tpu"):
        return None
    from neuron_workbench.scan import scan_cell

    # Lines count as in the notebook's editor, where line 1 is the %%neuron line.
    report = scan_cell("\n" + cell, target=target)
    data = report.to_dict()
    data["html"] = report.to_html()
    data["text"] = report.to_text()
    return data


def _capture() -> Any:
    return capture_output(stdout=True, stderr=True, display=True)


def cell_filenames(shell: Any, own_filename: str) -> dict[str, int | tuple[int, int]]:
    """Compiled filename of each notebook cell → its execution count (``cell [N]`` in sites).

    IPython records the temporary file every cell is compiled under (``shell.compile``'s
    ``_filename_map``); the ``%%neuron`` cell's body is compiled under ``own_filename`` and
    belongs to the cell that is running now, one line below its ``%%neuron`` line.
    """
    mapping = getattr(getattr(shell, "compile", None), "_filename_map", None) or {}
    names: dict[str, int | tuple[int, int]] = {
        str(k): int(v) for k, v in mapping.items() if isinstance(v, int)
    }
    # The running cell's count: that of the cell code calling the magic (IPython counts up before a
    # cell runs, so shell.execution_count is already the next one), else the shell's.
    frame = sys._getframe(1)
    count = None
    while frame is not None and count is None:
        count = mapping.get(frame.f_code.co_filename)
        frame = frame.f_back
    names[own_filename] = (int(count if isinstance(count, int) else shell.execution_count), 1)
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
    rng = Enum(RNG_CHOICES, default_value="device", help="Where random numbers are drawn.").tag(
        config=True
    )
    record_dir = Unicode(
        "",
        help="If set, every %%neuron cell saves its runs to DIR/cell-<execution count>.nwrun.zip.",
    ).tag(config=True)
    strict = Bool(False, help="Fail every cell whose target fell back to CPU.").tag(config=True)
    widget = Bool(
        False,
        help="Show every report as the interactive widget (tabs, Plotly charts), also where the "
        "neuron-workbench-lab extension would draw its native view (JupyterLab). Without it each "
        "front end picks its richest view: the extension's in JupyterLab, the widget elsewhere.",
    ).tag(config=True)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self._resident = ResidentObjects()
        self._start_dir = os.getcwd()
        # (target, cell source) pairs whose migration findings a report showed already.
        self._scanned: set[tuple[str, str]] = set()

    @magic_arguments()
    @argument(
        "--ref", metavar="BACKEND", help="reference backend (default: cuda if usable, else cpu)"
    )
    @argument("--target", metavar="BACKEND", help="target backend (default: neuron)")
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
    @argument("-o", "--output", metavar="NAME", help="store the Report object in this variable")
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
            options = CompareOptions(
                ref=args.ref or self.ref or default_reference(),
                target=args.target or self.target,
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
                repeat=max(args.steps or 1, args.repeat or 1),
                rng=args.rng or self.rng,
                what_if=args.what_if,
                ref_precision=args.ref_precision or "cuda",
            )
            options.validate()
            shell = self.shell
            program = compile_cell(shell.transform_cell(cell), transform_ast=shell.transform_ast)
            reference, warning = _recorded_reference(args.against, cell)
            if reference is not None:
                options = dataclasses.replace(options, ref=reference.backend.name, keep="target")
            instruments = {}
            if args.profile:
                from neuron_workbench.trace.profile import op_profiler

                instruments["profile"] = op_profiler
            result = compare_cell(
                program,
                shell.user_ns,
                options,
                hidden=frozenset(shell.user_ns_hidden),
                resident=self._resident,
                capture=_capture,
                instruments=instruments,
                reference=reference,
            )
            report = result.report
            # Sites read `cell [7], line 3` and `models.py:16` in every view and artifact.
            cells = cell_filenames(shell, program.filename)
            for run in (report.ref, report.target):
                relabel_run_sites(run, cells, site_folders(self._start_dir))
            if warning:
                report.warnings.append(warning)
            # The running cell's number, as its sites read it (not shell.execution_count, which
            # IPython has already moved to the next cell).
            count = cells[program.filename][0]
            record_to = args.record or (
                str(Path(self.record_dir) / f"cell-{count}.nwrun.zip") if self.record_dir else None
            )
            if record_to:
                from neuron_workbench import artifacts

                runs = (
                    {"target": report.target}
                    if reference is not None
                    else {"ref": report.ref, "target": report.target}
                )
                artifacts.save(record_to, runs=runs, cell_source=cell, report=report.to_dict())
        except WorkbenchUsageError as exc:
            raise UsageError(str(exc)) from None
        if not args.no_scan:
            report.migration = _migration_findings(cell, options.target)
            if report.migration and report.migration.get("findings"):
                # A rerun of the same cell folds the findings it showed the first time.
                scanned = (options.target, cell)
                report.migration["repeat"] = scanned in self._scanned
                self._scanned.add(scanned)
        kept = result.captured.get(options.keep)
        if kept is not None:
            kept.show()  # what the cell printed, once (the kept run's copy)
        if args.output:
            self.shell.user_ns[args.output] = report
        # One display per cell; each front end picks its richest view (views.report_bundle).
        from neuron_workbench.views import report_bundle

        data, metadata = report_bundle(
            report, widget="force" if args.widget or self.widget else "auto"
        )
        display(data, metadata=metadata, raw=True)
        if args.strict or self.strict:
            from neuron_workbench.trace.fallback import strict_message, strict_violations

            allowed = [op.strip() for op in args.allow_fallback.split(",") if op.strip()]
            violations = strict_violations(report.target.fallbacks, allowed)
            if violations:
                raise UsageError(strict_message(violations, report.target.backend.name))
        return result.last_value

    @line_magic
    def neuron_backends(self, line: str = "") -> BackendStatusTable:
        """List the backends (cpu, cuda, neuron, tpu), whether each can run here, and why not."""
        if line.strip():
            raise UsageError("%neuron_backends takes no arguments")
        return BackendStatusTable()
