"""``neuron-workbench show ARTIFACT``: what a run artifact holds, without running anything."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

NAME = "show"
HELP = "Summarize a run artifact: runs, backends (emulated or real), outputs, fallbacks, versions."


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the subcommand's options."""
    parser.add_argument("artifact", help="the artifact file (*.nwrun.zip)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def scalar_counts(run: Any) -> tuple[int, int]:
    """``(values, call sites)`` of the scalars a run recorded (a script's loss curve).

    A training script's run often has no outputs at all: its scalars are what is compared, so the
    record line and the summary count them rather than show an empty run.
    """
    from neuron_workbench.compare.scalars import recorded_trace

    trace = recorded_trace(run.extras.get("scalars"))
    return (0, 0) if trace is None else (trace.total, len(trace.series))


def scalars_phrase(values: int, sites: int) -> str:
    """``6 scalars at 4 call sites``, or ``""`` for a run that recorded none."""
    if not values:
        return ""
    return (
        f"{values} scalar{'s' if values != 1 else ''} at {sites} call "
        f"site{'s' if sites != 1 else ''}"
    )


def summarize(artifact: Any) -> dict[str, Any]:
    """JSON-ready summary of a loaded artifact."""
    runs = {}
    for role, run_data in artifact.manifest["runs"].items():
        run = artifact.runs[role]
        leaves = run_data["outputs"]
        runs[role] = {
            "backend": run.backend.name,
            "emulated": run.backend.emulated,
            "device": run.backend.device,
            "device_name": run.backend.device_name,
            "ok": run.ok,
            "error": run.error.summary if run.error is not None else None,
            "outputs": len(leaves),
            "tensors": sum(1 for leaf in leaves if leaf["kind"] == "tensor"),
            "tensor_bytes": sum(leaf["nbytes"] for leaf in leaves if leaf["kind"] == "tensor"),
            "skipped_outputs": len(run_data.get("skipped_outputs", [])),
            "scalars": scalar_counts(run)[0],
            "scalar_sites": scalar_counts(run)[1],
            "fallback_ops": run.fallback_ops(),
            "wall_time_s": run.wall_time_s,
            "extras": sorted(run.extras),
        }
        script = run.extras.get("script")
        if isinstance(script, dict) and isinstance(script.get("argv"), list):
            runs[role]["argv"] = [str(arg) for arg in script["argv"]]  # the command line it ran
    report = artifact.report
    return {
        "path": str(artifact.path),
        "format_version": artifact.manifest["format_version"],
        "workbench_version": artifact.manifest.get("workbench_version", ""),
        "created": artifact.created,
        "environment": artifact.environment,
        "cell": {
            "sha256": artifact.cell_sha256,
            "lines": len(artifact.cell_source.splitlines()),
        },
        "runs": runs,
        "report": None
        if report is None
        else {"verdict": report.get("verdict"), "summary": report.get("summary")},
    }


def _text(summary: dict[str, Any]) -> list[str]:
    env = summary["environment"]
    lines = [
        f"artifact {summary['path']}",
        f"  format {summary['format_version']}, neuron-workbench "
        f"{summary['workbench_version']}, created {summary['created']}",
        f"  recorded with torch {env.get('torch', '?')}, python {env.get('python', '?')} "
        f"on {env.get('platform', '?')}",
        f"  cell sha256 {summary['cell']['sha256'][:16]}, {summary['cell']['lines']} lines",
    ]
    for role, run in summary["runs"].items():
        kind = "emulated" if run["emulated"] else "real"
        status = "ran" if run["ok"] else f"raised {run['error']}"
        lines.append(
            f"  run {role}: {run['backend']} ({kind}) on {run['device']} [{run['device_name']}], "
            f"{status}; {run['outputs']} outputs ({run['tensors']} tensors, "
            f"{run['tensor_bytes']} bytes)"
        )
        if run["scalars"]:  # a training script's loss curve (often its only compared values)
            lines.append(f"    observed {scalars_phrase(run['scalars'], run['scalar_sites'])}")
        if run.get("argv"):
            lines.append(f"    ran: python {shlex.join(run['argv'])}")
        if run["fallback_ops"]:
            lines.append(f"    fell back to CPU: {', '.join(run['fallback_ops'])}")
        if run["skipped_outputs"]:
            lines.append(f"    {run['skipped_outputs']} outputs could not be stored")
    if summary["report"]:
        lines.append(f"  report: {summary['report']['summary']}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Load (validating) and print the summary; exit 0, or 2 for a bad artifact."""
    from neuron_workbench.artifacts import load

    summary = summarize(load(args.artifact))
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        from neuron_workbench.cli.notebook_runner import terminal_safe

        sys.stdout.write(terminal_safe("\n".join(_text(summary))) + "\n")
    return 0
