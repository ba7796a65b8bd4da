"""Run every benchmark in this folder, each in its own process, and print its ratio lines.

Usage: .venv/bin/python benchmarks/run.py [NAME ...]

Every figure is a ratio against a baseline measured in the same run, so machines can be compared.
Benchmarks are separate processes because an emulated device, once installed, stays for the process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    scripts = sorted(
        p for p in HERE.glob("*.py") if p.name != "run.py" and not p.name.startswith("_")
    )
    if argv:
        scripts = [p for p in scripts if p.stem in argv]
    status = 0
    for script in scripts:
        print(f"== {script.stem}", flush=True)
        done = subprocess.run([sys.executable, str(script)], check=False)
        status = status or done.returncode
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
