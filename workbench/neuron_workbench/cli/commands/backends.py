"""``neuron-workbench backends``: which backends can run here, and why not."""

from __future__ import annotations

import argparse
import json
import sys

NAME = "backends"
HELP = "List the backends (cpu, cuda, neuron, tpu), whether each can run here, and why not."


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the subcommand's options."""
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args: argparse.Namespace) -> int:
    """Print the backend table; exit 0."""
    from neuron_workbench.backends.registry import BackendStatusTable

    table = BackendStatusTable()
    if args.json:
        json.dump(table.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write("\n".join(table.lines()) + "\n")
    return 0
