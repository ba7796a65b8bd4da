"""``python -m neuron_workbench.emulator.native``: build the native core now (set-up scripts)."""

from __future__ import annotations

import sys

from neuron_workbench.emulator import native


def main() -> int:
    """Build (or find) the core; print where it is, or one line saying what is missing."""
    try:
        module = native.build(verbose="-v" in sys.argv[1:])
    except RuntimeError as exc:
        print(f"{exc}; the emulator will use its pure-Python core", file=sys.stderr)
        return 1
    print(f"emulator native core: {module.__file__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
