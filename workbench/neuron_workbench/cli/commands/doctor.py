"""``neuron-workbench doctor``: what is real on this host, on one screen.

For each backend: whether it runs here and as what (``real``, ``fake`` for a test stand-in of an
SDK, ``emulated`` on the host CPU, or ``unavailable`` with the reason), the SDK's installed
version, devices (for ``neuron``: logical NeuronCores), and whether synchronize, memory statistics,
seeding and CPU-fallback tracking are available and through which call. Nothing is installed or
started: an emulated backend is reported as it would run, without installing the emulator.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import Any

NAME = "doctor"
HELP = "Show what is real on this host: SDK versions, devices, cores, fallback tracking."


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the subcommand's options."""
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def _sdk_installed(backend: Any) -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version(backend.sdk_distribution)
    except (PackageNotFoundError, ValueError):
        return ""


def _accelerator_row(backend: Any) -> dict[str, Any]:
    avail = backend.availability()
    loaded = backend.sdk_module in sys.modules
    row: dict[str, Any] = {
        "name": backend.name,
        "available": bool(avail),
        "kind": backend.kind() if avail else "unavailable",
        "reason": avail.reason,
        "sdk": {
            "module": backend.sdk_module,
            "installed": _sdk_installed(backend),
            "loaded": loaded,
        },
    }
    if avail:
        caps = backend.capabilities()
        row["devices"] = caps.pop("devices")
        row["capabilities"] = caps
        if row["kind"] == "fake":
            row["fake"] = backend.fake_description()
        if row["kind"] != "emulated":
            row["device_name"] = backend.real_device_name()
    return row


def _cuda_row() -> dict[str, Any]:
    import torch

    from neuron_workbench.backends import get_backend

    avail = get_backend("cuda").availability()
    row: dict[str, Any] = {
        "name": "cuda",
        "available": bool(avail),
        "kind": "real" if avail else "unavailable",
        "reason": avail.reason,
        "cuda_build": torch.version.cuda,
    }
    if avail:
        row["devices"] = str(torch.cuda.device_count())
        row["device_name"] = torch.cuda.get_device_name(0)
    return row


def doctor_data() -> dict[str, Any]:
    """Everything ``doctor`` reports, as JSON-ready data."""
    import torch

    from neuron_workbench import emulator
    from neuron_workbench.backends import get_backend
    from neuron_workbench.emulator import native
    from neuron_workbench.emulator.profiles import DEVICES
    from neuron_workbench.version import __version__

    status = emulator.status()
    rows = [{"name": "cpu", "available": True, "kind": "real", "reason": ""}, _cuda_row()]
    rows += [_accelerator_row(get_backend(name)) for name in DEVICES]
    return {
        "workbench": __version__,
        "host": {
            "system": f"{platform.system()} {platform.machine()}",
            "python": platform.python_version(),
            "cpu_cores": os.cpu_count(),
        },
        "torch": {
            "version": torch.__version__,
            "privateuse1": torch._C._get_privateuse1_backend_name(),
            "autoload": os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") != "0",
        },
        "emulator_installed": status.device if status is not None else None,
        "emulator_core": native.describe(),
        "backends": rows,
    }


def format_text(data: dict[str, Any]) -> str:
    """The one-screen text form of :func:`doctor_data`."""
    host, tv = data["host"], data["torch"]
    lines = [
        f"neuron-workbench {data['workbench']} doctor",
        f"host     {host['system']}, Python {host['python']}, {host['cpu_cores']} CPU cores",
        f"torch    {tv['version']}; PrivateUse1 is '{tv['privateuse1']}'; backend autoload "
        + ("on" if tv["autoload"] else "off (TORCH_DEVICE_BACKEND_AUTOLOAD=0)"),
        f"emulator {data['emulator_core']}",
    ]
    for row in data["backends"]:
        name = row["name"]
        if not row["available"]:
            head = f"{name:<8} unavailable: {row['reason']}"
        elif name == "cpu":
            head = f"{name:<8} real (host CPU; the reference when there is no GPU)"
        elif name == "cuda":
            head = f"{name:<8} real: {row['devices']} x {row['device_name']}"
        else:
            unit = "logical NeuronCores" if name == "neuron" else "devices"
            kind = row["kind"]
            if kind == "emulated":
                head = f"{name:<8} emulated on the host CPU (timings are host CPU time)"
            else:
                head = f"{name:<8} {kind}: {row['device_name']}; {unit}: {row['devices']}"
        lines.append(head)
        sdk = row.get("sdk")
        if sdk is not None:
            if sdk["installed"]:
                loaded = "loaded" if sdk["loaded"] else "installed, not loaded"
                lines.append(f"{'':<9}sdk {sdk['module']} {sdk['installed']} ({loaded})")
            else:
                lines.append(f"{'':<9}sdk {sdk['module']}: not installed")
        if row.get("fake"):
            lines.append(f"{'':<9}FAKE: {row['fake']}")
        for key, how in (row.get("capabilities") or {}).items():
            lines.append(f"{'':<9}{key}: {how}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the report; exit 0."""
    data = doctor_data()
    if args.json:
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_text(data) + "\n")
    return 0
