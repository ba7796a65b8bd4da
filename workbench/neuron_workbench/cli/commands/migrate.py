"""``neuron-workbench migrate PATH... [--write]``: rewrite the mechanically safe CUDA-isms.

Prints a unified diff per file (or ``PATH: no changes``); ``--write`` rewrites the files in place.
Only device strings, ``.cuda()``, ``torch.cuda`` calls with a direct equivalent, ``.is_cuda``, the
autocast device and the GradScaler device are rewritten; everything else stays a ``scan`` finding.
Exit code 0, or with ``--check`` 1 when something would change (for CI).
"""

from __future__ import annotations

import argparse
import sys

from neuron_workbench.scan import TARGETS, iter_source_files, migrate_path, summary_line

NAME = "migrate"
HELP = "Rewrite the mechanically safe CUDA-isms (device strings, .cuda(), torch.cuda.*) for neuron."


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``migrate`` options to its subparser."""
    parser.add_argument(
        "paths", nargs="+", metavar="PATH", help=".py files, notebooks, or directories"
    )
    parser.add_argument("--write", action="store_true", help="rewrite the files in place")
    parser.add_argument(
        "--target",
        choices=TARGETS,
        default="neuron",
        help="device to migrate to (default: neuron)",
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if any file would change (nothing is written)"
    )


def run(args: argparse.Namespace) -> int:
    """Migrate each file, print the diffs, and return the exit code."""
    changed = 0
    rewritten = 0
    remaining = []
    for path in iter_source_files(args.paths):
        migration = migrate_path(path, write=args.write and not args.check, target=args.target)
        remaining += migration.remaining
        if migration.changed:
            changed += 1
            rewritten += len(migration.applied)
            sys.stdout.write(migration.diff)
            if args.write and not args.check:
                sys.stdout.write(f"wrote {path}\n")
        else:
            sys.stdout.write(f"{path}: no changes\n")
    verb = "would change" if args.check or not args.write else "changed"
    sys.stdout.write(
        f"{rewritten} rewritten, {changed} file(s) {verb}; left for you: "
        f"{summary_line(remaining)} (see `neuron-workbench scan`)\n"
    )
    return 1 if args.check and changed else 0
