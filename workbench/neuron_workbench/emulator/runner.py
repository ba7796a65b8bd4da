"""Run a Python program on the emulated device and write its fallback report at exit.

``python -m neuron_workbench.emulator.runner DEVICE (SCRIPT | -m MODULE | -c CODE) [ARGS...]``
installs the emulator, runs the program as ``__main__`` (unmodified, with its own ``sys.argv``) and
keeps its exit code. When ``NEURON_WORKBENCH_EMULATE_REPORT`` names a file, the report is written
there at exit; the ``neuron-workbench emulate`` command reads it and prints the summary.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
from typing import Any, NoReturn

_written = False


def report_dict() -> dict[str, Any]:
    """The fallback report of this process (the ``emulate --json`` format)."""
    from neuron_workbench.emulator import status
    from neuron_workbench.emulator.events import process_log

    st = status()
    log = process_log()
    return {
        "device": st.device if st else None,
        "profile": st.profile if st else None,
        "provenance": st.provenance if st else None,
        "emulated": True,
        "cpu_fallback": st.cpu_fallback if st else None,
        "numerics": st.numerics if st else {},
        "timings": "host CPU time",
        "fallbacks": log.to_list(),
        "summary": log.summary_lines(),
    }


def _write(path: str) -> None:
    global _written
    if _written:
        return
    _written = True
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(report_dict(), fh, indent=2, default=str)
    except OSError as exc:
        sys.stderr.write(f"neuron-workbench: could not write the fallback report {path}: {exc}\n")


def write_report_at_exit(path: str) -> None:
    """Write the report to ``path`` when the interpreter exits, ``os._exit`` included.

    ``os._exit`` skips ``atexit``: a program ending with it (to skip a hanging worker shutdown) was
    told it "did not start on the emulated device" and its fallbacks went unreported. A forked child
    (a DataLoader worker) exits without writing: the report is this process's.
    """
    atexit.register(_write, path)
    real_exit = os._exit
    owner = os.getpid()

    def exit_after_report(status: int) -> NoReturn:
        try:
            if os.getpid() == owner:
                _write(path)
        finally:  # whatever the report's writing raised, the process ends as asked
            real_exit(status)

    os._exit = exit_after_report


def options_from_env() -> dict[str, Any]:
    """``emulate()`` options passed by the ``emulate`` command through the environment."""
    opts: dict[str, Any] = {}
    fb = os.environ.get("NEURON_WORKBENCH_EMULATE_CPU_FALLBACK")
    if fb:
        opts["cpu_fallback"] = fb.strip().lower() in ("1", "true", "yes", "on")
    cov = os.environ.get("NEURON_WORKBENCH_EMULATE_COVERAGE")
    if cov:
        opts["coverage"] = cov
    return opts


def _raised_by_runpy(exc: BaseException) -> bool:
    """True when ``exc`` was raised by runpy's module lookup, not by the module's own code."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    filename = tb.tb_frame.f_code.co_filename
    return filename == "<frozen runpy>" or filename == getattr(runpy, "__file__", None)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the program's exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2:
        sys.stderr.write(
            "usage: python -m neuron_workbench.emulator.runner DEVICE "
            "(SCRIPT | -m MODULE | -c CODE) [ARGS...]\n"
        )
        return 2
    device, rest = argv[0], argv[1:]
    from neuron_workbench.emulator import emulate

    emulate(device, **options_from_env())
    report = os.environ.get("NEURON_WORKBENCH_EMULATE_REPORT")
    if report:
        write_report_at_exit(report)
    code = 0
    try:
        if rest[0] == "-m":
            sys.argv = [rest[1], *rest[2:]]
            try:
                runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
            except ImportError as exc:
                if not _raised_by_runpy(exc):
                    raise  # the module's own import failed: its traceback, as python shows it
                # the module was not found (or is a package without __main__): python's one line
                sys.stderr.write(f"{sys.executable}: {exc}\n")
                code = 1
        elif rest[0] == "-c":
            sys.argv = ["-c", *rest[2:]]
            exec(compile(rest[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = list(rest)
            sys.path.insert(0, os.path.dirname(os.path.abspath(rest[0])))
            runpy.run_path(rest[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            sys.stderr.write(f"{exc.code}\n")
            code = 1
    return code


if __name__ == "__main__":
    raise SystemExit(main())
