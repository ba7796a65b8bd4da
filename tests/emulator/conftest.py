"""These tests emulate `neuron` in the pytest process (one PrivateUse1 backend per process, installed
by the root conftest's ``emulated_neuron`` for tests marked ``inprocess_device``, as every test here
is); tpu runs in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _neuron_emulated(emulated_neuron):
    from neuron_workbench.emulator import configure

    configure(cpu_fallback=True, bf16_matmul=False, capacity_bytes=None, narrow_64bit=True)
    yield


def run_python(code: str, *, env: dict | None = None, timeout: int = 120, args: list | None = None):
    """Run code in a fresh interpreter with the workbench on the path."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT / "workbench") + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.pop("NEURON_WORKBENCH_EMULATE", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *(args or [])],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=str(ROOT),
    )


@pytest.fixture(scope="session")
def run_py():
    """The :func:`run_python` helper, as a fixture (tests here are not a package)."""
    return run_python
