"""``neuron-workbench emulate -- python script.py ARGS``: run a program on the emulated device.

The program runs unmodified in a child process with the emulated ``neuron`` (or ``tpu``) installed
before its first line. At exit a fallback summary is printed on stderr, one line per op (name, count,
first user site), and the command exits with the program's exit code. ``--json FILE`` also writes
``{"device", "profile", "provenance", "emulated": true, "fallbacks": [{"op", "count", "sites":
[{"file", "line", "module"}], ...}], "exit_code"}``.

``python`` (any ``python*``) is replaced by this interpreter, which has torch and the workbench. Any
other command runs as given with ``NEURON_WORKBENCH_EMULATE`` set, which needs the package
installed (the ``torch.backends`` autoload entry point).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from neuron_workbench.emulator.profiles import DEVICES
from neuron_workbench.errors import WorkbenchUsageError

NAME = "emulate"
HELP = "Run an unmodified script on the emulated neuron/tpu device and summarise CPU fallbacks."

_PKG_ROOT = str(Path(__file__).resolve().parents[3])  # the directory holding neuron_workbench/
_PY_OPTS_WITH_VALUE = {"-W", "-X"}


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``emulate`` options to its subparser."""
    parser.add_argument("--device", choices=DEVICES, default="neuron",
                        help="emulated device (default: neuron)")  # fmt: skip
    parser.add_argument("--json", metavar="FILE", dest="json_path",
                        help="also write the fallback report as JSON to FILE")  # fmt: skip
    parser.add_argument(
        "--cpu-fallback",
        choices=("on", "off"),
        default=None,
        help="run unsupported ops on CPU (default: on for neuron, off for tpu, as the real ones)",
    )
    parser.add_argument("--coverage", metavar="FILE",
                        help="coverage file to use instead of the packaged profile")  # fmt: skip
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- python script.py [ARGS...]")  # fmt: skip


def _child_command(cmd: list[str], device: str) -> list[str]:
    if not os.path.basename(cmd[0]).startswith("python"):
        return cmd
    opts: list[str] = []
    i = 1
    while i < len(cmd) and cmd[i].startswith("-") and cmd[i] not in ("-m", "-c", "-"):
        opts.append(cmd[i])
        if cmd[i] in _PY_OPTS_WITH_VALUE and i + 1 < len(cmd):
            opts.append(cmd[i + 1])
            i += 1
        i += 1
    rest = cmd[i:]
    if not rest or rest[0] == "-":
        raise WorkbenchUsageError("emulate: give a script, -m MODULE or -c CODE after python")
    if rest[0] in ("-m", "-c") and len(rest) < 2:
        raise WorkbenchUsageError(f"emulate: {rest[0]} needs an argument")
    if rest[0] not in ("-m", "-c") and not os.path.exists(rest[0]):
        # checked here: the child's runpy would print a traceback through the workbench's runner,
        # and the summary after it would say the program ran with no fallback
        raise WorkbenchUsageError(f"emulate: no such script: {rest[0]}")
    return [sys.executable, *opts, "-m", "neuron_workbench.emulator.runner", device, *rest]


def _summary(report: dict, device: str) -> list[str]:
    label = (
        f"emulated {report.get('device') or device} (profile {report.get('profile')}; "
        "timings are host CPU time)"
    )
    fallbacks = report.get("fallbacks") or []
    if not fallbacks:
        return [f"neuron-workbench emulate: {label}: no op fell back to CPU"]
    lines = [f"neuron-workbench emulate: {label}: {len(fallbacks)} op(s) ran on CPU (fallback):"]
    for line in report.get("summary") or []:
        lines.append(f"  {line}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Run the program; return its exit code."""
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise WorkbenchUsageError("emulate: no command given; usage: emulate -- python script.py")
    if args.json_path == "-":  # the program's own output is this command's standard output
        raise WorkbenchUsageError(
            "emulate: --json - would mix the report into the program's output; give a file"
        )
    if args.coverage and not os.path.isfile(args.coverage):
        raise WorkbenchUsageError(f"emulate: coverage file not found: {args.coverage}")
    child = _child_command(cmd, args.device)
    fd, report_path = tempfile.mkstemp(prefix="nwb-emulate-", suffix=".json")
    os.close(fd)
    os.unlink(report_path)  # the child creates it; absence means it never got going
    env = dict(os.environ)
    env["NEURON_WORKBENCH_EMULATE"] = args.device
    env["NEURON_WORKBENCH_EMULATE_REPORT"] = report_path
    env["PYTHONPATH"] = _PKG_ROOT + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    if args.cpu_fallback:
        env["NEURON_WORKBENCH_EMULATE_CPU_FALLBACK"] = "1" if args.cpu_fallback == "on" else "0"
    if args.coverage:
        env["NEURON_WORKBENCH_EMULATE_COVERAGE"] = os.path.abspath(args.coverage)
    try:
        code = subprocess.call(child, env=env)
    except FileNotFoundError as exc:
        raise WorkbenchUsageError(f"emulate: cannot run {cmd[0]!r}: {exc.strerror}") from exc
    try:
        with open(report_path, encoding="utf-8") as fh:
            report = json.load(fh)
    except (OSError, ValueError):
        report = None
    finally:
        if os.path.exists(report_path):
            os.unlink(report_path)
    if report is None:
        sys.stderr.write(
            "neuron-workbench emulate: no fallback report (the program did not start on the "
            "emulated device; for non-python commands the package must be installed)\n"
        )
        return code
    sys.stderr.write("\n".join(_summary(report, args.device)) + "\n")
    if args.json_path:
        out = dict(report)
        out.pop("summary", None)
        out["exit_code"] = code
        out["command"] = cmd
        from neuron_workbench.cli.notebook_runner import write_text

        # an unwritable path is a one-line usage error (exit 2), as for run --json
        write_text(args.json_path, json.dumps(out, indent=2) + "\n")
    return code
