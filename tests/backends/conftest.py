"""Running code in a fresh interpreter where a FAKE SDK (tests/fakes) or the emulator owns the device.

One PrivateUse1 backend exists per process, and the pytest process emulates ``neuron``, so every run
against a fake, or against the emulated ``tpu``, is a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKES = ROOT / "tests" / "fakes"


def run_on(device: str, kind: str, code: str, *, env: dict | None = None, timeout: int = 240):
    """Run ``code`` where ``device`` is ``kind``: ``fake`` (tests/fakes SDK) or ``emulated``.

    Returns the ``CompletedProcess``; the code's last stdout line is expected to be JSON.
    """
    full_env = dict(os.environ)
    for name in ("NEURON_WORKBENCH_EMULATE", "NEURON_WORKBENCH_TPU_LIST_FALLBACKS",
                 "NEURON_WORKBENCH_TARGET", "TORCH_DEVICE_BACKEND_AUTOLOAD"):  # fmt: skip
        full_env.pop(name, None)
    paths = [str(ROOT / "workbench")]
    if kind == "fake":
        paths[:0] = [str(FAKES / device), str(FAKES / "common")]
    else:
        assert kind == "emulated", kind
        full_env["NEURON_WORKBENCH_EMULATE"] = device
    full_env["PYTHONPATH"] = os.pathsep.join(paths + [full_env.get("PYTHONPATH", "")])
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=str(ROOT),
    )


def last_json(proc: subprocess.CompletedProcess) -> Any:
    """The JSON the subprocess printed last (with its stderr in the failure message)."""
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def run_device_json():
    """Run code as :func:`run_on` does; return ``(its last JSON line, its stderr)``."""

    def run(device: str, kind: str, code: str, **kwargs: Any) -> tuple[Any, str]:
        proc = run_on(device, kind, code, **kwargs)
        return last_json(proc), proc.stderr

    return run
