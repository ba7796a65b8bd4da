"""``neuron-workbench coverage``: native op coverage of the neuron/tpu profiles.

- ``coverage show [--device neuron|tpu] [--coverage FILE] [--op NAME]``: the profile's name,
  provenance and op count; with ``--op``, whether that ATen op runs natively (exit 0) or falls back
  to CPU / raises on tpu (exit 1); a name no ATen op has is a usage error (exit 2).
- ``coverage export [-o FILE]``: on a machine where the real backend (torch-neuronx or torch-tpu) is
  loaded, write its PrivateUse1 registrations as a coverage file for ``emulate(coverage=FILE)``.
  Elsewhere it exits 2: the emulator's own kernels are not the real backend's coverage.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from importlib import metadata

from neuron_workbench.emulator.profiles import DEVICES
from neuron_workbench.errors import WorkbenchUsageError

NAME = "coverage"
HELP = "Show the emulated devices' native op coverage, or export a real backend's coverage."


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``coverage`` subcommands."""
    sub = parser.add_subparsers(dest="coverage_command", metavar="ACTION")
    sub.required = True
    show = sub.add_parser(
        "show", help="profile name, provenance, count; or whether an op is native"
    )
    show.add_argument("--device", choices=DEVICES, default="neuron")
    show.add_argument(
        "--coverage", metavar="FILE", help="a coverage file instead of the packaged one"
    )
    show.add_argument("--op", metavar="NAME", help="ATen op, e.g. sort, aten::add.Tensor, add_")
    export = sub.add_parser("export", help="write the real backend's coverage (needs the hardware)")
    export.add_argument("-o", "--output", metavar="FILE", help="output file (default: stdout)")


def _base(name: str) -> str:
    name = name.strip()
    if "::" in name:
        ns, name = name.split("::", 1)
        if ns != "aten":
            raise WorkbenchUsageError(f"coverage: only aten ops are listed, not {ns}::{name}")
    return name.split(".", 1)[0]


def _is_aten_op(base: str) -> bool:
    """Whether this torch has an ATen op of that base name (any overload)."""
    import torch

    try:
        getattr(torch.ops.aten, base)
    except (AttributeError, RuntimeError):
        return False
    return True


def _structured_inplace(base: str) -> bool:
    # x_ runs through a registered x.out kernel when PyTorch generates a structured wrapper for it.
    import torch

    key = torch._C.DispatchKey.CompositeExplicitAutogradNonFunctional
    try:
        packet = getattr(torch.ops.aten, base)
    except (AttributeError, RuntimeError):
        return False
    return any(getattr(packet, ov).has_kernel_for_dispatch_key(key) for ov in packet.overloads())


def _show(args: argparse.Namespace) -> int:
    from neuron_workbench.emulator.profiles import load_profile

    try:
        profile = load_profile(args.device, args.coverage)
    except OSError as exc:
        raise WorkbenchUsageError(f"coverage: cannot read {args.coverage}: {exc}") from exc
    if not args.op:
        print(f"profile:    {profile.name} ({args.device})")
        print(f"provenance: {profile.provenance}")
        print(f"native ops: {len(profile.native_ops)}")
        print(f"file:       {profile.path}")
        fb = "run on CPU (fallback)" if profile.fallback_default else "raise (CPU fallback off)"
        print(f"other ops:  {fb} by default")
        return 0
    base = _base(args.op)
    if base in profile.native_ops:
        print(f"aten::{base}: native on {args.device} (profile {profile.name})")
        return 0
    if base.endswith("_") and base[:-1] in profile.native_ops and _structured_inplace(base):
        print(
            f"aten::{base}: native on {args.device} through aten::{base[:-1]}.out "
            f"(structured family rule; profile {profile.name})"
        )
        return 0
    if not _is_aten_op(base):
        # a typo (`softmx`) read as an op that falls back to CPU: exit 1, and a wrong answer
        import torch

        raise WorkbenchUsageError(
            f"coverage: no ATen op named {base!r} in torch {torch.__version__}"
        )
    what = "runs on CPU (fallback)" if profile.fallback_default else "raises unless CPU fallback"
    print(
        f"aten::{base}: not native on {args.device} (profile {profile.name}): {what}, unless a "
        "composite kernel decomposes it into native ops first"
    )
    return 1


def _export(args: argparse.Namespace) -> int:
    import torch

    from neuron_workbench.emulator import status

    backend = torch._C._get_privateuse1_backend_name()
    if status() is not None:
        raise WorkbenchUsageError(
            "coverage export: this process runs the emulated device; export needs the real backend"
        )
    if backend not in DEVICES:
        raise WorkbenchUsageError(
            "coverage export: no real neuron or tpu backend is loaded in this Python (PrivateUse1 "
            f"is {backend!r}); run it on a Trainium host with torch-neuronx or a TPU host with "
            "torch-tpu"
        )
    names = torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1")
    base_ops = sorted(
        {n.split("::", 1)[1].split(".", 1)[0] for n in names if n.startswith("aten::")}
    )
    dist = "torch-neuronx" if backend == "neuron" else "torch-tpu"
    try:
        dist_version = metadata.version(dist)
    except metadata.PackageNotFoundError:
        dist_version = "unknown"
    today = datetime.date.today().isoformat()
    header = [
        f"# {dist} natively registered ATen base ops (device {backend}), exported {today}.",
        f"# Provenance: torch._C._dispatch_get_registrations_for_dispatch_key('PrivateUse1') on "
        f"{platform.node() or 'host'}, torch {torch.__version__}, {dist} {dist_version}.",
        f"# Count: {len(base_ops)} base op names (from {len(names)} registrations).",
        "# Written by neuron-workbench coverage export. Format: one ATen base op name per line.",
    ]
    text = "\n".join(header + base_ops) + "\n"
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
        sys.stderr.write(f"wrote {len(base_ops)} ops to {args.output}\n")
    else:
        sys.stdout.write(text)
    return 0


def run(args: argparse.Namespace) -> int:
    """Dispatch to ``show`` or ``export``."""
    if args.coverage_command == "export":
        return _export(args)
    return _show(args)
